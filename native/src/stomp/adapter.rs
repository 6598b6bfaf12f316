//! The STOMP adapter's frames: the SEND it writes, and a received frame read the way
//! stomp.py reads it.
//!
//! The adapter (`mqguard.adapters.stomp`) drives stomp.py connections (STOMP 1.2) but
//! encodes its SENDs and reads its received frames here, on its hot path.
//!
//! Received frames go on to stomp.py's listeners, which expect what
//! `stomp.utils.parse_frame` gives: lenient where [`super::Decoder`] is strict, so this
//! is a reading of its own, not the decoder with options. stomp.py's transport has
//! already cut the frame at its NUL (or content-length), so the input is one frame
//! without its NUL, and nothing is refused:
//!
//! - the head ends at the first blank line (`\n\n` or `\r\n\r\n`, whichever comes
//!   first), or runs to the end; the body is everything after it;
//! - the head is UTF-8, an invalid sequence read as U+FFFD (Python's `errors="replace"`,
//!   which follows the same maximal-subpart rule as `String::from_utf8_lossy`);
//! - lines end at LF or CRLF; leading empty lines are skipped, and a head of empty lines
//!   only is no frame;
//! - a header line splits at its first `:`; a line without one, or with an empty name,
//!   is ignored; nothing is trimmed;
//! - escapes `\r` `\n` `\c` `\\` are undone in names and values in every frame; any
//!   other backslash is kept with the character after it;
//! - the first occurrence of a (unescaped) name wins.

use std::borrow::Cow;
use std::collections::HashSet;

use super::encode::{encode_checked, HeaderText};
use super::frame::{FrameError, Version};

/// Above this many headers, repeats are found through a set instead of a scan.
const SCAN_HEADERS: usize = 16;

/// The headers of a received frame: unescaped names and values, in wire order.
pub type ReceivedHeaders<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// Appends a SEND as the adapter writes it to `out`: `destination` first, then
/// `headers` in their order, then `content-length` when the body is not empty (an empty
/// body needs none, and stomp.py's SENDs carry none then either); names and values
/// escaped as STOMP 1.2 wants. What [`encode_checked`] refuses (a NUL, an empty name,
/// text that is not UTF-8) is a FrameError.
pub fn encode_send<'a, I>(destination: HeaderText<'a>, headers: I, body: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError>
where
    I: IntoIterator<Item = (HeaderText<'a>, HeaderText<'a>)>,
{
    // encode_checked writes the body's true length into the first content-length header
    // it meets (this one, as the adapter's names never are content-length).
    let length = if body.is_empty() { None } else { Some((HeaderText::from("content-length"), HeaderText::from(""))) };
    let all = std::iter::once((HeaderText::from("destination"), destination)).chain(headers).chain(length);
    encode_checked("SEND", all, body, Version::V12, true, out)
}

/// The head (undecoded) and the body of a received frame.
pub fn split_received(data: &[u8]) -> (&[u8], &[u8]) {
    let lf = memchr::memmem::find(data, b"\n\n");
    // A CRLF blank line counts only when it starts before the LF one, so it ends at most
    // 3 octets after that: the body is not searched twice.
    let limit = lf.map_or(data.len(), |lf| (lf + 3).min(data.len()));
    match (memchr::memmem::find(&data[..limit], b"\r\n\r\n"), lf) {
        (Some(crlf), _) => (&data[..crlf], &data[crlf + 4..]),
        (None, Some(lf)) => (&data[..lf], &data[lf + 2..]),
        (None, None) => (data, &data[data.len()..]),
    }
}

