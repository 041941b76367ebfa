//! Messages as users read them: no run of spaces inside a sentence. A string literal continued
//! over lines must end each line with `\` (which drops the next line's indentation); without
//! it, the indentation lands in the message as a run of spaces. Two checks: every string
//! literal in `src/` as the compiler reads it, and the doctor lines rendered for the cases a
//! test can reach without the machine's own state.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cursor_byok::setup::doctor::{self, Check};
use cursor_byok::setup::service::Held;

/// Where `text` has two or more spaces between words of a sentence (a letter or `,;.` before,
/// a letter after). Column alignment (after `:`, `]`, `}` or at a line's start) is left alone.
fn runs_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] != ' ' {
                i += 1;
                continue;
            }
            let start = i;
            while i < chars.len() && chars[i] == ' ' {
                i += 1;
            }
            let before = start.checked_sub(1).map(|b| chars[b]);
            let after = chars.get(i).copied();
            let sentence_before = before.is_some_and(|c| c.is_alphabetic() || ",;.".contains(c));
            let sentence_after = after.is_some_and(char::is_alphabetic);
            if i - start >= 2 && sentence_before && sentence_after {
                let from = start.saturating_sub(30);
                let to = (i + 30).min(chars.len());
                found.push(chars[from..to].iter().collect());
            }
        }
    }
    found
}

/// The string literals of Rust source `src`, decoded as the compiler does (escapes, and `\` at
/// a line's end dropping the newline and the next line's leading whitespace), with their lines.
/// Comments and char literals are skipped; raw strings are taken as written.
fn string_literals(src: &str) -> Vec<(usize, String)> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            '\n' => line += 1,
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if b.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == '\n');
                        i += 1;
                    }
                }
                continue;
            }
            '\'' => {
                // A char literal ('x', '\n', '\u{..}'), or a lifetime (left as code).
                if b.get(i + 1) == Some(&'\\') {
                    i += 2;
                    while i < b.len() && b[i] != '\'' {
                        i += 1;
                    }
                } else if b.get(i + 2) == Some(&'\'') {
                    i += 2;
                }
            }
            'r' if is_raw_start(&b, i) => {
                let (text, end) = raw_string(&b, i);
                out.push((line, text.clone()));
                line += text.matches('\n').count();
                i = end;
                continue;
            }
            '"' => {
                let (text, end, lines) = cooked_string(&b, i + 1);
                out.push((line, text));
                line += lines;
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `r"` or `r#…"` at `i`, not inside an identifier.
fn is_raw_start(b: &[char], i: usize) -> bool {
    if i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_') && b[i - 1] != 'b' {
        return false;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&'#') {
        j += 1;
    }
    b.get(j) == Some(&'"')
}

/// The raw string starting at `i` (its `r`) and the index after it.
fn raw_string(b: &[char], i: usize) -> (String, usize) {
    let mut j = i + 1;
    let mut hashes = 0;
    while b[j] == '#' {
        hashes += 1;
        j += 1;
    }
    j += 1; // the opening quote
    let start = j;
    loop {
        if j >= b.len() {
            return (b[start..].iter().collect(), j);
        }
        if b[j] == '"' && (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) {
            return (b[start..j].iter().collect(), j + 1 + hashes);
        }
        j += 1;
    }
}

