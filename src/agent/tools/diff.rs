//! Line diffs for edits: added/removed counts and a unified diff for Cursor's edit view, and
//! the changed region of an edit for rebuilding history.

/// Lines of context around each hunk.
const CONTEXT: usize = 3;
/// Above this many cells the LCS table is skipped and the changed middle counts as replaced.
const MAX_LCS_CELLS: usize = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiffSummary {
    pub added: usize,
    pub removed: usize,
    pub unified: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Line `i` of before equals line `j` of after.
    Equal(usize, usize),
    Delete(usize),
    Insert(usize),
}

/// Lines with their terminators, so that a missing final newline is a difference.
fn lines(s: &str) -> Vec<&str> {
    s.split_inclusive('\n').collect()
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

fn ops(a: &[&str], b: &[&str]) -> Vec<Op> {
    let (p, s) = common_ends(a, b);
    let (am, bm) = (&a[p..a.len() - s], &b[p..b.len() - s]);
    let mut out: Vec<Op> = (0..p).map(|i| Op::Equal(i, i)).collect();
    let (n, m) = (am.len(), bm.len());
    if n.saturating_mul(m) <= MAX_LCS_CELLS && n > 0 && m > 0 {
        // lcs[i][j] = LCS length of am[i..] and bm[j..].
        let mut lcs = vec![0u32; (n + 1) * (m + 1)];
        let at = |i: usize, j: usize| i * (m + 1) + j;
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[at(i, j)] = if am[i] == bm[j] {
                    lcs[at(i + 1, j + 1)] + 1
                } else {
                    lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if am[i] == bm[j] {
                out.push(Op::Equal(p + i, p + j));
                i += 1;
                j += 1;
            } else if lcs[at(i + 1, j)] >= lcs[at(i, j + 1)] {
                out.push(Op::Delete(p + i));
                i += 1;
            } else {
                out.push(Op::Insert(p + j));
                j += 1;
            }
        }
        out.extend((i..n).map(|i| Op::Delete(p + i)));
        out.extend((j..m).map(|j| Op::Insert(p + j)));
    } else {
        out.extend((0..n).map(|i| Op::Delete(p + i)));
        out.extend((0..m).map(|j| Op::Insert(p + j)));
    }
    out.extend((0..s).map(|k| Op::Equal(a.len() - s + k, b.len() - s + k)));
    out
}

/// Counts and a unified diff (`--- a/<path>` / `+++ b/<path>`, 3 lines of context).
pub(crate) fn summary(before: &str, after: &str, path: &str) -> DiffSummary {
    let (a, b) = (lines(before), lines(after));
    let ops = ops(&a, &b);
    let added = ops.iter().filter(|o| matches!(o, Op::Insert(_))).count();
    let removed = ops.iter().filter(|o| matches!(o, Op::Delete(_))).count();
    let changes: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Op::Equal(..)))
        .map(|(k, _)| k)
        .collect();
    let mut unified = String::new();
    if changes.is_empty() {
        return DiffSummary {
            added,
            removed,
            unified,
        };
    }
    let path = path.trim_start_matches('/');
    unified.push_str(&format!("--- a/{path}\n+++ b/{path}\n"));
    // Group changes whose gap of equal lines is small enough to share context.
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &k in &changes {
        match groups.last_mut() {
            Some((_, end)) if k - *end <= 2 * CONTEXT + 1 => *end = k,
            _ => groups.push((k, k)),
        }
    }
    for (first, last) in groups {
        let lo = first.saturating_sub(CONTEXT);
        let hi = (last + CONTEXT).min(ops.len() - 1);
        let hunk = &ops[lo..=hi];
        // Start lines: the first before/after line the hunk touches (1-based; 0 when empty).
        let a_start = hunk.iter().find_map(|o| match o {
            Op::Equal(i, _) | Op::Delete(i) => Some(*i),
            Op::Insert(_) => None,
        });
        let b_start = hunk.iter().find_map(|o| match o {
            Op::Equal(_, j) | Op::Insert(j) => Some(*j),
            Op::Delete(_) => None,
        });
        let a_len = hunk.iter().filter(|o| !matches!(o, Op::Insert(_))).count();
        let b_len = hunk.iter().filter(|o| !matches!(o, Op::Delete(_))).count();
        let start = |s: Option<usize>, len: usize, other: &[Op], before: bool| match s {
            Some(i) => i + 1,
            // An empty side starts after the line preceding the hunk.
            None if len == 0 => other
                .iter()
                .rev()
                .find_map(|o| match (o, before) {
                    (Op::Equal(i, _) | Op::Delete(i), true) => Some(*i + 1),
                    (Op::Equal(_, j) | Op::Insert(j), false) => Some(*j + 1),
                    _ => None,
                })
                .unwrap_or(0),
            None => 0,
        };
        let a_line = start(a_start, a_len, &ops[..lo], true);
        let b_line = start(b_start, b_len, &ops[..lo], false);
        unified.push_str(&format!("@@ -{a_line},{a_len} +{b_line},{b_len} @@\n"));
        for o in hunk {
            let (mark, line) = match *o {
                Op::Equal(i, _) => (' ', a[i]),
                Op::Delete(i) => ('-', a[i]),
                Op::Insert(j) => ('+', b[j]),
            };
            unified.push(mark);
            unified.push_str(line);
            if !line.ends_with('\n') {
                unified.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    DiffSummary {
        added,
        removed,
        unified,
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
}
