//! Editing the received octets of a frame without encoding it again.

use memchr::{memchr, memmem};

/// `wire` with the one header line called `name` cut out; None when that is not simple.
///
/// Simple: `name` is plain ASCII that no STOMP version escapes (and not
/// `content-length`, which frames the body), and exactly one line of the header block
/// starts with it (decoded headers come from these very lines, so the line cut is the
/// header removed). The cut runs from the LF before the line to the LF after it, so the
/// line's own EOL (LF or CRLF) goes with it.
///
/// `value`: the header's decoded value when the frame has exactly one header called
/// `name` (`body_len`: the length of its body). Its line is then found with one search
/// of the header block for `LF name ":" value LF`: a line that reads so is that header.
pub fn without_header_line(
    wire: &[u8],
    name: &str,
    value: Option<&str>,
    body_len: usize,
) -> Option<Vec<u8>> {
    if !name.is_ascii()
        || name.contains(['\n', ':', '\\', '\r', '\0'])
        || name == "content-length"
    {
        return None;
    }
    let mut needle = Vec::with_capacity(name.len() + 2);
    needle.push(b'\n');
    needle.extend_from_slice(name.as_bytes());
    needle.push(b':');
    if let Some(value) = value {
        let mut line = needle.clone();
        line.extend_from_slice(value.as_bytes());
        line.push(b'\n');
        // The header block and its blank line end where the body starts.
        let stop = wire.len().saturating_sub(body_len + 1);
        if let Some(at) = memmem::find(&wire[..stop], &line) {
            let mut out = Vec::with_capacity(wire.len());
            out.extend_from_slice(&wire[..at]);
            out.extend_from_slice(&wire[at + line.len() - 1..]);
            return Some(out);
        }
    }
    let stop = head_end(wire)?;
    let at = memmem::find(&wire[..stop], &needle)?;
    if memmem::find(&wire[at + 1..stop], &needle).is_some() {
        return None;
    }
    let end = memchr(b'\n', &wire[at + 1..]).map_or(wire.len() - 1, |e| at + 1 + e);
    let mut out = Vec::with_capacity(wire.len());
    out.extend_from_slice(&wire[..at]);
    out.extend_from_slice(&wire[end..]);
    Some(out)
}

/// Where the first blank line (`\n\n` or `\n\r\n`) starts.
fn head_end(wire: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', wire).find(|&at| match wire.get(at + 1) {
        Some(b'\n') => true,
        Some(b'\r') => wire.get(at + 2) == Some(&b'\n'),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_one_line() {
        let raw = b"MESSAGE\r\nsubscription:1\r\nreceipt:r-7\r\nmessage-id:ID\\cx\r\n\r\nhi\0";
        let cut = without_header_line(raw, "receipt", Some("r-7"), 2).unwrap();
        assert_eq!(cut, b"MESSAGE\r\nsubscription:1\r\nmessage-id:ID\\cx\r\n\r\nhi\0");
        let twice = b"MESSAGE\nreceipt:a\nreceipt:b\n\n\0";
        assert_eq!(without_header_line(twice, "receipt", None, 0), None);
        assert_eq!(without_header_line(raw, "content-length", None, 2), None);
    }
}