/// The string whose content starts at `i`, decoded; the index after its closing quote; and
/// how many source lines it spans.
fn cooked_string(b: &[char], mut i: usize) -> (String, usize, usize) {
    let mut text = String::new();
    let mut lines = 0;
    while i < b.len() {
        match b[i] {
            '"' => return (text, i + 1, lines),
            '\\' => {
                let next = b.get(i + 1).copied().unwrap_or(' ');
                i += 2;
                match next {
                    '\n' => {
                        lines += 1;
                        while i < b.len() && b[i].is_whitespace() {
                            lines += usize::from(b[i] == '\n');
                            i += 1;
                        }
                    }
                    'n' => text.push('\n'),
                    't' => text.push('\t'),
                    'u' => {
                        while i < b.len() && b[i] != '}' {
                            i += 1;
                        }
                        i += 1;
                        text.push('x');
                    }
                    'x' => {
                        i += 2;
                        text.push('x');
                    }
                    other => text.push(other),
                }
            }
            c => {
                lines += usize::from(c == '\n');
                text.push(c);
                i += 1;
            }
        }
    }
    (text, i, lines)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_string_literal_in_the_source_has_a_run_of_spaces_in_a_sentence() {
    let mut files = Vec::new();
    rust_files(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path(),
        &mut files,
    );
    files.sort();
    assert!(files.len() > 50, "the source was not found");
    let mut bad = Vec::new();
    for file in &files {
        // Test modules hold data shaped like other programs' output, not messages.
        if file
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with("tests.rs"))
        {
            continue;
        }
        let whole = std::fs::read_to_string(file).unwrap();
        let src = whole.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
        for (line, text) in string_literals(src) {
            for run in runs_in(&text) {
                bad.push(format!("{}:{line}: …{run}…", file.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "runs of spaces in messages:\n{}",
        bad.join("\n")
    );
}

/// The checks above find what they are for: a continuation without `\` is caught, one with it
/// is not, and alignment, comments and char literals are left alone.
#[test]
fn the_literal_check_catches_a_lost_continuation() {
    let lost = "let m = format!(\n    \"nothing answers there, so\n     chats fail\");";
    let kept = "let m = format!(\n    \"nothing answers there, so \\\n     chats fail\");";
    let lost: Vec<_> = string_literals(lost).into_iter().map(|(_, t)| t).collect();
    let kept: Vec<_> = string_literals(kept).into_iter().map(|(_, t)| t).collect();
    assert_eq!(kept, ["nothing answers there, so chats fail"]);
    assert_eq!(
        runs_in(&lost[0]).len(),
        0,
        "a newline, then indentation: a new line"
    );
    let one_line = "x(\"there, so              chats\")";
    let found: Vec<_> = string_literals(one_line)
        .iter()
        .flat_map(|(_, t)| runs_in(t))
        .collect();
    assert_eq!(found, ["there, so              chats"]);
    let fine = "// a comment, so   here\nlet c = '\"'; let s = \"[ok]   CA\\n  - item: x  {}\";";
    let found: Vec<_> = string_literals(fine)
        .iter()
        .flat_map(|(_, t)| runs_in(t))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}

fn assert_reads_well(checks: &[Check]) {
    for c in checks {
        for part in [Some(&c.subject), Some(&c.detail), c.fix.as_ref()]
            .into_iter()
            .flatten()
        {
            let runs = runs_in(part);
            assert!(runs.is_empty(), "{c}\nruns of spaces: {runs:?}");
            assert!(!part.contains("  "), "{c}\ntwo spaces in a row");
        }
    }
}

#[test]
fn doctor_lines_read_as_sentences() {
    let ours = "http://127.0.0.1:8443";
    let mut checks = Vec::new();
    let held = [
        Held::Yes("127.0.0.1:8443".parse().unwrap()),
        Held::No("the login service is not installed".into()),
    ];
    for proxy in [None, Some(ours), Some("http://corp:3128")] {
        for pac in [None, Some("http://127.0.0.1:8443/proxy.pac")] {
            for listening in [false, true] {
                for h in &held {
                    checks.push(doctor::check_wiring(proxy, ours, pac, listening, h));
                }
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    checks.push(doctor::check_ca(dir.path()).0);
    let listen: SocketAddr = "127.0.0.1:8443".parse().unwrap();
    let settings = dir.path().join("settings.json");
    checks.push(doctor::check_cursor_settings(Some(&settings), listen, None));
    for text in [
        "{ not json",
        "{}",
        r#"{"http.proxy": "http://127.0.0.1:9999"}"#,
    ] {
        std::fs::write(&settings, text).unwrap();
        checks.push(doctor::check_cursor_settings(Some(&settings), listen, None));
    }
    assert!(checks.len() >= 16);
    assert_reads_well(&checks);
}
