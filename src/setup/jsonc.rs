//! A small JSONC reader and editor for VS Code-style `settings.json` files.
//!
//! JSONC is JSON plus `//` and `/* */` comments and trailing commas. The whole document is
//! parsed (so a file we cannot read is refused rather than "repaired"), but only members of the
//! top-level object are edited, by splicing bytes: every comment, blank line and indentation
//! the user wrote stays byte for byte.
//!
//! Why not `jsonc-parser`'s CST (tried with 0.34, loose syntax switched off): it writes what
//! these tests pin down differently. Members added to an empty object or document get two
//! spaces, not VS Code's four (no way to set the indent of an object without members); a
//! one-line object `{"x": 0}` is made multi-line; in a file whose last member has a trailing
//! comma, the added member gets one too; a raw line break inside a string is accepted; a
//! missing comma is reported at the end of the previous value (line 2, column 9) rather than
//! at the key that lacks it (line 3, column 3); a leading BOM fails to parse; and a value can
//! be put back only as a built value, not as the source text another version of the file had
//! (`with_raw`). So the reader and the byte splicer stay here.

use std::ops::Range;

use serde_json::Value;

/// Nesting beyond this is refused (keeps the recursive parser's stack bounded).
const MAX_DEPTH: usize = 128;
const DEFAULT_INDENT: &str = "    ";

/// Why a document could not be read. Positions are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub reason: String,
}

/// One member of the top-level object, with where its parts sit in the text.
#[derive(Debug, Clone)]
pub struct Member {
    pub key: String,
    /// Offset of the key's opening quote.
    pub start: usize,
    /// The value's bytes.
    pub value: Range<usize>,
    /// Offset of the comma after the value, if there is one.
    pub comma: Option<usize>,
    pub parsed: Value,
}

#[derive(Debug, Clone)]
struct Root {
    open: usize,
    members: Vec<Member>,
}

/// A parsed document: the text and its top-level members.
#[derive(Debug, Clone)]
pub struct Document<'a> {
    text: &'a str,
    /// `None` for a document without a value (empty, or only comments).
    root: Option<Root>,
}

/// A byte splice: replace `range` with `insert`.
#[derive(Debug, Clone)]
struct Edit {
    range: Range<usize>,
    insert: String,
}

impl<'a> Document<'a> {
    /// Parse `text`. The top-level value must be an object (or absent).
    pub fn parse(text: &'a str) -> Result<Document<'a>, ParseError> {
        let mut p = Parser {
            text,
            b: text.as_bytes(),
            i: 0,
        };
        if text.starts_with('\u{feff}') {
            p.i = '\u{feff}'.len_utf8();
        }
        p.skip_trivia()?;
        if p.i == p.b.len() {
            return Ok(Document { text, root: None });
        }
        if p.b[p.i] != b'{' {
            return Err(p.error("the top-level value must be an object `{ … }`"));
        }
        let root = p.top_object()?;
        p.skip_trivia()?;
        if p.i != p.b.len() {
            return Err(p.error("unexpected text after the top-level object"));
        }
        Ok(Document {
            text,
            root: Some(root),
        })
    }

    pub fn members(&self) -> &[Member] {
        self.root.as_ref().map_or(&[], |r| &r.members)
    }

    /// The effective value of a top-level key (the last one wins, as in VS Code).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.members()
            .iter()
            .rev()
            .find(|m| m.key == key)
            .map(|m| &m.parsed)
    }

