//! Text shaping shared by the tools: size caps for what goes to the model and the UI.

use crate::base::text::{ceil_char_boundary, floor_char_boundary};

/// Keep the head and the tail of `s` within about `max` bytes, with a marker saying how much
/// was cut. Command output matters most at both ends (what ran, how it ended).
pub(crate) fn cap_middle(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let head_end = floor_char_boundary(s, max / 2);
    let tail_start = ceil_char_boundary(s, s.len() - max / 2);
    let elided = tail_start.saturating_sub(head_end);
    format!(
        "{}\n[... {elided} bytes elided ...]\n{}",
        &s[..head_end],
        &s[tail_start..]
    )
}

/// Keep at most `max` bytes of the start of `s` (on a line boundary when one is near).
/// Returns the kept text and whether anything was cut.
pub(crate) fn cap_head(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s.to_string(), false);
    }
    let end = floor_char_boundary(s, max);
    // Cutting mid-line leaves a misleading last line; back up to the last newline if it is close.
    let end = match s[..end].rfind('\n') {
        Some(nl) if nl + 1 >= end / 2 => nl + 1,
        _ => end,
    };
    (s[..end].to_string(), true)
}

/// The last component of a path written with `/` or `\`.
pub(crate) fn basename(path: &str) -> &str {
    let trimmed = path.trim_end_matches(['/', '\\']);
    trimmed.rsplit(['/', '\\']).next().unwrap_or(trimmed)
}

/// Saturating conversions for protobuf integer fields.
pub(crate) fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(crate) fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_middle_keeps_both_ends() {
        let s = format!("{}{}", "a".repeat(100), "b".repeat(100));
        let c = cap_middle(&s, 50);
        assert!(c.starts_with(&"a".repeat(25)));
        assert!(c.ends_with(&"b".repeat(25)));
        assert!(c.contains("[... 150 bytes elided ...]"));
        assert_eq!(cap_middle("short", 50), "short");
    }

    #[test]
    fn caps_respect_char_boundaries() {
        let s = "é".repeat(100);
        let c = cap_middle(&s, 51);
        assert!(c.contains("elided"));
        let (h, cut) = cap_head(&s, 51);
        assert!(cut && h.len() <= 51);
    }

    #[test]
    fn cap_head_prefers_line_boundaries() {
        let s = "line one\nline two\nline three\n";
        let (h, cut) = cap_head(s, 22);
        assert!(cut);
        assert_eq!(h, "line one\nline two\n");
    }

    #[test]
    fn basename_handles_both_separators() {
        assert_eq!(basename("/a/b/c.rs"), "c.rs");
        assert_eq!(basename("C:\\x\\y\\"), "y");
        assert_eq!(basename("plain"), "plain");
    }
}
