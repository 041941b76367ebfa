//! A unified line diff, for `setup cursor --dry-run`.

/// Lines kept around each change.
const CONTEXT: usize = 2;
/// Beyond this many line pairs the middle is shown as one replaced block instead of an LCS.
const MAX_CELLS: usize = 4_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Del,
    Add,
}

/// `--- old_name` / `+++ new_name` and `@@` hunks; empty when the texts are equal.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = line_ops(&a, &b);
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    // Walk the script, emitting hunks of changes with CONTEXT lines either side.
    let (mut ai, mut bi) = (0usize, 0usize);
    let mut i = 0;
    while i < ops.len() {
        if ops[i] == Op::Same {
            ai += 1;
            bi += 1;
            i += 1;
            continue;
        }
        let lead = (0..i)
            .rev()
            .take_while(|&k| ops[k] == Op::Same)
            .count()
            .min(CONTEXT);
        let mut end = i;
        loop {
            while end < ops.len() && ops[end] != Op::Same {
                end += 1;
            }
            let same = (end..ops.len()).take_while(|&k| ops[k] == Op::Same).count();
            if end + same < ops.len() && same <= 2 * CONTEXT {
                end += same;
                continue;
            }
            break;
        }
        let trail = (end..ops.len())
            .take_while(|&k| ops[k] == Op::Same)
            .count()
            .min(CONTEXT);
        let (a0, b0) = (ai - lead, bi - lead);
        let mut body = String::new();
        let (mut x, mut y) = (a0, b0);
        for op in &ops[i - lead..end + trail] {
            match op {
                Op::Same => {
                    body.push_str(&format!(" {}\n", a[x]));
                    x += 1;
                    y += 1;
                }
                Op::Del => {
                    body.push_str(&format!("-{}\n", a[x]));
                    x += 1;
                }
                Op::Add => {
                    body.push_str(&format!("+{}\n", b[y]));
                    y += 1;
                }
            }
        }
        out.push_str(&format!(
            "@@ -{},{} +{},{} @@\n{body}",
            a0 + 1,
            x - a0,
            b0 + 1,
            y - b0
        ));
        ai = x - trail;
        bi = y - trail;
        i = end;
    }
    out
}

/// An edit script turning `a` into `b`: common prefix and suffix, LCS in between.
fn line_ops(a: &[&str], b: &[&str]) -> Vec<Op> {
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let mut ops = vec![Op::Same; pre];
    if am.len().saturating_mul(bm.len()) > MAX_CELLS {
        ops.extend(std::iter::repeat_n(Op::Del, am.len()));
        ops.extend(std::iter::repeat_n(Op::Add, bm.len()));
    } else {
        // lcs[i][j]: LCS length of am[i..] and bm[j..].
        let w = bm.len() + 1;
        let mut lcs = vec![0u32; (am.len() + 1) * w];
        for i in (0..am.len()).rev() {
            for j in (0..bm.len()).rev() {
                lcs[i * w + j] = if am[i] == bm[j] {
                    lcs[(i + 1) * w + j + 1] + 1
                } else {
                    lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < am.len() || j < bm.len() {
            if i < am.len() && j < bm.len() && am[i] == bm[j] {
                ops.push(Op::Same);
                i += 1;
                j += 1;
            } else if i < am.len() && (j == bm.len() || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1])
            {
                // Deletions first, as `diff` shows a replaced line.
                ops.push(Op::Del);
                i += 1;
            } else {
                ops.push(Op::Add);
                j += 1;
            }
        }
    }
    ops.extend(std::iter::repeat_n(Op::Same, suf));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_changes_with_context() {
        let old = "{\n  \"a\": 1,\n  \"b\": 2,\n  \"c\": 3,\n  \"d\": 4,\n  \"e\": 5,\n  \"f\": 6,\n  \"x\": 0,\n  \"g\": 7\n}\n";
        let new = old
            .replace("\"b\": 2", "\"b\": 20")
            .replace("  \"g\": 7\n", "  \"g\": 7,\n  \"h\": 8\n");
        let d = unified(old, &new, "a", "b");
        assert_eq!(
            d,
            "--- a\n+++ b\n@@ -1,5 +1,5 @@\n {\n   \"a\": 1,\n-  \"b\": 2,\n+  \"b\": 20,\n   \"c\": 3,\n   \"d\": 4,\n@@ -7,4 +7,5 @@\n   \"f\": 6,\n   \"x\": 0,\n-  \"g\": 7\n+  \"g\": 7,\n+  \"h\": 8\n }\n"
        );
        let near = old.replace("\"d\": 4", "\"d\": 40");
        assert_eq!(unified(&new, &near, "a", "b").matches("@@ -").count(), 1);
        assert_eq!(unified(old, old, "a", "b"), "");
        assert!(unified("", "x\n", "a", "b").contains("+x"));
    }
}