    /// The source text of a top-level key's (last) value.
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        let text = self.text;
        self.members()
            .iter()
            .rev()
            .find(|m| m.key == key)
            .map(|m| &text[m.value.clone()])
    }

    /// The text with each `(key, value)` set at the top level: existing members get the new
    /// value in place (every occurrence of a duplicated key); missing ones are appended to the
    /// object in its own indentation style. Members already holding the value are untouched,
    /// so applying the same settings twice changes nothing the second time.
    pub(crate) fn with_values(&self, entries: &[(&str, Value)]) -> String {
        self.with_raw_values(
            &entries
                .iter()
                .map(|(k, v)| {
                    (
                        *k,
                        serde_json::to_string(v).unwrap_or_else(|_| "null".into()),
                    )
                })
                .collect::<Vec<_>>(),
            Some(entries),
        )
    }

    /// Like [`Document::with_values`] with values given as source text (kept verbatim), e.g. to
    /// put back a value as another version of the file spelled it.
    pub(crate) fn with_raw(&self, entries: &[(&str, String)]) -> String {
        self.with_raw_values(entries, None)
    }

    fn with_raw_values(&self, raw: &[(&str, String)], parsed: Option<&[(&str, Value)]>) -> String {
        let mut edits = Vec::new();
        let mut missing = Vec::new();
        for (i, (key, text)) in raw.iter().enumerate() {
            let want = parsed.map(|p| &p[i].1);
            let mut found = false;
            for m in self.members().iter().filter(|m| m.key == *key) {
                found = true;
                let same = match want {
                    Some(v) => m.parsed == *v,
                    None => self.text[m.value.clone()] == **text,
                };
                if !same {
                    edits.push(Edit {
                        range: m.value.clone(),
                        insert: text.clone(),
                    });
                }
            }
            if !found {
                missing.push((quote(key), text.as_str()));
            }
        }
        if !missing.is_empty() {
            edits.extend(self.insertion(&missing));
        }
        splice(self.text, edits)
    }

    /// The text without the top-level members named `keys` (their own lines go too when they
    /// stood alone on them).
    pub fn without(&self, keys: &[&str]) -> String {
        let members = self.members();
        let removed = |m: &Member| keys.contains(&m.key.as_str());
        let mut edits = Vec::new();
        // Removing the tail of the object: the last kept member becomes the last one, and loses
        // its comma unless the file ends its objects with trailing commas anyway.
        let last_kept = members.iter().rposition(|m| !removed(m));
        let trailing_style = members.last().is_some_and(|m| m.comma.is_some());
        if let Some(k) = last_kept {
            if k + 1 < members.len() && !trailing_style {
                if let Some(c) = members[k].comma {
                    edits.push(Edit {
                        range: c..c + 1,
                        insert: String::new(),
                    });
                }
            }
        }
        for m in members.iter().filter(|m| removed(m)) {
            let mut start = m.start;
            let mut end = m.comma.map_or(m.value.end, |c| c + 1);
            let line_start = self.text[..start].rfind('\n').map_or(0, |n| n + 1);
            let before_blank = self.text[line_start..start]
                .bytes()
                .all(|b| b == b' ' || b == b'\t');
            let after = &self.text[end..];
            let rest = after.trim_start_matches([' ', '\t']);
            if before_blank && (rest.starts_with('\n') || rest.starts_with("\r\n")) {
                start = line_start;
                end += after.len() - rest.len() + if rest.starts_with('\n') { 1 } else { 2 };
            }
            edits.push(Edit {
                range: start..end,
                insert: String::new(),
            });
        }
        splice(self.text, edits)
    }

    /// Where and how to add `members` (already-quoted keys with value text).
    fn insertion(&self, members: &[(String, &str)]) -> Vec<Edit> {
        let text = self.text;
        let nl = if text.contains("\r\n") { "\r\n" } else { "\n" };
        let Some(root) = &self.root else {
            // No object at all (empty, or only comments): append one.
            let mut out = String::new();
            if !text.is_empty() && !text.ends_with('\n') {
                out.push_str(nl);
            }
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                let sep = if i + 1 < members.len() { "," } else { "" };
                out.push_str(&format!("{nl}{DEFAULT_INDENT}{k}: {v}{sep}"));
            }
            out.push_str(&format!("{nl}}}{nl}"));
            return vec![Edit {
                range: text.len()..text.len(),
                insert: out,
            }];
        };
        let indent = self.indent(root);
        let lines = |prefix_comma_first: bool| {
            let mut out = String::new();
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 || prefix_comma_first {
                    out.push(',');
                }
                out.push_str(&format!("{nl}{indent}{k}: {v}"));
            }
            out
        };
        let mut edits = Vec::new();
        let after = match root.members.last() {
            Some(last) => {
                if last.comma.is_none() {
                    edits.push(Edit {
                        range: last.value.end..last.value.end,
                        insert: ",".into(),
                    });
                }
                last.comma.map_or(last.value.end, |c| c + 1)
            }
            None => root.open + 1,
        };
        // Past a comment on the same line, so it stays with the member it annotates.
        let (at, line_ends) = end_of_line(text, after);
        let insert = if line_ends {
            lines(false)
        } else if root.members.is_empty() {
            // `{}` on one line: open it up.
            format!("{}{nl}", lines(false))
        } else {
            // A one-line object stays on one line.
            let parts: Vec<String> = members.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!(" {}", parts.join(", "))
        };
        edits.push(Edit {
            range: at..at,
            insert,
        });
        edits
    }

    /// The indentation of the first member that starts its own line.
    fn indent(&self, root: &Root) -> String {
        for m in &root.members {
            let line_start = self.text[..m.start].rfind('\n').map_or(0, |n| n + 1);
            let lead = &self.text[line_start..m.start];
            if line_start > root.open && lead.bytes().all(|b| b == b' ' || b == b'\t') {
                return lead.to_string();
            }
        }
        DEFAULT_INDENT.to_string()
    }
}

