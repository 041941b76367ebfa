//! Cursor's rule globs (`*.py`, `src/**/*.ts`, `{a,b}.md`) matched against workspace paths.
//! A pattern without `/` matches the file name at any depth, as Cursor applies them.
//!
//! The globs are compiled once into a [`globset::GlobSet`] (automata: matching is linear in
//! the path, whatever the pattern), since a rule's globs are checked for every touched path.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// One rule's globs, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Globs(GlobSet);

impl Globs {
    /// Compiles `globs`; an entry may list several, comma-separated. A glob that does not
    /// compile (an unclosed `[`) matches nothing, and is logged.
    pub fn new(globs: &[String]) -> Globs {
        let mut set = GlobSetBuilder::new();
        for g in globs
            .iter()
            .flat_map(|g| top_level_alternatives(g))
            .map(str::trim)
            .map(|g| g.trim_start_matches("./").trim_start_matches('/'))
            .filter(|g| !g.is_empty())
        {
            let pattern = if g.contains('/') {
                g.to_string()
            } else {
                format!("**/{g}")
            };
            match GlobBuilder::new(&pattern).literal_separator(true).build() {
                Ok(glob) => {
                    set.add(glob);
                }
                Err(e) => tracing::debug!(glob = g, error = %e, "rule glob ignored"),
            }
        }
        // Building a set of globs that each compiled only fails past regex size limits; then
        // the rule matches nothing rather than everything.
        Globs(set.build().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "rule globs ignored");
            GlobSet::empty()
        }))
    }

    /// Whether `path` (workspace-relative, `/`-separated) matches any of the globs.
    pub fn matches(&self, path: &str) -> bool {
        let path = path.trim_start_matches("./").trim_start_matches('/');
        self.0.is_match(path)
    }
}

/// `a, b` lists several globs in one entry; commas inside `{…}` belong to the glob.
fn top_level_alternatives(g: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in g.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&g[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&g[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(glob: &str, path: &str) -> bool {
        Globs::new(&[glob.to_string()]).matches(path)
    }

    #[test]
    fn cursor_rule_globs() {
        assert!(m("*.py", "main.py"));
        assert!(m("*.py", "src/deep/main.py"));
        assert!(!m("*.py", "main.rs"));
        assert!(m("src/**/*.ts", "src/a/b/c.ts"));
        assert!(m("src/**/*.ts", "src/c.ts"));
        assert!(!m("src/**/*.ts", "lib/c.ts"));
        assert!(m("**/*.{md,mdc}", "docs/x.mdc"));
        assert!(m("*.rs, *.py", "a.py"));
        assert!(m("test_?.py", "test_1.py"));
        assert!(!m("test_?.py", "test_12.py"));
        assert!(m("./src/*.rs", "./src/a.rs"));
        assert!(!m("src/*.rs", "src/a/b.rs"), "`*` stays within a segment");
        assert!(
            !m("[oops", "[oops"),
            "a glob that does not compile matches nothing"
        );
    }

    #[test]
    fn a_pathological_glob_is_linear() {
        // A backtracking matcher tries every split of the name for each `*`: on this name it
        // would run for ages. Compiled automata answer at once.
        let glob = "*a*a*a*a*a*a*a*a*a*a*b";
        let name = "a".repeat(5000);
        let path = format!("src/{name}");
        assert!(!m(glob, &path));
        assert!(m(glob, &format!("{path}b")));
        let globs = Globs::new(&[glob.to_string()]);
        for _ in 0..100 {
            assert!(!globs.matches(&path));
        }
    }
}
