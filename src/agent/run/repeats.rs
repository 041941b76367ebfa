//! Noticing a model stuck in a loop: the same call with the same arguments, the same call
//! failing with the same error, or two calls alternating (A-B-A-B), over and over. Without this a
//! stuck model burns every round of `agent.max_tool_rounds`, each resending the whole context.
//!
//! Sans-IO: the turn feeds each finished call (name, arguments, result, whether it failed) in
//! order and gets a verdict back. A result alone only marks a repeat when it is an error: honest
//! work often answers alike for different arguments (`mkdir -p a`, `touch b`, `git add -A` all
//! print nothing; empty files read empty; MCP tools answer `{"success":true}`). Polling calls (awaiting a subagent, reading a background shell's output file)
//! repeat by design: they are not counted and do not break a streak.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// The repeat at which the tool result tells the model it repeats itself.
pub(crate) const WARN_AT: u32 = 3;
/// The repeat at which the turn ends.
pub(crate) const STOP_AT: u32 = 5;

/// What to do after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RepeatCheck {
    /// Nothing repeats (or not often enough to matter).
    Go,
    /// Append this note to the call's result: the model repeats itself.
    Warn(String),
    /// End the turn with this message for the user (the conversation can go on).
    Stop(String),
}

/// One finished call, as the detector sees it: hashes only, so no argument or result text
/// (which may hold secrets) is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    name: u64,
    args: u64,
    result: u64,
    failed: bool,
}

/// Bound on the calls remembered: two periods of the longest pattern checked are enough, a
/// few more keep the streak counts honest.
const KEEP: usize = 2 * STOP_AT as usize + 2;

/// The detector for one turn.
#[derive(Debug)]
pub(crate) struct RepeatDetector {
    enabled: bool,
    /// `RequestContextEnv.terminals_folder`: reads under it poll a background shell.
    terminals_folder: Option<String>,
    recent: Vec<Seen>,
    /// Repeats of the current streak already warned about (a streak is warned once).
    warned: bool,
}

impl RepeatDetector {
    pub fn new(enabled: bool, terminals_folder: Option<String>) -> Self {
        RepeatDetector {
            enabled,
            terminals_folder: terminals_folder.filter(|f| !f.is_empty()),
            recent: Vec::new(),
            warned: false,
        }
    }

    /// Feeds one finished call; `args` is its arguments as JSON text, `failed` whether its
    /// result is an error.
    pub(crate) fn observe(
        &mut self,
        name: &str,
        args: &str,
        result: &str,
        failed: bool,
    ) -> RepeatCheck {
        if !self.enabled || self.is_polling(name, args) {
            return RepeatCheck::Go;
        }
        self.recent.push(Seen {
            name: hash(name),
            args: hash(args),
            result: hash(result),
            failed,
        });
        if self.recent.len() > KEEP {
            self.recent.remove(0);
        }
        let (count, what) = self.longest_streak();
        if count >= STOP_AT {
            return RepeatCheck::Stop(format!(
                "(Stopped: the model made {what} {count} times in a row (`{name}`) and was not getting anywhere. \
                 Send a message to continue, perhaps with a hint on what to try instead.)"
            ));
        }
        if count >= WARN_AT {
            if !self.warned {
                self.warned = true;
                return RepeatCheck::Warn(format!(
                    "\n\n[cursor-byok: you have made {what} {count} times in a row. Repeating it will not \
                     give a different outcome. Change approach: use what you already have, try a different \
                     tool or different arguments, or explain to the user what is blocking you. At {STOP_AT} \
                     repeats the turn ends.]"
                ));
            }
            return RepeatCheck::Go;
        }
        self.warned = false;
        RepeatCheck::Go
    }

    /// The longest repeat streak ending at the last call, and what repeats.
    fn longest_streak(&self) -> (u32, &'static str) {
        let same_args = streak(&self.recent, 1, |a, b| a.name == b.name && a.args == b.args);
        // With other arguments, only the same error is a repeat: the same success says
        // nothing (an empty output least of all).
        let same_error = streak(&self.recent, 1, |a, b| {
            a.name == b.name && a.failed && b.failed && a.result == b.result
        });
        let cycle = streak(&self.recent, 2, |a, b| a.name == b.name && a.args == b.args);
        let mut best = (same_args, "the same call with the same arguments");
        if same_error > best.0 {
            best = (same_error, "the same call with the same error");
        }
        // A pair alternating counts once per round of the pair; one call repeated also
        // matches period 2, so only a real alternation (A ≠ B) is named a cycle.
        if cycle > best.0 && self.alternates() {
            best = (cycle, "the same two calls in turn");
        }
        best
    }

