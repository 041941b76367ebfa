//! The rooms import one way (docs/architecture-rooms.md): every `crate::…` reference in
//! `src/` (test modules left out) must be an edge of the table below, and the table has no
//! cycle. A new edge fails here until it is added to the table and the doc, on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Which rooms each room may use. Flow order: the front door (`proxy`, `relay`) hands requests
/// to `router`, which sends them to passthrough (`upstream`), Cursor's services (`cursor`) or
/// the agent; the agent calls `provider`. Codecs, config and plumbing sit below.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "cli",
        &["capture", "config", "proxy", "setup", "status", "tls"],
    ),
    ("setup", &["config", "provider", "status", "tls"]),
    (
        "proxy",
        &[
            "agent",
            "cancel",
            "config",
            "conn_tasks",
            "cursor",
            "http",
            "relay",
            "router",
            "secret",
            "status",
            "tls",
            "upstream",
        ],
    ),
    ("relay", &["cancel", "router", "upstream"]),
    ("router", &["agent", "cursor", "http", "status", "upstream"]),
    (
        "agent",
        &[
            "cancel", "capture", "config", "connect", "cursor", "http", "proto", "provider",
            "secret", "status", "upstream",
        ],
    ),
    (
        "cursor",
        &[
            "capture", "config", "connect", "http", "proto", "status", "upstream",
        ],
    ),
    (
        "status",
        &["capture", "http", "proto", "provider", "secret"],
    ),
    ("capture", &["proto"]),
    (
        "upstream",
        &["config", "conn_tasks", "http", "secret", "tls"],
    ),
    ("provider", &["cancel", "secret"]),
    ("config", &["provider", "secret"]),
    ("tls", &[]),
    ("connect", &["proto"]),
    ("proto", &[]),
    ("http", &[]),
    ("secret", &[]),
    ("cancel", &[]),
    ("conn_tasks", &[]),
];

/// Inside the agent, only the transport adapters speak HTTP: the run loop, its state and the
/// tools never touch requests, bodies or the upstream.
const AGENT_HTTP_FREE: &[&str] = &[
    "run", "state", "tools", "messages", "model", "prompt", "context",
];
const HTTP_ROOMS: &[&str] = &["http", "router", "upstream", "proxy", "relay"];

fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    ALLOWED
        .iter()
        .map(|(room, uses)| (*room, uses.iter().copied().collect()))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The file's code without comments, string contents and `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let without_comments: String = text
        .lines()
        .map(|line| match line.find("//") {
            // `//` inside a string literal (a URL) is rare in `use` lines; cutting there only
            // loses references, and a reference after a URL on one line does not occur.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    strip_test_items(&without_comments)
}

/// Drop each `#[cfg(test)]` item: up to its `;` or its balanced `{ … }` block.
fn strip_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        let end_semi = rest.find(';');
        let open = rest.find('{');
        match (open, end_semi) {
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
                rest = &rest[cut..];
            }
            (_, Some(semi)) => rest = &rest[semi + 1..],
            _ => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// The modules named right after `crate::`, including `use crate::{a::…, b}` groups.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let after = &code[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start => {
                        refs.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            refs.insert(ident(after));
        }
    }
    refs.retain(|r| !r.is_empty() && r != "self");
    refs
}

/// `(room, sub-room)` of a file: `src/agent/run/mod.rs` → `("agent", "run")`.
fn room_of(src: &Path, file: &Path) -> (String, String) {
    let rel = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    let room = parts.first().cloned().unwrap_or_default();
    let sub = parts.get(1).cloned().unwrap_or_default();
    (room, sub)
}

/// A path as the repository names it (`src/…`).
fn shown(file: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

struct Edge {
    from: String,
    to: String,
    file: PathBuf,
}

fn edges() -> Vec<Edge> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut edges = Vec::new();
    for file in files {
        let (room, _) = room_of(&src, &file);
        // The crate roots declare the rooms; they are no room themselves.
        if room == "lib" || room == "main" {
            continue;
        }
        let text = fs::read_to_string(&file).expect("a source file");
        for to in crate_refs(&code_of(&text)) {
            if to != room {
                edges.push(Edge {
                    from: room.clone(),
                    to,
                    file: file.clone(),
                });
            }
        }
    }
    edges
}

#[test]
fn every_import_follows_the_allowed_directions() {
    let allowed = allowed();
    let mut wrong = Vec::new();
    for e in edges() {
        let ok = allowed
            .get(e.from.as_str())
            .is_some_and(|uses| uses.contains(e.to.as_str()));
        if !ok {
            wrong.push(format!("{} -> {} ({})", e.from, e.to, shown(&e.file)));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports outside the room table (tests/architecture.rs, docs/architecture-rooms.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_room_in_src_is_in_the_table() {
    let allowed = allowed();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = BTreeSet::new();
    for file in &files {
        let (room, _) = room_of(&src, file);
        if room != "lib" && room != "main" && !allowed.contains_key(room.as_str()) {
            missing.insert(room);
        }
    }
    assert!(
        missing.is_empty(),
        "rooms missing from the table: {missing:?}"
    );
}

#[test]
fn the_room_table_has_no_cycle() {
    let allowed = allowed();
    // Depth-first search; a room met again while still on the path closes a cycle.
    fn visit<'a>(
        room: &'a str,
        allowed: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(room) {
            return;
        }
        if let Some(at) = path.iter().position(|r| *r == room) {
            panic!("cycle: {} -> {room}", path[at..].join(" -> "));
        }
        path.push(room);
        for next in allowed.get(room).into_iter().flatten() {
            visit(next, allowed, path, done);
        }
        path.pop();
        done.insert(room);
    }
    let mut done = BTreeSet::new();
    for room in allowed.keys() {
        visit(room, &allowed, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_agent_loop_never_touches_http() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("agent"), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let (_, sub) = room_of(&src, &file);
        if !AGENT_HTTP_FREE.contains(&sub.as_str()) {
            continue;
        }
        let text = fs::read_to_string(&file).expect("a source file");
        for to in crate_refs(&code_of(&text)) {
            if HTTP_ROOMS.contains(&to.as_str()) {
                wrong.push(format!("agent::{sub} -> {to} ({})", shown(&file)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the agent loop reaches HTTP:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scanner_sees_grouped_imports_and_skips_test_modules() {
    let code = code_of(
        "use crate::{a::X, b};\nuse crate::c::Y; // crate::d\n#[cfg(test)]\nmod tests {\n use crate::e;\n}\nfn f() { crate::g::h(); }\n",
    );
    let refs: Vec<_> = crate_refs(&code).into_iter().collect();
    assert_eq!(refs, ["a", "b", "c", "g"]);
}
