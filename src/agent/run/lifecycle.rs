//! A run's course as a machine, around the model rounds (`machine.rs`): what the first request
//! asks for, and the steps that carry it out, in order. It takes how each step went and returns
//! the next steps; `turn.rs` performs them. No sockets, no waiting.
//!
//! A model turn opens (its context, history and compaction), runs its rounds, takes the
//! steering carried past its last call, is stored, joins Cursor's transcript and ends. A turn
//! the user canceled is stored as far as it went; one the transport canceled, or that failed,
//! is not. Every other request (a summary, a command the user ran, a subagent to stop or to
//! move) is one step and ends the turn without a model call. Whatever fails, the run first stops
//! what the client still runs for it, then ends with the failure.

use tracing::debug;

use super::action::Begin;
use super::error::RunError;
use super::machine::RoundsEnd;

/// How the step asked for went.
#[derive(Debug)]
pub(super) enum StepResult {
    /// The step was carried out.
    Done,
    /// The model rounds ended (the answer to [`RunStep::RunRounds`]).
    Rounds(RoundsEnd),
    /// The step failed, or the run was canceled while it ran.
    Failed(RunError),
}

/// What the run does next.
#[derive(Debug)]
pub(super) enum RunStep {
    /// Open the turn: its context and blobs, the history rebuilt (and compacted when it would
    /// not fit), its todos, tools and first messages.
    OpenTurn,
    /// Run the turn's model rounds (answered with [`StepResult::Rounds`]).
    RunRounds,
    /// Steering from now on waits for the next turn: this request makes no model call.
    DeferSteering,
    /// Take the steering carried past the turn's last model call, and our late notes, into
    /// the turn's record.
    TakeCarried,
    /// Store the turn and send the new checkpoint.
    StoreTurn,
    /// Store the canceled turn as far as it went (the user canceled it) or not at all (the
    /// transport did); answered with the failure the run ends with.
    StoreCanceled { by_user: bool },
    /// Add the stored turn to Cursor's transcript.
    AppendTranscript,
    /// Compact the whole conversation now and store the summary.
    Summarize,
    /// Run the command the user typed and store it as a shell turn.
    RunShell,
    /// Stop the subagent the request names.
    CancelSubagent,
    /// Tell the client the turn ended.
    SendTurnEnded,
    /// Stop what the client still runs for the run: injected messages, execs.
    CleanUp,
    /// The run is over.
    Finish(Result<(), RunError>),
}

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Opening,
    Rounds,
    Carrying,
    Storing,
    StoringCanceled,
    Transcript,
    /// The one step of a request that makes no model call.
    Single,
    Ending,
    Ended,
}

/// A run's course.
pub(super) struct Lifecycle {
    stage: Stage,
}

impl Lifecycle {
    /// The run's course for its first request, and its first steps.
    pub(super) fn start(begin: &Begin) -> (Lifecycle, Vec<RunStep>) {
        let (stage, steps) = match begin {
            Begin::Turn(_) => (Stage::Opening, vec![RunStep::OpenTurn]),
            Begin::Summarize => (
                Stage::Single,
                vec![RunStep::DeferSteering, RunStep::Summarize],
            ),
            Begin::Shell { .. } => (
                Stage::Single,
                vec![RunStep::DeferSteering, RunStep::RunShell],
            ),
            Begin::CancelSubagent { .. } => (
                Stage::Single,
                vec![RunStep::DeferSteering, RunStep::CancelSubagent],
            ),
            Begin::BackgroundSubagent { call } => {
                debug!(
                    call,
                    "no subagent call runs in the foreground of this run: nothing to move"
                );
                (
                    Stage::Ending,
                    vec![RunStep::DeferSteering, RunStep::SendTurnEnded],
                )
            }
        };
        (Lifecycle { stage }, steps)
    }

    /// Take how the last step went; the next steps, in order.
    pub(super) fn handle(&mut self, event: StepResult) -> Vec<RunStep> {
        match (self.stage, event) {
            (Stage::Ended, _) => Vec::new(),
            (_, StepResult::Failed(e)) => self.fail(e),
            (Stage::Rounds, StepResult::Rounds(end)) => self.after_rounds(end),
            (Stage::Opening, StepResult::Done) => self.next(Stage::Rounds, RunStep::RunRounds),
            (Stage::Carrying, StepResult::Done) => self.next(Stage::Storing, RunStep::StoreTurn),
            (Stage::Storing, StepResult::Done) => {
                self.next(Stage::Transcript, RunStep::AppendTranscript)
            }
            (Stage::Transcript | Stage::Single, StepResult::Done) => {
                self.next(Stage::Ending, RunStep::SendTurnEnded)
            }
            (Stage::Ending, StepResult::Done) => {
                self.stage = Stage::Ended;
                vec![RunStep::Finish(Ok(()))]
            }
            (stage, event) => self.fail(RunError::Internal(format!(
                "the run's course heard {event:?} at stage {stage:?}"
            ))),
        }
    }

    fn after_rounds(&mut self, end: RoundsEnd) -> Vec<RunStep> {
        match end {
            RoundsEnd::Done => self.next(Stage::Carrying, RunStep::TakeCarried),
            RoundsEnd::Canceled { store } => self.next(
                Stage::StoringCanceled,
                RunStep::StoreCanceled { by_user: store },
            ),
            RoundsEnd::Failed { error, ending } => {
                debug!(
                    retriable = ending.retry,
                    "the turn's model rounds failed: {error}"
                );
                self.fail(error)
            }
        }
    }

    fn next(&mut self, stage: Stage, step: RunStep) -> Vec<RunStep> {
        self.stage = stage;
        vec![step]
    }

