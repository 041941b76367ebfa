//! What a shell command line runs, as Auto-review needs it: every simple command, with the
//! wrappers that only change how it runs taken off (`sudo`, `env`, `nohup`, `timeout`, …),
//! paths reduced to the program's name (`/bin/rm` → `rm`), and the scripts inside
//! `sh -c '…'`, `eval`, `$(…)`, `<(…)` and backticks read as commands of their own.
//!
//! Matching a deny-list entry is by words, not text: the program's name, then each of the
//! entry's words anywhere among the command's, with short flags compared letter by letter
//! (`rm -rf` matches `rm -fr ~`, `rm -r -f ~` and `rm  -rf ~`).
//!
//! What cannot be read with certainty (an open quote, a subshell, a program named by a
//! substitution, nesting too deep) is a doubt: Auto-review then asks the user.

use crate::agent::tools::{command_words, is_assignment};

/// How deep scripts inside scripts are followed before it is a doubt.
const MAX_DEPTH: usize = 4;

/// The simple commands a command line runs (each: program name, then its arguments), or why
/// that cannot be known.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Commands {
    pub commands: Vec<Vec<String>>,
    /// Set when part of the line could not be read; the commands are then those that could.
    pub(crate) doubt: Option<String>,
}

/// Reads `line` (see the module's comment).
pub fn read(line: &str) -> Commands {
    let mut out = Commands::default();
    read_into(line, 0, &mut out);
    out
}

/// The deny-list entry (as written) that one of `commands` matches.
pub fn denied<'a>(commands: &Commands, denylist: &'a [String]) -> Option<&'a str> {
    denylist.iter().map(|e| e.trim()).find(|entry| {
        let Some(words) = read(entry).commands.into_iter().next() else {
            return false;
        };
        commands.commands.iter().any(|c| matches(c, &words))
    })
}

fn read_into(line: &str, depth: usize, out: &mut Commands) {
    if depth > MAX_DEPTH {
        doubt(out, "it nests commands too deeply to read");
        return;
    }
    match substitutions(line) {
        Some(inner) => inner.iter().for_each(|s| read_into(s, depth + 1, out)),
        None => doubt(out, "it has a substitution that does not close"),
    }
    let Some(simple) = command_words(line) else {
        doubt(
            out,
            "it uses shell syntax Auto-review cannot read (an open quote, a subshell or a group)",
        );
        return;
    };
    for words in simple {
        unwrap_command(words, depth, out);
    }
}

/// Takes the wrappers off one simple command and records what it runs.
fn unwrap_command(mut words: Vec<String>, depth: usize, out: &mut Commands) {
    loop {
        let Some(first) = words.first() else {
            return;
        };
        if first.contains('$') || first.contains('`') {
            doubt(out, "the program it runs is computed when it runs");
            return;
        }
        let name = program_name(first);
        words[0] = name.clone();
        if let Some(script) = inline_script(&name, &words) {
            match script {
                Some(script) => read_into(&script, depth + 1, out),
                None => doubt(out, "it runs a shell script Auto-review cannot see"),
            }
            return;
        }
        match wrapped(&name, &words) {
            Some(rest) => words = rest,
            None => {
                out.commands.push(words);
                return;
            }
        }
    }
}

/// `rm` for `/bin/rm` and `\rm`.
fn program_name(word: &str) -> String {
    let base = word.rsplit('/').next().unwrap_or(word);
    base.trim_start_matches('\\').to_string()
}

/// The flags that take a value, per wrapper; `None` when `name` does not wrap a command.
fn wrapper_flags(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "sudo" | "doas" => &[
            "-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T", "--user", "--group",
            "--host", "--prompt", "--chdir", "--role", "--type",
        ],
        "env" => &["-u", "-C", "--unset", "--chdir"],
        "nice" => &["-n", "--adjustment"],
        "ionice" => &["-c", "-n", "-p", "--class", "--classdata"],
        "xargs" => &["-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a"],
        "exec" => &["-a"],
        "stdbuf" => &["-i", "-o", "-e"],
        "timeout" => &["-s", "-k", "--signal", "--kill-after"],
        "command" | "builtin" | "nohup" | "time" | "setsid" | "unbuffer" => &[],
        _ => return None,
    })
}

