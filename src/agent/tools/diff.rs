//! Line diffs for edits: added/removed counts and a unified diff for Cursor's edit view, and
//! the changed region of an edit for rebuilding history.

use crate::base::text::{line_diff, lines};

/// Lines of context around each hunk.
const CONTEXT: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiffSummary {
    pub added: usize,
    pub removed: usize,
    pub unified: String,
}

/// Lines shared at the start and at the end (not overlapping).
fn common_ends(a: &[&str], b: &[&str]) -> (usize, usize) {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (prefix, suffix)
}

/// Counts and a unified diff (`--- a/<path>` / `+++ b/<path>`, 3 lines of context).
pub(crate) fn summary(before: &str, after: &str, path: &str) -> DiffSummary {
    let path = path.trim_start_matches('/');
    let d = line_diff(
        before,
        after,
        &format!("a/{path}"),
        &format!("b/{path}"),
        CONTEXT,
    );
    DiffSummary {
        added: d.added,
        removed: d.removed,
        unified: d.unified,
    }
}

/// The smallest line-aligned region that differs: `(old, new)` such that replacing `old` by
/// `new` in `before` gives `after`.
pub(crate) fn changed_region(before: &str, after: &str) -> (String, String) {
    let (a, b) = (lines(before), lines(after));
    let (p, s) = common_ends(&a, &b);
    (a[p..a.len() - s].concat(), b[p..b.len() - s].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_change() {
        let d = summary("a\nb\nc\n", "a\nB\nc\n", "/w/x.txt");
        assert_eq!((d.added, d.removed), (1, 1));
        assert_eq!(
            d.unified,
            "--- a/w/x.txt\n+++ b/w/x.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
        );
    }

    #[test]
    fn distant_changes_make_separate_hunks() {
        let before: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let after: String = (1..=20)
            .map(|i| match i {
                2 => "two\n".to_string(),
                19 => "nineteen\n".to_string(),
                _ => format!("{i}\n"),
            })
            .collect();
        let d = summary(&before, &after, "f");
        assert_eq!((d.added, d.removed), (2, 2));
        assert_eq!(d.unified.matches("@@ -").count(), 2, "{}", d.unified);
        assert!(d.unified.contains("@@ -1,5 +1,5 @@"), "{}", d.unified);
        assert!(d.unified.contains("@@ -16,5 +16,5 @@"), "{}", d.unified);
    }

    #[test]
    fn creation_and_missing_newline() {
        let d = summary("", "x\ny", "f");
        assert_eq!((d.added, d.removed), (2, 0));
        assert!(
            d.unified
                .contains("@@ -0,0 +1,2 @@\n+x\n+y\n\\ No newline at end of file\n"),
            "{}",
            d.unified
        );
        assert_eq!(summary("same\n", "same\n", "f").unified, "");
    }

    #[test]
    fn insertion_in_the_middle() {
        let d = summary("a\nb\n", "a\nnew\nb\n", "f");
        assert_eq!((d.added, d.removed), (1, 0));
        assert!(
            d.unified.contains("@@ -1,2 +1,3 @@\n a\n+new\n b\n"),
            "{}",
            d.unified
        );
    }

    #[test]
    fn changed_region_is_line_aligned() {
        assert_eq!(
            changed_region("a\nb\nc\n", "a\nB\nc\n"),
            ("b\n".into(), "B\n".into())
        );
        assert_eq!(changed_region("", "new\n"), (String::new(), "new\n".into()));
        assert_eq!(
            changed_region("x\n", "x\ny\n"),
            (String::new(), "y\n".into())
        );
    }

    #[test]
    fn large_files_get_a_real_diff() {
        // 3,000 lines changed at both ends: only the two changed lines are replaced, never the
        // unchanged middle.
        let before: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let after = before
            .replace("line 1\n", "line one\n")
            .replace("line 2998\n", "line 2998 changed\n");
        let d = summary(&before, &after, "big");
        assert_eq!((d.added, d.removed), (2, 2), "{}", d.unified);
        assert_eq!(d.unified.matches("@@ -").count(), 2, "{}", d.unified);
        assert!(d.unified.contains("@@ -2996,5 +2996,5 @@"), "{}", d.unified);
    }
}
