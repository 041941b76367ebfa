//! The rooms import one way (docs/architecture-rooms.md): every `crate::…` reference in
//! `src/` (test modules left out) must be an edge of the table below, and the table has no
//! cycle. A new edge fails here until it is added to the table and the doc, on purpose.

mod architecture {
    pub mod modules;
    pub mod source;
}

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use architecture::modules::{mod_path, Crate};
use architecture::source::{code_of, rust_files};

/// Which rooms each room may use. Flow order: the front door (`proxy`, `relay`) hands requests
/// to `router`, which sends them to passthrough (`upstream`), Cursor's services (`cursor`) or
/// the agent; the agent calls `provider`. Codecs, config and plumbing sit below.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "cli",
        &[
            "base", "capture", "config", "proxy", "setup", "status", "tls",
        ],
    ),
    ("setup", &["base", "config", "provider", "status", "tls"]),
    (
        "proxy",
        &[
            "agent", "base", "config", "cursor", "http", "relay", "router", "status", "tls",
            "upstream",
        ],
    ),
    ("relay", &["base", "http", "router", "upstream"]),
    ("router", &["agent", "cursor", "http", "status", "upstream"]),
    (
        "agent",
        &[
            "base", "capture", "config", "connect", "cursor", "http", "proto", "provider",
            "status", "upstream",
        ],
    ),
    (
        "cursor",
        &[
            "capture", "config", "connect", "http", "proto", "status", "upstream",
        ],
    ),
    ("status", &["base", "capture", "http", "proto", "provider"]),
    ("capture", &["base", "proto"]),
    ("upstream", &["base", "config", "http", "tls"]),
    ("provider", &["base"]),
    ("config", &["base", "provider"]),
    ("tls", &[]),
    ("connect", &["proto"]),
    ("proto", &[]),
    ("http", &[]),
    ("base", &[]),
];

/// Inside the agent, only the transport adapters speak HTTP: the run loop, its state and the
/// tools never touch requests, bodies or the upstream.
const AGENT_HTTP_FREE: &[&str] = &[
    "run", "state", "tools", "messages", "model", "prompt", "context", "blob_id", "cmdk",
];
const HTTP_ROOMS: &[&str] = &["http", "router", "upstream", "proxy", "relay"];

fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    ALLOWED
        .iter()
        .map(|(room, uses)| (*room, uses.iter().copied().collect()))
        .collect()
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
    let files = rust_files(&src);
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
    let files = rust_files(&src);
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
    let files = rust_files(&src.join("agent"));
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

/// The files of one room that depend on each other in a circle (Tarjan's strongly connected
/// components over the file graph), each with the edges that tie it.
fn file_cycles(src: &Path) -> Vec<String> {
    let krate = Crate::read(src);
    let room_of_file = |file: &Path| mod_path(src, file).first().cloned().unwrap_or_default();
    let mut graph: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    for (path, module) in &krate.modules {
        let room = path.first().cloned().unwrap_or_default();
        let edges = krate
            .edges_of(path)
            .into_iter()
            .filter(|(to, _)| !room.is_empty() && room_of_file(to) == room)
            .collect();
        graph.insert(module.file.clone(), edges);
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|circle| {
            let mut lines = vec![format!("circle of {} files:", circle.len())];
            for from in &circle {
                for (to, names) in &graph[from] {
                    if circle.contains(to) {
                        let names: Vec<_> = names.iter().map(String::as_str).collect();
                        lines.push(format!(
                            "  {} -> {}: {}",
                            shown(from),
                            shown(to),
                            names.join(", ")
                        ));
                    }
                }
            }
            lines.join("\n")
        })
        .collect()
}

type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>;

fn strongly_connected(graph: &Graph) -> Vec<BTreeSet<PathBuf>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        out: Vec<BTreeSet<PathBuf>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph[v].keys() {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    component.insert(w.clone());
                    if w == v {
                        break;
                    }
                }
                self.out.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn the_files_of_each_room_use_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = file_cycles(&src);
    assert!(
        cycles.is_empty(),
        "files inside a room depend on each other in a circle; move what both use into a \
         module below them (docs/architecture-rooms.md):\n{}",
        cycles.join("\n")
    );
}

