//! Text shaping every room shares: cuts that say they cut, and a unified line diff.

use similar::{capture_diff_slices, group_diff_ops, Algorithm, ChangeTag, DiffOp};

/// The first `max` characters of `s`, followed by `marker` when anything was cut.
pub fn cut_chars(s: &str, max: usize, marker: &str) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}{marker}", &s[..at]),
        None => s.to_string(),
    }
}

/// At most `max` bytes of the start of `s` (backed up to a char boundary), followed by
/// `marker` when anything was cut.
pub fn cut_bytes(s: &str, max: usize, marker: &str) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}{marker}", &s[..floor_char_boundary(s, max)])
}

/// The last `max` characters of `s`, preceded by `marker` when anything was cut.
pub fn tail_chars(s: &str, max: usize, marker: &str) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    match s.char_indices().nth(n - max) {
        Some((at, _)) => format!("{marker}{}", &s[at..]),
        None => s.to_string(),
    }
}

/// The largest char boundary of `s` at or below `i`.
pub fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest char boundary of `s` at or above `i`.
pub fn ceil_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// What changed between two texts, line by line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineDiff {
    pub added: usize,
    pub removed: usize,
    /// `--- old` / `+++ new` and `@@` hunks with `context` lines around each change; empty
    /// when the texts are equal.
    pub unified: String,
}

/// Lines with their terminators, so that a missing final newline is a difference.
pub fn lines(s: &str) -> Vec<&str> {
    s.split_inclusive('\n').collect()
}

/// A unified diff of `before` and `after`, as `diff -u` prints it.
pub fn line_diff(
    before: &str,
    after: &str,
    old_name: &str,
    new_name: &str,
    context: usize,
) -> LineDiff {
    let (a, b) = (lines(before), lines(after));
    // Myers' diff in linear space, with similar's bound on the work for hard inputs.
    let ops = capture_diff_slices(Algorithm::Myers, &a, &b);
    let (mut added, mut removed) = (0, 0);
    for op in &ops {
        match op {
            DiffOp::Equal { .. } => {}
            DiffOp::Delete { old_len, .. } => removed += old_len,
            DiffOp::Insert { new_len, .. } => added += new_len,
            DiffOp::Replace {
                old_len, new_len, ..
            } => {
                removed += old_len;
                added += new_len;
            }
        }
    }
    let hunks = group_diff_ops(ops, context);
    let mut unified = String::new();
    if !hunks.is_empty() {
        unified.push_str(&format!("--- {old_name}\n+++ {new_name}\n"));
    }
    for hunk in &hunks {
        let (Some(first), Some(last)) = (hunk.first(), hunk.last()) else {
            continue;
        };
        let old = first.old_range().start..last.old_range().end;
        let new = first.new_range().start..last.new_range().end;
        // 1-based starts; an empty side names the line before it (0 at the top), as diff does.
        let start = |r: &std::ops::Range<usize>| r.start + usize::from(!r.is_empty());
        unified.push_str(&format!(
            "@@ -{},{} +{},{} @@\n",
            start(&old),
            old.len(),
            start(&new),
            new.len()
        ));
        for change in hunk.iter().flat_map(|op| op.iter_changes(&a, &b)) {
            unified.push(match change.tag() {
                ChangeTag::Equal => ' ',
                ChangeTag::Delete => '-',
                ChangeTag::Insert => '+',
            });
            let line = change.value();
            unified.push_str(line);
            if !line.ends_with('\n') {
                unified.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    LineDiff {
        added,
        removed,
        unified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_say_they_cut_and_keep_whole_characters() {
        assert_eq!(cut_chars("abc", 3, "…"), "abc");
        assert_eq!(cut_chars("ééé", 2, "\n[truncated]"), "éé\n[truncated]");
        assert_eq!(cut_bytes("ééé", 3, "…"), "é…");
        assert_eq!(cut_bytes("abc", 3, "…"), "abc");
        assert_eq!(tail_chars("abcdé", 2, "[cut]"), "[cut]dé");
        assert_eq!(tail_chars("ab", 2, "[cut]"), "ab");
    }

    #[test]
    fn char_boundaries_round_the_right_way() {
        let s = "aéb";
        assert_eq!(
            (floor_char_boundary(s, 2), ceil_char_boundary(s, 2)),
            (1, 3)
        );
        assert_eq!(
            (floor_char_boundary(s, 99), ceil_char_boundary(s, 99)),
            (4, 4)
        );
    }

    #[test]
    fn a_diff_counts_lines_and_marks_a_missing_final_newline() {
        let d = line_diff("a\nb", "a\nc", "x", "y", 3);
        assert_eq!((d.added, d.removed), (1, 1));
        assert_eq!(
            d.unified,
            "--- x\n+++ y\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
        );
        assert_eq!(line_diff("same\n", "same\n", "x", "y", 3).unified, "");
        let created = line_diff("", "new\n", "x", "y", 3);
        assert!(created.unified.contains("@@ -0,0 +1,1 @@"));
    }
}
