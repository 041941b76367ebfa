//! The crate's module tree read from `src/`, and which file each named path lands in.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::source::{code_of, parse_tree, rust_files, tokens, Named, Token};

pub type ModPath = Vec<String>;

pub struct Module {
    pub file: PathBuf,
    children: BTreeSet<String>,
    /// `pub use` trees: the names this module hands on from elsewhere.
    reexports: Vec<Named>,
    /// Private `use` trees.
    imports: Vec<Named>,
    /// Paths named in code outside `use` statements.
    inline: Vec<Named>,
    /// Every identifier in the code outside `use` statements.
    idents: BTreeSet<String>,
}

pub struct Crate {
    pub modules: BTreeMap<ModPath, Module>,
}

/// `src/agent/run/mod.rs` → `["agent", "run"]`; `src/lib.rs` → `[]`.
pub fn mod_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || (parts.len() == 1 && (p == "lib" || p == "main")))
    {
        parts.pop();
    }
    parts
}

impl Crate {
    pub fn read(src: &Path) -> Crate {
        let mut modules = BTreeMap::new();
        for file in rust_files(src) {
            if file == src.join("main.rs") {
                continue;
            }
            let text = fs::read_to_string(&file).expect("a source file");
            modules.insert(mod_path(src, &file), Module::parse(file, &text));
        }
        Crate { modules }
    }

    /// Every file a module's code depends on, with the names that tie them.
    pub fn edges_of(&self, path: &ModPath) -> BTreeMap<PathBuf, BTreeSet<String>> {
        let module = &self.modules[path];
        let used_reexports = module
            .reexports
            .iter()
            .filter(|r| module.idents.contains(&r.alias));
        let mut out: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
        for named in module
            .imports
            .iter()
            .chain(&module.inline)
            .chain(used_reexports)
        {
            let Some(abs) = self.resolve(path, &named.segments, 0) else {
                continue;
            };
            if let Some(file) = self.file_of(&abs, 0) {
                if file != module.file {
                    let name = named.segments.last().cloned().unwrap_or_default();
                    out.entry(file).or_default().insert(name);
                }
            }
        }
        out
    }

    /// The absolute module path a path written in `module` stands for, if it is in the crate.
    fn resolve(&self, module: &ModPath, segments: &[String], depth: usize) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => module[..module.len().checked_sub(1)?].to_vec(),
            name if self.modules.get(module)?.children.contains(name) => {
                let mut child = module.clone();
                child.push(name.to_string());
                child
            }
            name => self.alias(module, name, depth)?,
        };
        let mut rest = rest;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module a `use` in `module` brought in under `name`.
    fn alias(&self, module: &ModPath, name: &str, depth: usize) -> Option<ModPath> {
        if depth > 8 {
            return None;
        }
        let m = self.modules.get(module)?;
        m.imports
            .iter()
            .chain(&m.reexports)
            .filter(|u| u.alias == name && u.segments.first().is_some_and(|s| s != name))
            .find_map(|u| {
                let abs = self.resolve(module, &u.segments, depth + 1)?;
                self.modules.contains_key(&abs).then_some(abs)
            })
    }

    /// The file that defines what `abs` names, following `pub use` re-exports.
    fn file_of(&self, abs: &ModPath, depth: usize) -> Option<PathBuf> {
        let at = (0..=abs.len())
            .rev()
            .find(|n| self.modules.contains_key(&abs[..*n]))?;
        let module = &self.modules[&abs[..at]];
        let Some(item) = abs.get(at) else {
            return Some(module.file.clone());
        };
        if depth < 8 {
            for r in &module.reexports {
                let through = if r.alias == *item {
                    self.resolve(&abs[..at].to_vec(), &r.segments, 0)
                } else if r.alias == "*" {
                    self.resolve(&abs[..at].to_vec(), &r.segments, 0)
                        .map(|mut p| {
                            p.push(item.clone());
                            p
                        })
                } else {
                    None
                };
                if let Some(file) = through.and_then(|p| self.file_of(&p, depth + 1)) {
                    return Some(file);
                }
            }
        }
        Some(module.file.clone())
    }
}

impl Module {
    fn parse(file: PathBuf, text: &str) -> Module {
        let toks = tokens(&code_of(text));
        let mut module = Module {
            file,
            children: BTreeSet::new(),
            reexports: Vec::new(),
            imports: Vec::new(),
            inline: Vec::new(),
            idents: BTreeSet::new(),
        };
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                Token::Ident(kw) if kw == "mod" => {
                    if let (Some(Token::Ident(name)), Some(Token::Semi)) =
                        (toks.get(i + 1), toks.get(i + 2))
                    {
                        module.children.insert(name.clone());
                    }
                    i += 1;
                }
                Token::Ident(kw) if kw == "use" => {
                    let list = if is_pub(&toks, i) {
                        &mut module.reexports
                    } else {
                        &mut module.imports
                    };
                    let start = if toks.get(i + 1) == Some(&Token::Path) {
                        i + 2
                    } else {
                        i + 1
                    };
                    i = parse_tree(&toks, start, &[], list);
                }
                Token::Ident(name) => {
                    let starts_path = toks.get(i + 1) == Some(&Token::Path)
                        && (i == 0 || toks[i - 1] != Token::Path);
                    module.idents.insert(name.clone());
                    if starts_path {
                        i = parse_tree(&toks, i, &[], &mut module.inline);
                    } else {
                        i += 1;
                    }
                }
                _ => i += 1,
            }
        }
        module
    }
}

/// Whether the `use` at `at` is a re-export: `pub use`, `pub(crate) use`, `pub(in …) use`.
fn is_pub(toks: &[Token], at: usize) -> bool {
    let before = &toks[at.saturating_sub(6)..at];
    let from = before
        .iter()
        .rposition(|t| matches!(t, Token::Semi | Token::Open | Token::Close))
        .map_or(0, |p| p + 1);
    before[from..]
        .iter()
        .any(|t| matches!(t, Token::Ident(s) if s == "pub"))
}