/// A small crate on disk: `a/mod.rs` re-exports `a::low::Thing`; `a/high.rs` uses it through
/// the re-export and `a/low.rs` uses `a::high` back, which closes a circle through files.
#[test]
fn the_file_scanner_follows_reexports_and_finds_a_circle() {
    let dir = std::env::temp_dir().join(format!("arch-scan-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    fs::create_dir_all(src.join("a")).expect("temp dir");
    let write = |path: &str, text: &str| fs::write(src.join(path), text).expect("write");
    write("lib.rs", "pub mod a;\n");
    write(
        "a/mod.rs",
        "mod high;\nmod low;\npub use low::Thing;\npub(crate) use high::{run as go};\n",
    );
    write(
        "a/high.rs",
        "use super::Thing; // crate::a::low\npub fn run() -> Thing { let s = \"super::low\"; Thing }\n",
    );
    write(
        "a/low.rs",
        "pub struct Thing;\nfn back() { crate::a::high::run(); }\n",
    );
    let cycles = file_cycles(&src);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains("a/high.rs -> ") && cycles[0].contains("low.rs: Thing"));
    assert!(cycles[0].contains("a/low.rs -> ") && cycles[0].contains("high.rs: run"));
    write("a/low.rs", "pub struct Thing;\n");
    assert!(file_cycles(&src).is_empty());
    let _ = fs::remove_dir_all(&dir);
}

/// Circles between the sub-rooms of a module: its child modules (a folder with everything
/// below it, or a file), which may use their siblings in one direction only, as rooms do. Each
/// circle comes with the file edges that tie it.
fn sub_room_cycles(src: &Path) -> Vec<String> {
    let krate = Crate::read(src);
    // Parent module → its children's graph, the file edges standing for each child edge.
    let mut rooms: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for (path, module) in &krate.modules {
        for (to_file, names) in krate.edges_of(path) {
            let to = mod_path(src, &to_file);
            let common = path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // Across rooms (the room table's), or between a module and its own parent.
            if common == 0 || common >= path.len() || common >= to.len() {
                continue;
            }
            let names: Vec<_> = names.iter().map(String::as_str).collect();
            rooms
                .entry(path[..common].to_vec())
                .or_default()
                .entry(PathBuf::from(&path[common]))
                .or_default()
                .entry(PathBuf::from(&to[common]))
                .or_default()
                .insert(format!(
                    "{} -> {}: {}",
                    shown(&module.file),
                    shown(&to_file),
                    names.join(", ")
                ));
        }
    }
    let mut out = Vec::new();
    for (parent, graph) in &rooms {
        for circle in strongly_connected(graph)
            .into_iter()
            .filter(|c| c.len() > 1)
        {
            let named: Vec<_> = circle.iter().map(|c| c.display().to_string()).collect();
            let mut lines = vec![format!(
                "circle between the sub-rooms of {}: {}",
                parent.join("::"),
                named.join(", ")
            )];
            for from in &circle {
                for (to, ties) in &graph[from] {
                    if circle.contains(to) {
                        lines.extend(ties.iter().map(|t| format!("  {t}")));
                    }
                }
            }
            out.push(lines.join("\n"));
        }
    }
    out
}

#[test]
fn the_sub_rooms_of_each_room_use_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = sub_room_cycles(&src);
    assert!(
        cycles.is_empty(),
        "sub-rooms of a room depend on each other in a circle; move what both use into a \
         sub-room below them (docs/architecture-rooms.md):\n{}",
        cycles.join("\n")
    );
}

