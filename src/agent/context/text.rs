//! Small text helpers shared by the context renderers: caps with a visible marker, frontmatter.

/// Rules larger than this are cut, so one huge rule file cannot crowd out the conversation.
pub(crate) const MAX_RULE_CHARS: usize = 20_000;
/// One attached item (file, diff, log, document…) is cut at this many characters.
pub(crate) const MAX_ITEM_CHARS: usize = 60_000;
/// Everything attached to one user message together.
pub(crate) const MAX_TURN_CHARS: usize = 240_000;

pub const TRUNCATED: &str = "[truncated]";

/// `s` cut at `max` characters, with a visible marker when cut.
pub fn cap(s: &str, max: usize) -> String {
    crate::base::text::cut_chars(s, max, &format!("\n{TRUNCATED}"))
}

/// A rule file's body without its leading `---` YAML block.
pub(crate) fn strip_frontmatter(s: &str) -> &str {
    let t = s.trim_start_matches('\u{feff}');
    let Some(rest) = t.strip_prefix("---") else {
        return s;
    };
    let Some(rest) = rest
        .strip_prefix('\n')
        .or_else(|| rest.strip_prefix("\r\n"))
    else {
        return s;
    };
    match rest.find("\n---") {
        Some(end) => {
            let after = &rest[end + 4..];
            after.split_once('\n').map_or("", |(_, body)| body)
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_mark_the_cut() {
        assert_eq!(cap("abc", 3), "abc");
        assert_eq!(cap("abcdef", 3), "abc\n[truncated]");
        assert_eq!(cap("ééé", 2), "éé\n[truncated]");
    }

    #[test]
    fn frontmatter_is_stripped() {
        assert_eq!(strip_frontmatter("---\nglobs: *.py\n---\nbody\n"), "body\n");
        assert_eq!(strip_frontmatter("no header"), "no header");
        assert_eq!(strip_frontmatter("---\nunterminated"), "---\nunterminated");
    }
}