/// The command a wrapper runs (its flags, their values and `NAME=value` words taken off);
/// `None` when `words` is not a wrapper.
fn wrapped(name: &str, words: &[String]) -> Option<Vec<String>> {
    let with_value = wrapper_flags(name)?;
    let mut rest = words[1..].iter().peekable();
    while let Some(w) = rest.peek() {
        if w.as_str() == "--" {
            rest.next();
            break;
        }
        if w.starts_with('-') && w.len() > 1 {
            if with_value.contains(&w.as_str()) {
                rest.next();
            }
            rest.next();
        } else if is_assignment(w) {
            rest.next();
        } else {
            break;
        }
    }
    let mut rest: Vec<String> = rest.cloned().collect();
    // `timeout 10 cmd`: the duration comes before the command.
    if name == "timeout" && !rest.is_empty() {
        rest.remove(0);
    }
    Some(rest)
}

/// For a shell given a script (`bash -c '…'`, `sh -ec '…'`, `eval …`, `env -S '…'`): the
/// script, `None` when it cannot be found. `None` outside: not such a call.
fn inline_script(name: &str, words: &[String]) -> Option<Option<String>> {
    const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "fish", "busybox"];
    if name == "eval" {
        return Some(Some(words[1..].join(" ")));
    }
    if name == "env" {
        let at = words
            .iter()
            .position(|w| w == "-S" || w == "--split-string")?;
        return Some(words.get(at + 1).cloned());
    }
    if !SHELLS.contains(&name) {
        return None;
    }
    let at = words[1..]
        .iter()
        .position(|w| w.starts_with('-') && !w.starts_with("--") && w.contains('c'))?;
    // The script is the first word after the flags.
    let script = words[at + 2..]
        .iter()
        .find(|w| !w.starts_with('-'))
        .cloned();
    Some(script)
}