/// The command and the headers (first occurrence of each name, in order) of a decoded
/// head, or None when it holds only empty lines.
pub fn parse_head(head: &str) -> Option<(&str, ReceivedHeaders<'_>)> {
    let mut lines = head.split('\n').peekable();
    let mut command = None;
    while let Some(line) = lines.next() {
        // A CR ends a line only before an LF: the last line has none after it.
        let line = if lines.peek().is_some() { line.strip_suffix('\r').unwrap_or(line) } else { line };
        if !line.is_empty() {
            command = Some(line);
            break;
        }
    }
    let command = command?;
    let mut headers: ReceivedHeaders<'_> = Vec::new();
    let mut seen: Option<HashSet<String>> = None;
    while let Some(line) = lines.next() {
        let line = if lines.peek().is_some() { line.strip_suffix('\r').unwrap_or(line) } else { line };
        let Some(colon) = line.find(':') else { continue };
        if colon == 0 {
            continue;
        }
        let name = unescape_lenient(&line[..colon]);
        let repeated = match &seen {
            Some(seen) => seen.contains(name.as_ref()),
            None => headers.iter().any(|(known, _)| *known == name),
        };
        if repeated {
            continue;
        }
        if let Some(seen) = &mut seen {
            seen.insert(name.to_string());
        } else if headers.len() == SCAN_HEADERS {
            let mut set: HashSet<String> = headers.iter().map(|(known, _)| known.to_string()).collect();
            set.insert(name.to_string());
            seen = Some(set);
        }
        headers.push((name, unescape_lenient(&line[colon + 1..])));
    }
    Some((command, headers))
}

