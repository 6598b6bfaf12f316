//! STOMP 1.1 / 1.2 header escaping, and the short quotes of peer input in error details.

use std::borrow::Cow;
use std::fmt::Write;

use super::frame::{FrameError, Version};

/// Append `text` escaped as `version` (1.1 or 1.2) requires: `\\`, LF and `:` always,
/// CR in 1.2 only.
pub fn escape_into(text: &str, version: Version, out: &mut Vec<u8>) {
    let bytes = text.as_bytes();
    let mut start = 0;
    for (at, &octet) in bytes.iter().enumerate() {
        let escaped: &[u8] = match octet {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b':' => b"\\c",
            b'\r' if version == Version::V12 => b"\\r",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..at]);
        out.extend_from_slice(escaped);
        start = at + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Whether `text` holds an octet that [`escape_into`] rewrites.
pub fn needs_escape(text: &str, version: Version) -> bool {
    text.bytes().any(|octet| {
        matches!(octet, b'\\' | b'\n' | b':') || (octet == b'\r' && version == Version::V12)
    })
}

/// Undo STOMP 1.1 / 1.2 header escaping; an undefined escape is a FrameError.
pub fn unescape(text: &str, version: Version) -> Result<Cow<'_, str>, FrameError> {
    let Some(first) = text.find('\\') else {
        return Ok(Cow::Borrowed(text));
    };
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut at = first;
    loop {
        // bytes[at] is a backslash
        let replacement = match bytes.get(at + 1) {
            Some(b'n') => '\n',
            Some(b'c') => ':',
            Some(b'\\') => '\\',
            Some(b'r') if version == Version::V12 => '\r',
            _ => {
                let end = text[at + 1..].chars().next().map_or(at + 1, |c| at + 1 + c.len_utf8());
                return Err(FrameError::new("bad header escape", short_str(&text[at..end])));
            }
        };
        out.push(replacement);
        let start = at + 2;
        match text[start..].find('\\') {
            Some(next) => {
                out.push_str(&text[start..start + next]);
                at = start + next;
            }
            None => {
                out.push_str(&text[start..]);
                return Ok(Cow::Owned(out));
            }
        }
    }
}

const SHORT: usize = 40;

/// Python's `repr()` of the first 40 characters of `text`, and "..." when it was longer:
/// how error details quote peer input.
pub fn short_str(text: &str) -> String {
    let mut chars = text.char_indices();
    let cut = chars.nth(SHORT).map(|(at, _)| at);
    let head = &text[..cut.unwrap_or(text.len())];
    let mut out = repr_str(head);
    if cut.is_some() {
        out.push_str("...");
    }
    out
}

/// Python's `repr()` of the first 40 octets of `data`, and "..." when it was longer.
pub fn short_bytes(data: &[u8]) -> String {
    let head = &data[..data.len().min(SHORT)];
    let mut out = repr_bytes(head);
    if data.len() > SHORT {
        out.push_str("...");
    }
    out
}

fn quote_of(has_single: bool, has_double: bool) -> char {
    if has_single && !has_double {
        '"'
    } else {
        '\''
    }
}

fn printable(c: char) -> bool {
    // Python's str.isprintable(), for the characters peers plausibly send: controls,
    // separators other than the space, format characters and surrogates are not.
    let code = c as u32;
    !(code < 0x20
        || (0x7f..=0xa0).contains(&code)
        || code == 0xad
        || (0x2000..=0x200f).contains(&code)
        || (0x2028..=0x202f).contains(&code)
        || (0x205f..=0x206f).contains(&code)
        || code == 0x3000
        || code == 0xfeff
        || (0xfff9..=0xfffb).contains(&code)
        || (0xe000..=0xf8ff).contains(&code)
        || code >= 0xf0000)
}

pub fn repr_str(text: &str) -> String {
    let quote = quote_of(text.contains('\''), text.contains('"'));
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xff => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(quote);
    out
}

pub fn repr_bytes(data: &[u8]) -> String {
    let quote = quote_of(data.contains(&b'\''), data.contains(&b'"'));
    let mut out = String::with_capacity(data.len() + 3);
    out.push('b');
    out.push(quote);
    for &octet in data {
        match octet {
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            o if o as char == quote => {
                out.push('\\');
                out.push(quote);
            }
            0x20..=0x7e => out.push(octet as char),
            _ => {
                let _ = write!(out, "\\x{octet:02x}");
            }
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_per_version() {
        let mut out = Vec::new();
        escape_into("a:b\n1\r2\\", Version::V12, &mut out);
        assert_eq!(out, b"a\\cb\\n1\\r2\\\\");
        out.clear();
        escape_into("a:b\n1\r2\\", Version::V11, &mut out);
        assert_eq!(out, b"a\\cb\\n1\r2\\\\");
    }

    #[test]
    fn unescapes_and_refuses_undefined_escapes() {
        assert_eq!(unescape("1\\r2\\n3\\c4\\\\5\\\\n", Version::V12).unwrap(), "1\r2\n3:4\\5\\n");
        assert_eq!(unescape("plain", Version::V11).unwrap(), "plain");
        for bad in ["\\t", "x\\", "\\", "a\\\\\\", "\\C", "\\\\\\x"] {
            assert_eq!(unescape(bad, Version::V12).unwrap_err().reason, "bad header escape");
        }
        assert_eq!(unescape("\\r", Version::V11).unwrap_err().detail, "'\\\\r'");
        assert_eq!(unescape("a\\\u{e9}", Version::V11).unwrap_err().detail, "'\\\\\u{e9}'");
    }

    #[test]
    fn quotes_like_python() {
        assert_eq!(short_str("GET / HTTP/1.1"), "'GET / HTTP/1.1'");
        assert_eq!(short_str("it's"), "\"it's\"");
        assert_eq!(short_str(&"x".repeat(41)), format!("'{}'...", "x".repeat(40)));
        assert_eq!(short_bytes(b"A\x00\xff\r"), "b'A\\x00\\xff\\r'");
    }
}