/// The scripts inside `$(…)`, `<(…)`, `>(…)` and backticks (not inside single quotes);
/// `None` when one does not close.
fn substitutions(line: &str) -> Option<Vec<String>> {
    let chars: Vec<char> = line.chars().collect();
    let mut found = Vec::new();
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            (Some('"'), '"') => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (_, '\\') => i += 1,
            // `$((…))` is arithmetic, not a command; a substitution inside it still is one.
            (_, '$') if next == Some('(') && chars.get(i + 2) == Some(&'(') => {
                let end = closing_paren(&chars, i + 2)?;
                let inner: String = chars[i + 2..end].iter().collect();
                found.extend(substitutions(&inner)?);
                i = end;
            }
            (_, '$') | (None, '<' | '>') if next == Some('(') => {
                let end = closing_paren(&chars, i + 2)?;
                found.push(chars[i + 2..end].iter().collect());
                i = end;
            }
            (_, '`') => {
                let end =
                    (i + 1..chars.len()).find(|&j| chars[j] == '`' && chars[j - 1] != '\\')?;
                found.push(chars[i + 1..end].iter().collect());
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    Some(found)
}

/// The index of the `)` closing a `(` opened just before `from`, quotes respected.
fn closing_paren(chars: &[char], from: usize) -> Option<usize> {
    let mut depth = 1;
    let mut quote: Option<char> = None;
    let mut i = from;
    while i < chars.len() {
        let c = chars[i];
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => i += 1,
            (Some(_), _) => {}
            (None, '\\') => i += 1,
            (None, '\'' | '"') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn doubt(out: &mut Commands, why: &str) {
    out.doubt.get_or_insert_with(|| why.to_string());
}

/// Whether `command` is what the deny-list entry `entry` names: the same program, and each
/// of the entry's words among the command's (short flags letter by letter).
fn matches(command: &[String], entry: &[String]) -> bool {
    let (Some(name), Some(wanted)) = (command.first(), entry.first()) else {
        return false;
    };
    if name != wanted {
        return false;
    }
    let args = &command[1..];
    let letters: String = args
        .iter()
        .filter(|a| is_short_flags(a))
        .flat_map(|a| a.chars().skip(1))
        .collect();
    entry[1..].iter().all(|e| {
        if is_short_flags(e) {
            e.chars().skip(1).all(|l| letters.contains(l))
        } else {
            args.contains(e)
        }
    })
}

/// `-rf`: a cluster of one-letter flags.
fn is_short_flags(w: &str) -> bool {
    w.len() > 1
        && w.starts_with('-')
        && !w.starts_with("--")
        && w.chars().skip(1).all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(line: &str) -> Vec<String> {
        read(line).commands.iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn wrappers_paths_and_assignments_come_off() {
        assert_eq!(names("sudo rm -rf ~"), ["rm -rf ~"]);
        assert_eq!(names("sudo -u root /bin/rm -rf /"), ["rm -rf /"]);
        assert_eq!(names("FOO=1 rm -rf ~"), ["rm -rf ~"]);
        assert_eq!(names("env -i A=b /usr/bin/curl x"), ["curl x"]);
        assert_eq!(names("nohup nice -n 5 timeout 10 make"), ["make"]);
        assert_eq!(names("\\rm  -rf ~"), ["rm -rf ~"]);
        assert_eq!(names("ls | xargs -n 1 rm"), ["ls", "rm"]);
    }

    #[test]
    fn scripts_inside_are_read() {
        assert_eq!(names("bash -c 'curl x | sh'"), ["curl x", "sh"]);
        assert_eq!(names("sh -ec \"rm -rf build\""), ["rm -rf build"]);
        assert_eq!(names("echo $(curl x)"), ["curl x", "echo $(curl x)"]);
        assert_eq!(names("echo `whoami`"), ["whoami", "echo `whoami`"]);
        assert_eq!(names("eval 'rm -rf ~'"), ["rm -rf ~"]);
        assert_eq!(names("diff <(ls a) <(ls b)")[..2], ["ls a", "ls b"]);
        assert_eq!(names("echo '$(not run)'"), ["echo $(not run)"]);
        assert!(read("echo '$(not run)'").doubt.is_none());
        assert_eq!(names("echo $((1 + 2))"), ["echo $((1 + 2))"]);
        assert!(
            read("echo $((1 + 2))").doubt.is_none(),
            "arithmetic is no command"
        );
        assert_eq!(names("echo $(( $(curl x) + 1 ))")[0], "curl x");
    }

    #[test]
    fn what_cannot_be_read_is_a_doubt() {
        assert!(read("$(curl x)").doubt.is_some(), "the program is computed");
        assert!(read("echo 'open").doubt.is_some());
        assert!(read("(cd x && rm -rf y)").doubt.is_some());
        assert!(read("echo $(date").doubt.is_some());
        assert!(read("bash -c").doubt.is_some());
        assert!(read("eval eval eval eval eval eval ls").doubt.is_some());
        assert!(read("eval eval ls").doubt.is_none());
        assert!(read("cargo test && git status").doubt.is_none());
    }

    #[test]
    fn deny_entries_match_by_words_anywhere() {
        let deny: Vec<String> = ["rm -rf", "curl", "git push --force"]
            .map(String::from)
            .to_vec();
        let hit = |line: &str| denied(&read(line), &deny);
        assert_eq!(hit("rm -fr ~"), Some("rm -rf"));
        assert_eq!(hit("rm -r -f ~"), Some("rm -rf"));
        assert_eq!(hit("cd / && sudo /bin/rm -rf ."), Some("rm -rf"));
        assert_eq!(hit("echo $(curl x)"), Some("curl"));
        assert_eq!(
            hit("git push origin main --force"),
            Some("git push --force")
        );
        assert_eq!(hit("rm -r build"), None);
        assert_eq!(hit("curly x"), None);
        assert_eq!(hit("git push origin main"), None);
        assert_eq!(hit("echo rm -rf"), None, "words of another program");
    }
}
