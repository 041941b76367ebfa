//! Noticing a model stuck in a loop: the same call with the same arguments, the same call
//! with the same result, or two calls alternating (A-B-A-B), over and over. Without this a
//! stuck model burns every round of `agent.max_tool_rounds`, each resending the whole context.
//!
//! Sans-IO: the turn feeds each finished call (name, arguments, result) in order and gets a
//! verdict back. Polling calls (awaiting a subagent, reading a background shell's output file)
//! repeat by design: they are not counted and do not break a streak.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// The repeat at which the tool result tells the model it repeats itself.
pub const WARN_AT: u32 = 3;
/// The repeat at which the turn ends.
pub const STOP_AT: u32 = 5;

/// What to do after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
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
}

/// Bound on the calls remembered: two periods of the longest pattern checked are enough, a
/// few more keep the streak counts honest.
const KEEP: usize = 2 * STOP_AT as usize + 2;

/// The detector for one turn.
#[derive(Debug)]
pub struct RepeatDetector {
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

    /// Feeds one finished call; `args` is its arguments as JSON text.
    pub fn observe(&mut self, name: &str, args: &str, result: &str) -> Verdict {
        if !self.enabled || self.is_polling(name, args) {
            return Verdict::Go;
        }
        self.recent.push(Seen {
            name: hash(name),
            args: hash(args),
            result: hash(result),
        });
        if self.recent.len() > KEEP {
            self.recent.remove(0);
        }
        let (count, what) = self.longest_streak();
        if count >= STOP_AT {
            return Verdict::Stop(format!(
                "(Stopped: the model made {what} {count} times in a row (`{name}`) and was not getting anywhere. \
                 Send a message to continue, perhaps with a hint on what to try instead.)"
            ));
        }
        if count >= WARN_AT {
            if !self.warned {
                self.warned = true;
                return Verdict::Warn(format!(
                    "\n\n[cursor-byok: you have made {what} {count} times in a row. Repeating it will not \
                     give a different outcome. Change approach: use what you already have, try a different \
                     tool or different arguments, or explain to the user what is blocking you. At {STOP_AT} \
                     repeats the turn ends.]"
                ));
            }
            return Verdict::Go;
        }
        self.warned = false;
        Verdict::Go
    }

    /// The longest repeat streak ending at the last call, and what repeats.
    fn longest_streak(&self) -> (u32, &'static str) {
        let same_args = streak(&self.recent, 1, |a, b| a.name == b.name && a.args == b.args);
        let same_result = streak(&self.recent, 1, |a, b| {
            a.name == b.name && a.result == b.result
        });
        let cycle = streak(&self.recent, 2, |a, b| a.name == b.name && a.args == b.args);
        let mut best = (same_args, "the same call with the same arguments");
        if same_result > best.0 {
            best = (same_result, "the same call with the same result");
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

    fn feed(d: &mut RepeatDetector, calls: &[(&str, &str, &str)]) -> Vec<Verdict> {
        calls.iter().map(|(n, a, r)| d.observe(n, a, r)).collect()
    }

    fn kinds(v: &[Verdict]) -> String {
        v.iter()
            .map(|v| match v {
                Verdict::Go => '.',
                Verdict::Warn(_) => 'W',
                Verdict::Stop(_) => 'S',
            })
            .collect()
    }

    #[test]
    fn same_call_and_arguments_warns_at_three_and_stops_at_five() {
        let mut d = RepeatDetector::new(true, None);
        let call = ("read_file", r#"{"path":"a.rs"}"#, "fn main() {}");
        let v = feed(&mut d, &[call; 6]);
        assert_eq!(kinds(&v), "..W.SS");
        let Verdict::Warn(note) = &v[2] else {
            unreachable!()
        };
        assert!(note.contains("3 times") && note.contains("Change approach"));
        let Verdict::Stop(msg) = &v[4] else {
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
                )
            })
            .collect();
        assert_eq!(kinds(&v), "..W.S");
    }

    #[test]
    fn same_result_with_changing_arguments_counts() {
        let mut d = RepeatDetector::new(true, None);
        let v: Vec<_> = (0..5)
            .map(|i| {
                d.observe(
                    "read_file",
                    &format!(r#"{{"path":"x{i}"}}"#),
                    "Error: denied",
                )
            })
            .collect();
        assert_eq!(kinds(&v), "..W.S");
        let Verdict::Stop(msg) = &v[4] else {
            unreachable!()
        };
        assert!(msg.contains("same result"), "{msg}");
    }

    #[test]
    fn two_calls_in_turn_count_per_cycle() {
        let mut d = RepeatDetector::new(true, None);
        let a = ("read_file", r#"{"path":"a"}"#, "A");
        let b = ("grep", r#"{"pattern":"b"}"#, "B");
        let v = feed(&mut d, &[a, b, a, b, a, b, a, b, a, b]);
        // Cycles complete at the 2nd, 4th, 6th… call: the third full cycle ends at call 6.
        assert_eq!(kinds(&v), ".....W...S");
        let Verdict::Stop(msg) = &v[9] else {
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
                )
            })
            .collect();
        assert!(v.iter().all(|v| *v == Verdict::Go));
        // A repeat broken by other work starts over.
        let mut d = RepeatDetector::new(true, None);
        let same = ("read_file", r#"{"path":"a"}"#, "A");
        let other = ("write", r#"{"path":"a"}"#, "ok");
        let v = feed(&mut d, &[same, same, other, same, same, other, same, same]);
        assert!(v.iter().all(|v| *v == Verdict::Go), "{v:?}");
    }

    #[test]
    fn polling_is_exempt() {
        let mut d = RepeatDetector::new(true, Some("/home/u/.cursor/terminals".into()));
        let wait = ("await_subagent", r#"{"id":"s1"}"#, "still running");
        let poll = (
            "read_file",
            r#"{"path":"/home/u/.cursor/terminals/7.txt"}"#,
            "building…",
        );
        let v = feed(&mut d, &[wait; 8]);
        assert!(v.iter().all(|v| *v == Verdict::Go));
        let v = feed(&mut d, &[poll; 8]);
        assert!(v.iter().all(|v| *v == Verdict::Go));
    }

    #[test]
    fn off_means_off() {
        let mut d = RepeatDetector::new(false, None);
        let call = ("read_file", "{}", "x");
        assert!(feed(&mut d, &[call; 10]).iter().all(|v| *v == Verdict::Go));
    }

    #[test]
    fn memory_is_bounded() {
        let mut d = RepeatDetector::new(true, None);
        for i in 0..1000 {
            d.observe("read_file", &i.to_string(), &i.to_string());
        }
        assert!(d.recent.len() <= KEEP);
    }
}