/// stomp.py's unescaping: `\r` `\n` `\c` `\\` undone, any other backslash kept as is
/// with the character after it (the spec calls that fatal; stomp.py passes it on).
pub fn unescape_lenient(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find('\\') else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut chars = text[first..].chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('r') => out.push('\r'),
            Some('n') => out.push('\n'),
            Some('c') => out.push(':'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = (String, Vec<(String, String)>, Vec<u8>);

    fn parse(data: &[u8]) -> Option<Parsed> {
        let (head, body) = split_received(data);
        let head = String::from_utf8_lossy(head);
        let (command, headers) = parse_head(&head)?;
        let headers = headers.into_iter().map(|(n, v)| (n.into_owned(), v.into_owned())).collect();
        Some((command.to_owned(), headers, body.to_vec()))
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn send(destination: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::new();
        let headers = headers.iter().map(|(n, v)| (HeaderText::from(*n), HeaderText::from(*v)));
        encode_send(HeaderText::from(destination), headers, body, &mut out)?;
        Ok(out)
    }

    #[test]
    fn send_frames_as_the_adapter_writes_them() {
        let frame = send("/queue/a", &[("receipt", "r-1"), ("persistent", "true")], b"hi").unwrap();
        assert_eq!(frame, b"SEND\ndestination:/queue/a\nreceipt:r-1\npersistent:true\ncontent-length:2\n\nhi\x00");
        assert_eq!(send("/queue/a", &[], b"").unwrap(), b"SEND\ndestination:/queue/a\n\n\x00");
        let frame = send("/queue/a:b", &[("k", "line\none\\two:three\r")], b"\x00x").unwrap();
        assert_eq!(
            frame,
            b"SEND\ndestination:/queue/a\\cb\nk:line\\none\\\\two\\cthree\\r\ncontent-length:2\n\n\x00x\x00"
        );
    }

    #[test]
    fn send_refuses_what_no_frame_can_carry() {
        assert_eq!(send("/queue/a", &[("k", "a\0b")], b"").unwrap_err().reason, "NUL in header");
        assert_eq!(send("/queue/\0", &[], b"x").unwrap_err().reason, "NUL in header");
        assert_eq!(send("/queue/a", &[("", "v")], b"").unwrap_err().reason, "empty header name");
    }

    #[test]
    fn sent_frames_read_back() {
        let frame = send("/queue/a:b", &[("k", "v\\\r\n"), ("e", "")], b"body").unwrap();
        let (head, body) = split_received(&frame[..frame.len() - 1]);
        let head = String::from_utf8_lossy(head);
        let (command, headers) = parse_head(&head).unwrap();
        assert_eq!(command, "SEND");
        let headers: Vec<(String, String)> = headers.into_iter().map(|(n, v)| (n.into_owned(), v.into_owned())).collect();
        assert_eq!(
            headers,
            pairs(&[("destination", "/queue/a:b"), ("k", "v\\\r\n"), ("e", ""), ("content-length", "4")])
        );
        assert_eq!(body, b"body");
    }

    #[test]
    fn message_with_escapes_repeats_and_odd_lines() {
        let data = b"MESSAGE\nsubscription:1\nmessage-id:ID\\c1\nk\\\\ey:v\\nal\\x\n\
                     subscription:2\nnovalue\n:empty-name\nx:y:z\n\nbody\n\nmore";
        let (command, headers, body) = parse(data).unwrap();
        assert_eq!(command, "MESSAGE");
        assert_eq!(
            headers,
            pairs(&[("subscription", "1"), ("message-id", "ID:1"), ("k\\ey", "v\nal\\x"), ("x", "y:z")])
        );
        assert_eq!(body, b"body\n\nmore");
    }

    #[test]
    fn crlf_lines_and_head_ends() {
        let (command, headers, body) = parse(b"\n\r\nRECEIPT\r\nreceipt-id:7\r\n\r\n").unwrap();
        assert_eq!((command.as_str(), headers, body), ("RECEIPT", pairs(&[("receipt-id", "7")]), vec![]));
        // "\n\n" comes first: the head is "MESSAGE\na:b\r", its last line keeps the CR.
        let (_, headers, body) = parse(b"MESSAGE\na:b\r\n\nbody").unwrap();
        assert_eq!((headers, body), (pairs(&[("a", "b\r")]), b"body".to_vec()));
        // Only one CR before an LF belongs to the line end.
        let (_, headers, _) = parse(b"MESSAGE\r\na:b\r\r\n\r\nbody").unwrap();
        assert_eq!(headers, pairs(&[("a", "b\r")]));
        // The CRLF blank line starts first, though an LF one ends inside it.
        let (_, headers, body) = parse(b"MESSAGE\r\na:b\r\n\r\n\nbody\n\n").unwrap();
        assert_eq!((headers, body), (pairs(&[("a", "b")]), b"\nbody\n\n".to_vec()));
        let (command, headers, body) = parse(b"CONNECTED").unwrap();
        assert_eq!((command.as_str(), headers.len(), body.len()), ("CONNECTED", 0, 0));
    }

    #[test]
    fn empty_lines_only_is_no_frame() {
        assert_eq!(parse(b"\n\n"), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"\r\n\r\nbody"), None);
    }

    #[test]
    fn unknown_and_trailing_escapes_are_kept() {
        assert_eq!(unescape_lenient("a\\tb\\"), "a\\tb\\");
        assert_eq!(unescape_lenient("\\\\n\\r\\c\\\u{e9}"), "\\n\r:\\\u{e9}");
        assert!(matches!(unescape_lenient("plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn invalid_utf8_reads_as_replacement_characters() {
        let (command, headers, body) = parse(b"MESSAGE\nk:\xff\xed\xa0\x80v\n\n\xff").unwrap();
        assert_eq!(command, "MESSAGE");
        assert_eq!(headers, pairs(&[("k", "\u{fffd}\u{fffd}\u{fffd}\u{fffd}v")]));
        assert_eq!(body, b"\xff");
    }

    #[test]
    fn first_occurrence_wins_beyond_the_scanned_headers() {
        let mut data = b"MESSAGE\n".to_vec();
        for round in 0..3 {
            for index in 0..40 {
                data.extend_from_slice(format!("h{index}:{round}\n").as_bytes());
            }
        }
        data.extend_from_slice(b"h\\c0:x\nh:0:y\n\n");
        let (_, headers, _) = parse(&data).unwrap();
        assert_eq!(headers.len(), 42);
        assert!(headers[..40].iter().enumerate().all(|(i, (n, v))| *n == format!("h{i}") && v == "0"));
        assert_eq!(headers[40..], pairs(&[("h:0", "x"), ("h", "0:y")]));
    }
}