/// A small crate on disk whose files use each other one way, yet whose folders `a::x` and
/// `a::y` use each other both ways (`x/q.rs` uses `y/r.rs`, `y/s.rs` uses `x/p.rs`): the
/// file check passes, the sub-room check finds the circle.
#[test]
fn the_sub_room_check_finds_a_circle_the_file_check_does_not() {
    let dir = std::env::temp_dir().join(format!("arch-sub-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    fs::create_dir_all(src.join("a/x")).expect("temp dir");
    fs::create_dir_all(src.join("a/y")).expect("temp dir");
    let write = |path: &str, text: &str| fs::write(src.join(path), text).expect("write");
    write("lib.rs", "pub mod a;\n");
    write("a/mod.rs", "pub mod x;\npub mod y;\n");
    write("a/x/mod.rs", "pub mod p;\npub mod q;\n");
    write("a/x/p.rs", "pub struct P;\n");
    write(
        "a/x/q.rs",
        "pub fn q() -> crate::a::y::r::R { crate::a::y::r::R }\n",
    );
    write("a/y/mod.rs", "pub mod r;\npub mod s;\n");
    write("a/y/r.rs", "pub struct R;\n");
    write(
        "a/y/s.rs",
        "use crate::a::x::p::P;\npub fn s() -> P { P }\n",
    );
    assert!(file_cycles(&src).is_empty());
    let cycles = sub_room_cycles(&src);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains("sub-rooms of a: x, y"), "{}", cycles[0]);
    assert!(cycles[0].contains("a/x/q.rs -> ") && cycles[0].contains("r.rs: R"));
    assert!(cycles[0].contains("a/y/s.rs -> ") && cycles[0].contains("p.rs: P"));
    write("a/y/s.rs", "pub fn s() {}\n");
    assert!(sub_room_cycles(&src).is_empty());
    let _ = fs::remove_dir_all(&dir);
}

/// The longest a function may be (from its `fn` line to its closing brace) unless a comment
/// right above it starts with `Long on purpose:` and says why it reads better whole.
const LONGEST_FUNCTION: usize = 80;
const LONG_ON_PURPOSE: &str = "Long on purpose:";

/// `(first line, lines)` of every function in a file's code (as `code_of` returns it).
fn functions(code: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let is_fn = lines[i]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "fn")
            && !lines[i].trim_start().starts_with("type ");
        if !is_fn {
            i += 1;
            continue;
        }
        let mut depth = 0usize;
        let mut opened = false;
        let mut end = None;
        'lines: for (j, line) in lines.iter().enumerate().skip(i) {
            for c in line.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth = depth.saturating_sub(1),
                    ';' if !opened => break 'lines,
                    _ => {}
                }
                if opened && depth == 0 {
                    end = Some(j);
                    break 'lines;
                }
            }
        }
        match end {
            // A function inside a function is counted as part of the outer one.
            Some(end) => {
                out.push((i, end - i + 1));
                i = end + 1;
            }
            None => i += 1,
        }
    }
    out
}

#[test]
fn no_function_is_long_without_saying_why() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for file in rust_files(&src) {
        let text = fs::read_to_string(&file).expect("a source file");
        let raw: Vec<&str> = text.lines().collect();
        for (first, len) in functions(&code_of(&text)) {
            if len <= LONGEST_FUNCTION {
                continue;
            }
            let said = raw[..first]
                .iter()
                .rev()
                .take_while(|l| {
                    let l = l.trim_start();
                    l.starts_with("//") || l.starts_with("#[")
                })
                .any(|l| l.contains(LONG_ON_PURPOSE));
            if !said {
                long.push(format!("{}:{} ({len} lines)", shown(&file), first + 1));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines; split them, or say why above them \
         (`// {LONG_ON_PURPOSE} …`):\n{}",
        long.join("\n")
    );
}

#[test]
fn a_function_is_measured_from_fn_to_its_brace() {
    let code = code_of(
        "fn a() {\n    let x = \"}\";\n}\n\nfn b();\n#[cfg(test)]\nmod tests {\n    fn c() {}\n}\nfn d() { if x { y } }\n",
    );
    assert_eq!(functions(&code), [(0, 3), (9, 1)]);
}
