//! Small frame helpers of the session: headers read and changed, the frames the session
//! writes itself (RECEIPT, ERROR).

use crate::stomp::{encode, RawFrame, Version};

use super::bridge::Headers;

/// Set the first header called `name` (or add it); the received octets no longer match.
pub fn set_header(frame: &mut RawFrame, name: &str, value: &str) {
    frame.wire = None;
    match frame.headers.iter_mut().find(|(key, _)| key == name) {
        Some(header) => header.1 = value.to_owned(),
        None => frame.headers.push((name.to_owned(), value.to_owned())),
    }
}

/// Remove every header called `name`.
pub fn remove_header(frame: &mut RawFrame, name: &str) {
    frame.wire = None;
    frame.headers.retain(|(key, _)| key != name);
}

/// The frame's headers, first occurrence of each name (the spec's rule for repeats),
/// `skip`'s names left out.
pub fn first_headers(frame: &RawFrame, skip: &[&str]) -> Headers {
    let mut out: Headers = Vec::with_capacity(frame.headers.len());
    for (name, value) in &frame.headers {
        if skip.contains(&name.as_str()) || out.iter().any(|(seen, _)| seen == name) {
            continue;
        }
        out.push((name.clone(), value.clone()));
    }
    out
}

/// At most `max` characters of `text`.
pub fn shorten(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

pub fn receipt_frame(id: &str, version: Version) -> Vec<u8> {
    let frame = RawFrame::new("RECEIPT", vec![("receipt-id".into(), id.into())], Vec::new());
    encode(&frame, version).unwrap_or_default()
}

/// The ERROR frame the session ends a connection with (as the Python session writes it).
pub fn error_frame(message: &str, receipt: Option<&str>, detail: &str, version: Version) -> Vec<u8> {
    let mut headers = vec![
        ("message".to_owned(), shorten(message, 200)),
        ("content-type".to_owned(), "text/plain".to_owned()),
    ];
    if let Some(receipt) = receipt {
        headers.push(("receipt-id".to_owned(), receipt.to_owned()));
    }
    let text = if detail.is_empty() { message } else { detail };
    let mut body = text.as_bytes().to_vec();
    body.truncate(2000);
    let frame = RawFrame::new("ERROR", headers, body);
    encode(&frame, version).unwrap_or_else(|_| b"ERROR\nmessage:malformed frame\n\n\0".to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_first_wins_and_skips() {
        let mut frame = RawFrame::new(
            "SEND",
            vec![("a".into(), "1".into()), ("destination".into(), "/q".into()), ("a".into(), "2".into())],
            Vec::new(),
        );
        assert_eq!(first_headers(&frame, &["destination"]), vec![("a".to_owned(), "1".to_owned())]);
        set_header(&mut frame, "a", "3");
        assert_eq!(frame.get("a"), Some("3"));
        remove_header(&mut frame, "a");
        assert_eq!(frame.get("a"), None);
    }

    #[test]
    fn error_frames_carry_the_receipt() {
        let data = error_frame("bad", Some("r1"), "", Version::V12);
        let text = String::from_utf8_lossy(&data);
        assert!(text.starts_with("ERROR\n") && text.contains("receipt-id:r1") && text.ends_with("bad\0"));
        assert_eq!(shorten("héllo", 2), "hé");
    }
}
