//! The report's room for hostile text: escaping it for Markdown, quoting values, clipping.

use serde_json::Value;

/// Whether a character is invisible or reorders the text around it: Unicode's format
/// characters (general category Cf: the bidi embeddings, overrides and isolates U+202A–U+202E
/// and U+2066–U+2069, the zero-width characters and marks U+200B–U+200F, U+2060–U+2064, the
/// soft hyphen, the byte-order mark, the tag characters U+E0000–U+E007F, ...) and the line and
/// paragraph separators U+2028 and U+2029. Such a character in chart, pull-request,
/// release-notes or model text could make a reader see other words than the bytes hold.
///
/// Also every default-ignorable code point (Unicode's `Default_Ignorable_Code_Point`, which
/// renders as nothing: the combining grapheme joiner, the Hangul fillers, the variation
/// selectors, which can carry hidden bytes, ...) and the Braille blank U+2800, which renders
/// as a space that is not one.
pub fn invisible(c: char) -> bool {
    use unicode_general_category::{GeneralCategory, get_general_category};
    matches!(
        get_general_category(c),
        GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    ) || matches!(
        u32::from(c),
        0x00AD
            | 0x034F
            | 0x061C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x2800
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// An invisible character as a reader sees it: `\u{202E}`.
pub fn shown(c: char) -> String {
    format!("\\u{{{:04X}}}", u32::from(c))
}

/// `s` with every invisible character shown (`shown`): the one rule the report's text, its
/// machine blocks (as JSON escapes there) and Bosun's comments apply.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(invisible) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if invisible(c) {
                    shown(c)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// Text a chart or a repository controls, made safe for Markdown: no HTML, no comments, one
/// line (a line break shows as `␤`, so nothing can start a heading, a list or a block), the
/// characters that open emphasis, code, links, images, tables or autolinks escaped, and
/// invisible characters shown (`\u{202E}`).
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('␤');
                }
            }
            '\n' => out.push('␤'),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '#' => {
                out.push('\\');
                out.push(c);
            }
            // `scheme://`, `www.` and `user@host` are autolinks on GitHub: break them.
            ':' if chars.peek() == Some(&'/') => out.push_str("\\:"),
            '.' if out.ends_with("www") || out.ends_with("WWW") => out.push_str("\\."),
            '@' => out.push_str("\\@"),
            c if invisible(c) => out.push_str(&shown(c)),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A code span when the text is plain, escaped text otherwise.
pub fn code(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:@+=,-[]\" ".contains(c))
        && !s.contains('`')
    {
        format!("`{s}`")
    } else {
        text(s)
    }
}

/// A value as the report quotes it: the start of its JSON text (every caller clips it to a
/// few dozen characters, so a 40 KB CRD version is never serialised whole).
pub(super) fn value_text(value: &Option<Value>) -> String {
    const LIMIT: usize = 1024;
    struct Bounded(Vec<u8>);
    impl std::io::Write for Bounded {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0.len() >= LIMIT {
                return Err(std::io::Error::other("enough"));
            }
            let n = buf.len().min(LIMIT - self.0.len());
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    match value {
        None => "(absent)".to_string(),
        Some(Value::String(s)) => s.chars().take(LIMIT).collect(),
        Some(other) => {
            let mut out = Bounded(Vec::new());
            let _ = serde_json::to_writer(&mut out, other);
            String::from_utf8_lossy(&out.0).into_owned()
        }
    }
}
