//! Cursor's rule globs (`*.py`, `src/**/*.ts`, `{a,b}.md`) matched against workspace paths.
//! A pattern without `/` matches the file name at any depth, as Cursor applies them.

/// Whether `path` (workspace-relative, `/`-separated) matches any of `globs`.
pub fn matches_any(globs: &[String], path: &str) -> bool {
    globs
        .iter()
        .flat_map(|g| top_level_alternatives(g))
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .any(|g| matches(g, path))
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

fn matches(glob: &str, path: &str) -> bool {
    let path = path.trim_start_matches("./");
    let glob = glob.trim_start_matches("./");
    if !glob.contains('/') {
        let name = path.rsplit('/').next().unwrap_or(path);
        return expand(glob)
            .iter()
            .any(|g| segment(g.as_bytes(), name.as_bytes()));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    expand(glob).iter().any(|g| {
        let pat: Vec<&str> = g.split('/').filter(|p| !p.is_empty()).collect();
        segments(&pat, &parts)
    })
}

/// `{a,b}` alternatives, expanded (one level deep is what rule files use).
fn expand(glob: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (glob.find('{'), glob.find('}')) else {
        return vec![glob.to_string()];
    };
    if close < open {
        return vec![glob.to_string()];
    }
    glob[open + 1..close]
        .split(',')
        .map(|alt| format!("{}{alt}{}", &glob[..open], &glob[close + 1..]))
        .collect()
}

fn segments(pat: &[&str], parts: &[&str]) -> bool {
    match pat.split_first() {
        None => parts.is_empty(),
        Some((&"**", rest)) => (0..=parts.len()).any(|i| segments(rest, &parts[i..])),
        Some((p, rest)) => match parts.split_first() {
            Some((first, tail)) => segment(p.as_bytes(), first.as_bytes()) && segments(rest, tail),
            None => false,
        },
    }
}

/// One path segment: `*` any run, `?` one character.
fn segment(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| segment(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && segment(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && segment(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(glob: &str, path: &str) -> bool {
        matches_any(&[glob.to_string()], path)
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
    }
}
