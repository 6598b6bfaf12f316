//! The wire form of a frame for a connection speaking a given STOMP version.

use super::escape::{escape_into, short_str};
use super::frame::{is_command_name, is_known_command, is_unescaped_command, FrameError, RawFrame, Version};

/// One header to encode: its text, and whether that text is only an approximation of
/// what the caller holds (a Python string with a lone surrogate: not representable in
/// UTF-8, refused once every other check passed, as the reference codec did).
pub struct HeaderText<'a> {
    pub text: &'a str,
    pub lossy: bool,
}

impl<'a> From<&'a str> for HeaderText<'a> {
    fn from(text: &'a str) -> Self {
        HeaderText { text, lossy: false }
    }
}

/// The wire form of `frame` (see [`encode_parts`]).
pub fn encode(frame: &RawFrame, version: Version) -> Result<Vec<u8>, FrameError> {
    let headers = frame.headers.iter().map(|(n, v)| (HeaderText::from(n.as_str()), HeaderText::from(v.as_str())));
    let mut out = Vec::with_capacity(frame.body.len() + 64 + 32 * frame.headers.len());
    encode_parts(&frame.command, headers, &frame.body, version, &mut out)?;
    Ok(out)
}

/// The octets to relay `frame` with: as received when unchanged, else encoded. Only for
/// a frame decoded on a connection speaking `version` too.
pub fn wire_of(frame: &RawFrame, version: Version) -> Result<std::borrow::Cow<'_, [u8]>, FrameError> {
    match &frame.wire {
        Some(wire) => Ok(std::borrow::Cow::Borrowed(wire)),
        None => encode(frame, version).map(std::borrow::Cow::Owned),
    }
}

/// Check that `command` may be encoded.
pub fn check_command(command: &str) -> Result<(), FrameError> {
    if is_known_command(command) || is_command_name(command.as_bytes()) {
        Ok(())
    } else {
        Err(FrameError::new("bad command", short_str(command)))
    }
}

/// Appends the wire form to `out`. Headers are escaped as `version` requires (never
/// for CONNECT, STOMP, CONNECTED). The first `content-length` header is set to the
/// body's true length and any repeat of it is dropped (two disagreeing lengths are a
/// request-smuggling hazard); one is added when the body holds a NUL and none was
/// given. A header this version cannot carry (a newline in a 1.0 value, a colon in an
/// unescaped name, a NUL anywhere, a value ending in CR where CR is not escaped) is a
/// FrameError instead of a corrupt frame. EOL is LF.
pub fn encode_parts<'a, I>(
    command: &str,
    headers: I,
    body: &[u8],
    version: Version,
    out: &mut Vec<u8>,
) -> Result<(), FrameError>
where
    I: IntoIterator<Item = (HeaderText<'a>, HeaderText<'a>)>,
{
    check_command(command)?;
    let escaped = version != Version::V10 && !is_unescaped_command(command);
    encode_checked(command, headers, body, version, escaped, out)
}

/// [`encode_parts`] with the escaping decided by the caller.
pub fn encode_checked<'a, I>(
    command: &str,
    headers: I,
    body: &[u8],
    version: Version,
    escaped: bool,
    out: &mut Vec<u8>,
) -> Result<(), FrameError>
where
    I: IntoIterator<Item = (HeaderText<'a>, HeaderText<'a>)>,
{
    let begin = out.len();
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    let mut has_length = false;
    let mut unrepresentable: Option<String> = None;
    let length_text = body.len().to_string();
    for (name, value) in headers {
        let mut value = value;
        if name.text == "content-length" && !name.lossy {
            if has_length {
                continue;
            }
            has_length = true;
            value = HeaderText { text: &length_text, lossy: false };
        }
        if name.text.is_empty() {
            out.truncate(begin);
            return Err(FrameError::bare("empty header name"));
        }
        if name.text.contains('\0') || value.text.contains('\0') {
            out.truncate(begin);
            return Err(FrameError::new("NUL in header", short_str(name.text)));
        }
        let line_start = out.len();
        if escaped {
            escape_into(name.text, version, out);
            let name_end = out.len();
            out.push(b':');
            escape_into(value.text, version, out);
            if out.last() == Some(&b'\r') {
                // only reachable where CR is not escaped
                let shown = short_str(&String::from_utf8_lossy(&out[line_start..name_end]));
                out.truncate(begin);
                return Err(FrameError::new(
                    "header not representable",
                    format!("{shown}: a trailing CR would be read as EOL"),
                ));
            }
        } else {
            if name.text.contains([':', '\n']) || value.text.contains('\n') {
                let shown = short_str(name.text);
                out.truncate(begin);
                return Err(FrameError::new(
                    "header not representable",
                    format!("{shown}: ':' or LF needs STOMP 1.1+ escaping"),
                ));
            }
            if value.text.ends_with('\r') {
                let shown = short_str(name.text);
                out.truncate(begin);
                return Err(FrameError::new(
                    "header not representable",
                    format!("{shown}: a trailing CR would be read as EOL"),
                ));
            }
            out.extend_from_slice(name.text.as_bytes());
            out.push(b':');
            out.extend_from_slice(value.text.as_bytes());
        }
        out.push(b'\n');
        if unrepresentable.is_none() && (name.lossy || value.lossy) {
            let text = if name.lossy { name.text } else { value.text };
            unrepresentable = Some(format!(
                "'utf-8' codec can't encode a surrogate in {}: surrogates not allowed",
                short_str(text)
            ));
        }
    }
    if let Some(detail) = unrepresentable {
        out.truncate(begin);
        return Err(FrameError::new("header not representable", detail));
    }
    if !has_length && memchr::memchr(0, body).is_some() {
        out.extend_from_slice(b"content-length:");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
    Ok(())
}

/// `frame` (as received, `data`, LF line ends at least after its command) with
/// `name:value` as its first header: for a header that needs no escaping in any version
/// (plain ASCII, no `:` `\` CR LF).
pub fn with_plain_header(data: &[u8], name: &str, value: &str) -> Option<Vec<u8>> {
    let command_end = memchr::memchr(b'\n', data)? + 1;
    let mut out = Vec::with_capacity(data.len() + name.len() + value.len() + 2);
    out.extend_from_slice(&data[..command_end]);
    out.extend_from_slice(name.as_bytes());
    out.push(b':');
    out.extend_from_slice(value.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&data[command_end..]);
    Some(out)
}