    fn alternates(&self) -> bool {
        let n = self.recent.len();
        n >= 2 && {
            let (a, b) = (self.recent[n - 1], self.recent[n - 2]);
            a.name != b.name || a.args != b.args
        }
    }

    fn is_polling(&self, name: &str, args: &str) -> bool {
        let n: String = name
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect();
        if n == "awaitsubagent" || n == "awaittask" || n == "taskoutput" {
            return true;
        }
        // A read of a background shell's output file.
        match &self.terminals_folder {
            Some(folder) => args.contains(folder.as_str()),
            None => false,
        }
    }
}

/// How many times in a row the last `period` calls repeat, counting the first occurrence
/// (A, A, A is 3; A, B, A, B, A, B is 3).
fn streak(recent: &[Seen], period: usize, same: impl Fn(&Seen, &Seen) -> bool) -> u32 {
    let n = recent.len();
    if n < period {
        return 0;
    }
    let mut matched = 0;
    while matched + period < n && same(&recent[n - 1 - matched], &recent[n - 1 - matched - period])
    {
        matched += 1;
    }
    u32::try_from((matched + period) / period).unwrap_or(u32::MAX)
}

fn hash(s: &str) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call as fed: name, arguments, result, failed.
    type FedCall<'a> = (&'a str, &'a str, &'a str, bool);

    fn feed(d: &mut RepeatDetector, calls: &[FedCall]) -> Vec<RepeatCheck> {
        calls
            .iter()
            .map(|(n, a, r, e)| d.observe(n, a, r, *e))
            .collect()
    }

    fn kinds(v: &[RepeatCheck]) -> String {
        v.iter()
            .map(|v| match v {
                RepeatCheck::Go => '.',
                RepeatCheck::Warn(_) => 'W',
                RepeatCheck::Stop(_) => 'S',
            })
            .collect()
    }

    #[test]
    fn same_call_and_arguments_warns_at_three_and_stops_at_five() {
        let mut d = RepeatDetector::new(true, None);
        let call = ("read_file", r#"{"path":"a.rs"}"#, "fn main() {}", false);
        let v = feed(&mut d, &[call; 6]);
        assert_eq!(kinds(&v), "..W.SS");
        let RepeatCheck::Warn(note) = &v[2] else {
            unreachable!()
        };
        assert!(note.contains("3 times") && note.contains("Change approach"));
        let RepeatCheck::Stop(msg) = &v[4] else {
            unreachable!()
        };
        assert!(
            msg.contains("5 times") && msg.contains("read_file"),
            "{msg}"
        );
    }

    #[test]
    fn same_arguments_with_changing_results_still_count() {
        let mut d = RepeatDetector::new(true, None);
        let v: Vec<_> = (0..5)
            .map(|i| {
                d.observe(
                    "run_terminal_cmd",
                    r#"{"command":"date"}"#,
                    &format!("t{i}"),
                    false,
                )
            })
            .collect();
        assert_eq!(kinds(&v), "..W.S");
    }

    #[test]
    fn the_same_error_with_changing_arguments_counts() {
        let mut d = RepeatDetector::new(true, None);
        let v: Vec<_> = (0..5)
            .map(|i| {
                d.observe(
                    "read_file",
                    &format!(r#"{{"path":"x{i}"}}"#),
                    "Error: denied",
                    true,
                )
            })
            .collect();
        assert_eq!(kinds(&v), "..W.S");
        let RepeatCheck::Stop(msg) = &v[4] else {
            unreachable!()
        };
        assert!(msg.contains("same error"), "{msg}");
    }

    #[test]
    fn two_calls_in_turn_count_per_cycle() {
        let mut d = RepeatDetector::new(true, None);
        let a = ("read_file", r#"{"path":"a"}"#, "A", false);
        let b = ("grep", r#"{"pattern":"b"}"#, "B", false);
        let v = feed(&mut d, &[a, b, a, b, a, b, a, b, a, b]);
        // Cycles complete at the 2nd, 4th, 6th… call: the third full cycle ends at call 6.
        assert_eq!(kinds(&v), ".....W...S");
        let RepeatCheck::Stop(msg) = &v[9] else {
            unreachable!()
        };
        assert!(msg.contains("two calls in turn"), "{msg}");
    }

    #[test]
    fn progress_is_not_a_loop() {
        let mut d = RepeatDetector::new(true, None);
        let v: Vec<_> = (0..20)
            .map(|i| {
                d.observe(
                    "read_file",
                    &format!(r#"{{"path":"f{i}"}}"#),
                    &format!("body {i}"),
                    false,
                )
            })
            .collect();
        assert!(v.iter().all(|v| *v == RepeatCheck::Go));
        // A repeat broken by other work starts over.
        let mut d = RepeatDetector::new(true, None);
        let same = ("read_file", r#"{"path":"a"}"#, "A", false);
        let other = ("write", r#"{"path":"a"}"#, "ok", false);
        let v = feed(&mut d, &[same, same, other, same, same, other, same, same]);
        assert!(v.iter().all(|v| *v == RepeatCheck::Go), "{v:?}");
    }

    /// The cases of the loop-detection table in `docs/agent.md`: each sequence, fed call by
    /// call, with its verdicts (`.` go, `W` warned, `S` stopped). Printed with `--nocapture`.
    // Long on purpose: the table's rows read best in one place, as the docs show them.
    #[test]
    fn loop_cases_table() {
        let scaffold: Vec<String> = [
            "mkdir -p src/a",
            "touch src/a/mod.rs",
            "git add -A",
            "mkdir -p src/b",
            "touch src/b/mod.rs",
        ]
        .iter()
        .map(|c| format!(r#"{{"command":"{c}"}}"#))
        .collect();
        let inits: Vec<String> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|p| format!(r#"{{"path":"pkg/{p}/__init__.py"}}"#))
            .collect();
        let labels: Vec<String> = ["bug", "docs", "perf", "ci", "ux"]
            .iter()
            .map(|l| format!(r#"{{"name":"{l}"}}"#))
            .collect();
        let errors: Vec<String> = (0..5).map(|i| format!(r#"{{"path":"x{i}"}}"#)).collect();
        let each = |name: &'static str, args: &[String], result: &'static str, failed: bool| {
            args.iter()
                .map(|a| (name.to_string(), a.clone(), result, failed))
                .collect::<Vec<_>>()
        };
        let same = |name: &'static str, args: &str, result: &'static str, failed: bool| {
            vec![(name.to_string(), args.to_string(), result, failed); 5]
        };
        let cases = [
            (
                "five scaffolding commands, each printing nothing",
                each("run_terminal_cmd", &scaffold, "", false),
                ".....",
            ),
            (
                "five reads of different empty `__init__.py` files",
                each("read_file", &inits, "", false),
                ".....",
            ),
            (
                "five MCP calls answering `{\"success\":true}`, different arguments",
                each(
                    "mcp_github_create_label",
                    &labels,
                    r#"{"success":true}"#,
                    false,
                ),
                ".....",
            ),
            (
                "the identical call and result, five times",
                same("read_file", r#"{"path":"a.rs"}"#, "fn main() {}", false),
                "..W.S",
            ),
            (
                "the identical command printing nothing, five times",
                same("run_terminal_cmd", r#"{"command":"git add -A"}"#, "", false),
                "..W.S",
            ),
            (
                "the same failing call, five times",
                same(
                    "run_terminal_cmd",
                    r#"{"command":"cargo buld"}"#,
                    "Error: no such command",
                    true,
                ),
                "..W.S",
            ),
            (
                "the same error for five different arguments",
                each("read_file", &errors, "Error: permission denied", true),
                "..W.S",
            ),
        ];
        println!("| Calls | Verdicts (call 1..5) | Stopped |\n|---|---|---|");
        for (what, calls, expected) in cases {
            let mut d = RepeatDetector::new(true, None);
            let v: Vec<_> = calls
                .iter()
                .map(|(n, a, r, e)| d.observe(n, a, r, *e))
                .collect();
            let got = kinds(&v);
            let stopped = if got.contains('S') {
                "yes, at call 5"
            } else {
                "no"
            };
            println!("| {what} | `{got}` | {stopped} |");
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn polling_is_exempt() {
        let mut d = RepeatDetector::new(true, Some("/home/u/.cursor/terminals".into()));
        let wait = ("await_subagent", r#"{"id":"s1"}"#, "still running", false);
        let poll = (
            "read_file",
            r#"{"path":"/home/u/.cursor/terminals/7.txt"}"#,
            "building…",
            false,
        );
        let v = feed(&mut d, &[wait; 8]);
        assert!(v.iter().all(|v| *v == RepeatCheck::Go));
        let v = feed(&mut d, &[poll; 8]);
        assert!(v.iter().all(|v| *v == RepeatCheck::Go));
    }

    #[test]
    fn off_means_off() {
        let mut d = RepeatDetector::new(false, None);
        let call = ("read_file", "{}", "x", true);
        assert!(feed(&mut d, &[call; 10])
            .iter()
            .all(|v| *v == RepeatCheck::Go));
    }

    #[test]
    fn memory_is_bounded() {
        let mut d = RepeatDetector::new(true, None);
        for i in 0..1000 {
            d.observe("read_file", &i.to_string(), &i.to_string(), true);
        }
        assert!(d.recent.len() <= KEEP);
    }
}