    fn fail(&mut self, e: RunError) -> Vec<RunStep> {
        self.stage = Stage::Ended;
        vec![RunStep::CleanUp, RunStep::Finish(Err(e))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn() -> Begin {
        Begin::Turn(Box::default())
    }

    /// Feed `events` one by one after the start; every step asked for, in order, by name.
    fn course(begin: Begin, events: Vec<StepResult>) -> Vec<String> {
        let (mut life, mut steps) = Lifecycle::start(&begin);
        for e in events {
            steps.extend(life.handle(e));
        }
        steps.iter().map(|s| format!("{s:?}")).collect()
    }

    fn names(steps: &[&str]) -> Vec<String> {
        steps.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_model_turn_opens_runs_its_rounds_is_stored_and_then_ends() {
        let steps = course(
            turn(),
            vec![
                StepResult::Done,
                StepResult::Rounds(RoundsEnd::Done),
                StepResult::Done,
                StepResult::Done,
                StepResult::Done,
                StepResult::Done,
            ],
        );
        let expected = [
            "OpenTurn",
            "RunRounds",
            "TakeCarried",
            "StoreTurn",
            "AppendTranscript",
            "SendTurnEnded",
            "Finish(Ok(()))",
        ];
        assert_eq!(steps, names(&expected));
    }

    /// The transcript is written only for a stored turn, and the turn ends only after both.
    #[test]
    fn a_turn_that_fails_to_store_ends_with_that_failure_and_no_transcript() {
        let steps = course(
            turn(),
            vec![
                StepResult::Done,
                StepResult::Rounds(RoundsEnd::Done),
                StepResult::Done,
                StepResult::Failed(RunError::ClientGone),
            ],
        );
        let expected = [
            "OpenTurn",
            "RunRounds",
            "TakeCarried",
            "StoreTurn",
            "CleanUp",
            "Finish(Err(ClientGone))",
        ];
        assert_eq!(steps, names(&expected));
    }

    #[test]
    fn a_turn_the_user_canceled_is_stored_and_one_the_transport_canceled_is_not() {
        for by_user in [true, false] {
            let steps = course(
                turn(),
                vec![
                    StepResult::Done,
                    StepResult::Rounds(RoundsEnd::Canceled { store: by_user }),
                    StepResult::Failed(RunError::Canceled),
                ],
            );
            let store = format!("StoreCanceled {{ by_user: {by_user} }}");
            let expected = [
                "OpenTurn",
                "RunRounds",
                &store,
                "CleanUp",
                "Finish(Err(Canceled))",
            ];
            assert_eq!(steps, names(&expected));
        }
    }

    #[test]
    fn failed_rounds_clean_up_and_end_with_their_error() {
        let error = RunError::ClientGone;
        let ending = error.ending(false);
        let steps = course(
            turn(),
            vec![
                StepResult::Done,
                StepResult::Rounds(RoundsEnd::Failed { error, ending }),
            ],
        );
        let expected = [
            "OpenTurn",
            "RunRounds",
            "CleanUp",
            "Finish(Err(ClientGone))",
        ];
        assert_eq!(steps, names(&expected));
    }

    #[test]
    fn a_failure_while_opening_runs_no_model_call() {
        let steps = course(turn(), vec![StepResult::Failed(RunError::ClientGone)]);
        let expected = ["OpenTurn", "CleanUp", "Finish(Err(ClientGone))"];
        assert_eq!(steps, names(&expected));
    }

    #[test]
    fn requests_without_a_model_turn_defer_steering_do_their_step_and_end_the_turn() {
        let shell = Begin::Shell {
            command: "ls".into(),
            exec_id: String::new(),
        };
        let cases = [
            (Begin::Summarize, "Summarize"),
            (shell, "RunShell"),
            (Begin::CancelSubagent { id: "a".into() }, "CancelSubagent"),
        ];
        for (begin, step) in cases {
            let steps = course(begin, vec![StepResult::Done, StepResult::Done]);
            let expected = ["DeferSteering", step, "SendTurnEnded", "Finish(Ok(()))"];
            assert_eq!(steps, names(&expected));
        }
        let moved = Begin::BackgroundSubagent { call: "c".into() };
        let expected = ["DeferSteering", "SendTurnEnded", "Finish(Ok(()))"];
        assert_eq!(course(moved, vec![StepResult::Done]), names(&expected));
    }

    /// A step that fails after a request without a model turn ends the run the same way.
    #[test]
    fn a_summary_that_fails_ends_with_its_failure_and_no_turn_end() {
        let steps = course(
            Begin::Summarize,
            vec![StepResult::Failed(RunError::ClientGone)],
        );
        let expected = [
            "DeferSteering",
            "Summarize",
            "CleanUp",
            "Finish(Err(ClientGone))",
        ];
        assert_eq!(steps, names(&expected));
    }

    #[test]
    fn an_event_out_of_order_ends_the_run_with_an_internal_error() {
        let steps = course(turn(), vec![StepResult::Rounds(RoundsEnd::Done)]);
        assert_eq!(steps[..2], names(&["OpenTurn", "CleanUp"]));
        assert!(steps[2].starts_with("Finish(Err(Internal("), "{steps:?}");
    }

    #[test]
    fn an_ended_run_takes_no_more_steps() {
        let (mut life, _) = Lifecycle::start(&turn());
        assert_eq!(life.handle(StepResult::Failed(RunError::Canceled)).len(), 2);
        assert!(life.handle(StepResult::Done).is_empty());
        assert!(life
            .handle(StepResult::Failed(RunError::ClientGone))
            .is_empty());
        assert!(life.handle(StepResult::Rounds(RoundsEnd::Done)).is_empty());
    }
}
