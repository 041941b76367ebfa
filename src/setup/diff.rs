//! A unified line diff, for `setup cursor --dry-run`.

/// Lines kept around each change.
const CONTEXT: usize = 2;

/// `--- old_name` / `+++ new_name` and `@@` hunks; empty when the texts are equal.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    crate::base::text::line_diff(old, new, old_name, new_name, CONTEXT).unified
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

    #[test]
    fn large_files_get_a_real_diff() {
        // Past the old LCS table's cap the middle was shown as one replaced block.
        let old: String = (0..2500).map(|i| format!("\"k{i}\": {i},\n")).collect();
        let new = old
            .replace("\"k1\": 1,", "\"k1\": 10,")
            .replace("\"k2498\": 2498,", "\"k2498\": 0,");
        let d = unified(&old, &new, "a", "b");
        assert_eq!(d.matches("@@ -").count(), 2, "{d}");
        let body = || d.lines().skip(2);
        assert_eq!(body().filter(|l| l.starts_with('-')).count(), 2, "{d}");
        assert_eq!(body().filter(|l| l.starts_with('+')).count(), 2, "{d}");
    }
}
