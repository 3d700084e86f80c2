//! Text from a lock store or the command line made safe to print on a terminal.
//!
//! Lock names, labels and hosts are chosen by whoever takes a lock, so they may hold escape
//! sequences (`\e]0;…\a` retitles a window, `\e[2J` clears the screen) or bidirectional
//! overrides that reorder what a reader sees. Human output shows such characters escaped;
//! JSON output keeps the exact strings (serde escapes control characters itself).

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character and bidirectional formatting character escaped
/// (`\u{1b}`, `\n`, `\u{202e}`), or borrowed unchanged when it has none.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn escape_sequences_and_overrides_are_shown_escaped() {
        assert_eq!(shown("orders/42"), "orders/42");
        assert_eq!(shown("a\u{1b}]0;pwned\u{7}b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(shown("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(shown("x\ny\r"), "x\\ny\\r");
        assert_eq!(shown("evil\u{202e}txt"), "evil\\u{202e}txt");
        assert_eq!(shown("café ✓"), "café ✓");
    }
}
