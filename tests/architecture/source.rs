//! Reading `src/` as text: the code of a file without comments, string contents and test
//! items (line numbers kept), and the paths it names.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, test-only files (`tests.rs`, `*_tests.rs`) left out.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(dir, &mut out);
    out.sort();
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.is_dir() {
            collect(&path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// The file's code with comments and string contents blanked and `#[cfg(test)]` items
/// removed; every newline is kept, so a line number in the result is one in the file.
pub fn code_of(text: &str) -> String {
    strip_test_items(&strip_comments_and_strings(text))
}

fn strip_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let newlines = |out: &mut String, from: &[char]| {
        out.extend(from.iter().filter(|c| **c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            newlines(&mut out, &chars[start..i.min(chars.len())]);
        } else if let Some(end) = raw_string_end(&chars, i) {
            out.push_str("\"\"");
            newlines(&mut out, &chars[i..end]);
            i = end;
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
            newlines(&mut out, &chars[start..i.min(chars.len())]);
        } else if c == '\'' {
            // A char literal (`'x'`, `'\n'`, `'"'`) is blanked; a lifetime is kept.
            let end = if next == Some('\\') {
                chars[i + 2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map(|p| i + 2 + p + 1)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` ends, if one does.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// Blank each `#[cfg(test)]` item: up to its `;` or its balanced `{ … }` block.
fn strip_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        rest = &rest[at + MARK.len()..];
        let end_semi = rest.find(';');
        let cut = match (rest.find('{'), end_semi) {
            (Some(open), semi) if semi.is_none_or(|s| open < s) => {
                let mut depth = 0usize;
                let mut cut = rest.len();
                for (i, c) in rest[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                cut = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                cut
            }
            (_, Some(semi)) => semi + 1,
            _ => rest.len(),
        };
        out.extend(rest[..cut].chars().filter(|c| *c == '\n'));
        rest = &rest[cut..];
    }
    out.push_str(rest);
    out
}

#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    Ident(String),
    Path,
    Open,
    Close,
    Comma,
    Star,
    Semi,
    Other,
}

pub fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
            continue;
        }
        let token = match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                i += 1;
                Token::Path
            }
            '{' => Token::Open,
            '}' => Token::Close,
            ',' => Token::Comma,
            '*' => Token::Star,
            ';' => Token::Semi,
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            _ => Token::Other,
        };
        out.push(token);
        i += 1;
    }
    out
}

/// A path named in a `use` tree or in code: its segments as written, and the name it is
/// brought in under (`as`, or its last segment).
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    pub segments: Vec<String>,
    pub alias: String,
}

/// Parses the `use` tree or plain path starting at `at` (an identifier followed by `::`),
/// pushing every path it names; returns the index after it.
pub fn parse_tree(toks: &[Token], at: usize, prefix: &[String], out: &mut Vec<Named>) -> usize {
    let mut segments = prefix.to_vec();
    let mut i = at;
    loop {
        match toks.get(i) {
            Some(Token::Ident(name)) if name == "self" && !segments.is_empty() => i += 1,
            Some(Token::Ident(name)) => {
                segments.push(name.clone());
                i += 1;
            }
            Some(Token::Open) => {
                i += 1;
                while let Some(t) = toks.get(i) {
                    match t {
                        Token::Close => {
                            i += 1;
                            break;
                        }
                        Token::Comma => i += 1,
                        _ => i = parse_tree(toks, i, &segments, out),
                    }
                }
                return i;
            }
            Some(Token::Star) => {
                out.push(Named {
                    alias: String::from("*"),
                    segments,
                });
                return i + 1;
            }
            _ => break,
        }
        if toks.get(i) != Some(&Token::Path) {
            break;
        }
        i += 1;
    }
    let mut alias = segments.last().cloned().unwrap_or_default();
    if let (Some(Token::Ident(kw)), Some(Token::Ident(name))) = (toks.get(i), toks.get(i + 1)) {
        if kw == "as" {
            alias = name.clone();
            i += 2;
        }
    }
    if !segments.is_empty() {
        out.push(Named { segments, alias });
    }
    i
}