/// From `pos`, skip spaces and comments on the same line. Returns where that stops and whether
/// it is the end of the line.
fn end_of_line(text: &str, mut pos: usize) -> (usize, bool) {
    let b = text.as_bytes();
    loop {
        while pos < b.len() && (b[pos] == b' ' || b[pos] == b'\t') {
            pos += 1;
        }
        let rest = &text[pos..];
        if rest.is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n") {
            return (pos, true);
        }
        if rest.starts_with("//") {
            let len = rest.find(['\n', '\r']).unwrap_or(rest.len());
            return (pos + len, true);
        }
        if rest.starts_with("/*") {
            match rest.find("*/") {
                Some(end) if !rest[..end].contains('\n') => {
                    pos += end + 2;
                    continue;
                }
                _ => return (pos, false),
            }
        }
        return (pos, false);
    }
}

fn quote(key: &str) -> String {
    serde_json::to_string(key).unwrap_or_else(|_| format!("\"{key}\""))
}

/// Apply non-overlapping edits (from the end, so earlier offsets stay valid). Insertions at the
/// same offset land in the order they were pushed.
fn splice(text: &str, edits: Vec<Edit>) -> String {
    let mut edits: Vec<(usize, Edit)> = edits.into_iter().enumerate().collect();
    edits.sort_by(|(i, a), (j, b)| {
        (b.range.start, b.range.end, j).cmp(&(a.range.start, a.range.end, i))
    });
    let mut out = text.to_string();
    for (_, e) in edits {
        out.replace_range(e.range, &e.insert);
    }
    out
}

struct Parser<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn error(&self, reason: &str) -> ParseError {
        let before = &self.text[..self.i.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before
            .rfind('\n')
            .map_or(before, |n| &before[n + 1..])
            .chars()
            .count()
            + 1;
        ParseError {
            line,
            column,
            reason: reason.to_string(),
        }
    }

    /// Whitespace and comments.
    fn skip_trivia(&mut self) -> Result<(), ParseError> {
        loop {
            match self.b.get(self.i) {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.i += 1,
                Some(b'/') => match self.b.get(self.i + 1) {
                    Some(b'/') => {
                        while self.i < self.b.len() && self.b[self.i] != b'\n' {
                            self.i += 1;
                        }
                    }
                    Some(b'*') => match self.text[self.i + 2..].find("*/") {
                        Some(end) => self.i += 2 + end + 2,
                        None => return Err(self.error("unterminated /* comment")),
                    },
                    _ => return Err(self.error("unexpected `/`")),
                },
                _ => return Ok(()),
            }
        }
    }

    fn expect(&mut self, c: u8, what: &str) -> Result<(), ParseError> {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    fn top_object(&mut self) -> Result<Root, ParseError> {
        let open = self.i;
        let mut members = Vec::new();
        self.object(0, &mut |m| members.push(m))?;
        Ok(Root { open, members })
    }

    /// `{ … }` at `self.i`; each member goes to `sink` with its spans.
    fn object(&mut self, depth: usize, sink: &mut dyn FnMut(Member)) -> Result<Value, ParseError> {
        self.expect(b'{', "expected `{`")?;
        let mut map = serde_json::Map::new();
        loop {
            self.skip_trivia()?;
            if self.b.get(self.i) == Some(&b'}') {
                self.i += 1;
                return Ok(Value::Object(map));
            }
            if self.b.get(self.i) != Some(&b'"') {
                return Err(self.error("expected a \"key\" or `}`"));
            }
            let start = self.i;
            let key = self.string()?;
            self.skip_trivia()?;
            self.expect(b':', "expected `:` after the key")?;
            self.skip_trivia()?;
            let value_start = self.i;
            let value = self.value(depth + 1)?;
            let value_end = self.i;
            self.skip_trivia()?;
            let comma = match self.b.get(self.i) {
                Some(b',') => {
                    self.i += 1;
                    Some(self.i - 1)
                }
                Some(b'}') => None,
                _ => return Err(self.error("expected `,` or `}`")),
            };
            sink(Member {
                key: key.clone(),
                start,
                value: value_start..value_end,
                comma,
                parsed: value.clone(),
            });
            map.insert(key, value);
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.expect(b'[', "expected `[`")?;
        let mut items = Vec::new();
        loop {
            self.skip_trivia()?;
            if self.b.get(self.i) == Some(&b']') {
                self.i += 1;
                return Ok(Value::Array(items));
            }
            items.push(self.value(depth + 1)?);
            self.skip_trivia()?;
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {}
                _ => return Err(self.error("expected `,` or `]`")),
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        match self.b.get(self.i) {
            Some(b'{') => self.object(depth, &mut |_| {}),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't' | b'f' | b'n') => self.literal(),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of file")),
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let start = self.i;
        self.i += 1;
        loop {
            match self.b.get(self.i) {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => self.i += 2,
                Some(c) if *c < 0x20 => {
                    return Err(self.error("control character (e.g. a line break) in a string"))
                }
                Some(_) => self.i += 1,
            }
        }
        self.i += 1;
        let raw = self.text.get(start..self.i).unwrap_or("");
        serde_json::from_str(raw).map_err(|e| {
            self.i = start;
            self.error(&format!("bad string: {e}"))
        })
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.i;
        while matches!(
            self.b.get(self.i),
            Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        ) {
            self.i += 1;
        }
        match serde_json::from_str::<serde_json::Number>(&self.text[start..self.i]) {
            Ok(n) => Ok(Value::Number(n)),
            Err(_) => {
                self.i = start;
                Err(self.error("bad number"))
            }
        }
    }

    fn literal(&mut self) -> Result<Value, ParseError> {
        for (word, value) in [
            ("true", Value::Bool(true)),
            ("false", Value::Bool(false)),
            ("null", Value::Null),
        ] {
            if self.text[self.i..].starts_with(word) {
                let end = self.i + word.len();
                if !self.b.get(end).is_some_and(u8::is_ascii_alphanumeric) {
                    self.i = end;
                    return Ok(value);
                }
            }
        }
        Err(self.error("expected a value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(text: &str, entries: &[(&str, Value)]) -> String {
        let out = Document::parse(text).unwrap().with_values(entries);
        // Whatever we write must read back with the values set.
        let doc = Document::parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        for (k, v) in entries {
            assert_eq!(doc.get(k), Some(v), "{out}");
        }
        out
    }

    #[test]
    fn parses_jsonc() {
        let text =
            "\u{feff}// c\n{\n  /* a */ \"a\": [1, 2,], // x\n  \"b\": {\"c\": \"d\\\"\",},\n}\n";
        let doc = Document::parse(text).unwrap();
        assert_eq!(doc.get("a"), Some(&json!([1, 2])));
        assert_eq!(doc.get("b"), Some(&json!({"c": "d\""})));
        assert_eq!(doc.raw("a"), Some("[1, 2,]"));
        assert!(Document::parse("").unwrap().members().is_empty());
        assert!(Document::parse("  // only a comment\n")
            .unwrap()
            .members()
            .is_empty());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "{\"a\": 1",
            "{\"a\" 1}",
            "{a: 1}",
            "[1]",
            "{\"a\": tru}",
            "{\"a\": 1} x",
            "{\"a\": \"line\nbreak\"}",
            "{/* open",
            "{\"a\": 01}",
            "{\"a\": 1,, \"b\": 2}",
        ] {
            assert!(Document::parse(bad).is_err(), "{bad:?} should be refused");
        }
        let e = Document::parse("{\n  \"a\": 1\n  \"b\": 2\n}").unwrap_err();
        assert_eq!((e.line, e.column), (3, 3), "{e}");
        let deep = "[".repeat(10_000);
        assert!(Document::parse(&format!("{{\"a\": {deep}}}")).is_err());
    }

    #[test]
    fn replaces_in_place_and_appends_in_style() {
        let text = "{\n\t// Editor\n\t\"editor.fontSize\": 14, // big\n\t\"http.proxy\": \"\"\n}\n";
        let out = set(
            text,
            &[
                ("http.proxy", json!("http://127.0.0.1:8787")),
                ("cursor.general.disableHttp2", json!(true)),
            ],
        );
        assert_eq!(
            out,
            "{\n\t// Editor\n\t\"editor.fontSize\": 14, // big\n\t\"http.proxy\": \"http://127.0.0.1:8787\",\n\t\"cursor.general.disableHttp2\": true\n}\n"
        );
        // Idempotent.
        assert_eq!(
            set(
                &out,
                &[
                    ("http.proxy", json!("http://127.0.0.1:8787")),
                    ("cursor.general.disableHttp2", json!(true)),
                ],
            ),
            out
        );
    }

    #[test]
    fn keeps_trailing_comments_with_their_member() {
        let text = "{\n    \"a\": 1 // about a\n    // a commented-out setting\n}";
        let out = set(text, &[("b", json!(2))]);
        assert_eq!(
            out,
            "{\n    \"a\": 1, // about a\n    \"b\": 2\n    // a commented-out setting\n}"
        );
        let text = "{\r\n  \"a\": 1,\r\n}\r\n";
        assert_eq!(
            set(text, &[("b", json!(2))]),
            "{\r\n  \"a\": 1,\r\n  \"b\": 2\r\n}\r\n"
        );
    }

    #[test]
    fn empty_and_one_line_objects() {
        assert_eq!(set("{}", &[("a", json!(1))]), "{\n    \"a\": 1\n}");
        assert_eq!(
            set("{\"x\": 0}", &[("a", json!(1)), ("b", json!("s"))]),
            "{\"x\": 0, \"a\": 1, \"b\": \"s\"}"
        );
        assert_eq!(set("", &[("a", json!(1))]), "{\n    \"a\": 1\n}\n");
        assert_eq!(
            set("// hi", &[("a", json!(1))]),
            "// hi\n{\n    \"a\": 1\n}\n"
        );
        assert_eq!(
            set("{ // settings\n}\n", &[("a", json!(1))]),
            "{ // settings\n    \"a\": 1\n}\n"
        );
    }

    #[test]
    fn duplicated_keys_all_change() {
        let out = set("{\"a\": 1, \"a\": 2}", &[("a", json!(3))]);
        assert_eq!(out, "{\"a\": 3, \"a\": 3}");
    }

    #[test]
    fn removes_members_and_restores_raw_values() {
        let text = "{\n    \"keep\": 1,\n    \"x\": 2, // note\n    \"y\": 3,\n    \"z\": 4\n}\n";
        let doc = Document::parse(text).unwrap();
        assert_eq!(
            doc.without(&["y", "z"]),
            "{\n    \"keep\": 1,\n    \"x\": 2 // note\n}\n"
        );
        assert_eq!(
            doc.without(&["y"]),
            "{\n    \"keep\": 1,\n    \"x\": 2, // note\n    \"z\": 4\n}\n"
        );
        let out = doc.with_raw(&[("keep", "[ 1 ]".into())]);
        assert!(out.contains("\"keep\": [ 1 ],"), "{out}");
    }
}
