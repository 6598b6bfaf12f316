//! Incremental decoder for one direction of one connection.
//!
//! Limits are enforced while the data arrives: a peer that streams an endless header
//! line or a body without NUL is stopped as soon as the frame can no longer fit. An
//! incomplete frame is kept with a resume point, so a large frame arriving in many
//! small reads costs linear time, and the outcome never depends on how the input was
//! split.

use std::borrow::Cow;

use memchr::{memchr, memchr_iter, memmem, memrchr};

use super::escape::{short_bytes, short_str, unescape};
use super::frame::{
    is_command_name, is_unescaped_command, FrameError, Item, OversizedFrame, RawFrame, Version,
    CLIENT_COMMANDS, MAX_WIRE_KEPT, SERVER_COMMANDS,
};
use super::limits::{Limits, DEFAULT_MAX_COMMAND_BYTES};

const LF: u8 = b'\n';
const CR: u8 = b'\r';
const NUL: u8 = 0;

/// What the incomplete frame held in the buffer waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The blank line after the headers.
    Head,
    /// `need` octets in total (content-length known).
    BodyLen,
    /// The NUL (no content-length), searched up to `scan`.
    BodyNul,
}

/// Decodes the octets of one peer into [`Item`]s. `version` governs header unescaping
/// and may be changed at any time; it applies to frames completed by later feeds. After
/// a [`FrameError`] the decoder is poisoned: every further feed fails with the same
/// reason. In oversized mode a frame over the limits whose header block fits is handed
/// on as [`Item::Oversized`] (its body skipped when over `max_frame_bytes`), and
/// decoding goes on after it.
#[derive(Clone, Debug)]
pub struct Decoder {
    limits: Limits,
    max_command: usize,
    max_head: usize,
    commands: Vec<Box<str>>,
    /// The commands no longer than `max_command`.
    accepted: Vec<Box<str>>,
    version: Version,
    keep_wire: bool,
    oversized: bool,
    buf: Vec<u8>,
    state: State,
    /// Head: terminator searched up to here; BodyNul: NUL searched up to here.
    scan: usize,
    /// Head: LFs seen in `buf[..scan]`.
    nl: usize,
    /// BodyLen: octets of the whole frame.
    need: usize,
    error: Option<&'static str>,
    /// Octets of a skipped body still to discard, its NUL included.
    skip_left: usize,
    /// Discarding a skipped body up to its NUL.
    skip_nul: bool,
    /// A head limit the frame being parsed broke (oversized mode).
    violation: Option<(&'static str, String)>,
}

fn nul_in_headers() -> FrameError {
    FrameError::new("NUL in headers", "the frame ended before the blank line")
}

/// The earliest blank line (`\n\n` or `\n\r\n`) lying wholly in `buf[from..to]`:
/// (where it starts, where the body starts).
fn find_head_end(buf: &[u8], from: usize, to: usize) -> Option<(usize, usize)> {
    if from >= to {
        return None;
    }
    let hay = &buf[from..to];
    for at in memchr_iter(LF, hay) {
        match hay.get(at + 1) {
            Some(&LF) => return Some((from + at, from + at + 2)),
            Some(&CR) if hay.get(at + 2) == Some(&LF) => return Some((from + at, from + at + 3)),
            _ => {}
        }
    }
    None
}

fn count_lf(data: &[u8]) -> usize {
    memchr_iter(LF, data).count()
}

fn latin1(data: &[u8]) -> String {
    data.iter().map(|&octet| octet as char).collect()
}

/// Python's text for a UTF-8 decoding error, which error details carry.
fn utf8_detail(raw: &[u8], error: std::str::Utf8Error) -> String {
    let at = error.valid_up_to();
    let octet = raw[at];
    let why = match error.error_len() {
        None => "unexpected end of data",
        Some(_) if matches!(octet, 0x80..=0xc1 | 0xf5..=0xff) => "invalid start byte",
        Some(_) => "invalid continuation byte",
    };
    format!("'utf-8' codec can't decode byte 0x{octet:02x} in position {at}: {why}")
}

fn parse_content_length(value: &str) -> Result<usize, FrameError> {
    if value.is_empty() || !value.bytes().all(|octet| octet.is_ascii_digit()) {
        return Err(FrameError::new("invalid content-length", short_str(value)));
    }
    let digits = value.trim_start_matches('0');
    if digits.len() > 18 {
        return Err(FrameError::new("content-length too large", short_str(value)));
    }
    // At most 18 digits: below 10^18, which fits.
    Ok(digits.parse::<u64>().unwrap_or(0) as usize)
}

type Head = (String, Vec<(String, String)>, Option<usize>);

impl Decoder {
    /// A decoder of the server's commands (MESSAGE, RECEIPT, ERROR, CONNECTED) when
    /// `server_commands`, else of the client's.
    pub fn new(limits: Limits, server_commands: bool, version: Version) -> Decoder {
        let commands: &[&str] = if server_commands { &SERVER_COMMANDS } else { &CLIENT_COMMANDS };
        Decoder::with_commands(limits, commands, DEFAULT_MAX_COMMAND_BYTES, version)
            .expect("the STOMP commands are command names")
    }

    /// A decoder of exactly `commands` (ASCII uppercase words), commands longer than
    /// `max_command_bytes` refused.
    pub fn with_commands(
        limits: Limits,
        commands: &[&str],
        max_command_bytes: usize,
        version: Version,
    ) -> Result<Decoder, String> {
        if let Some(bad) = commands.iter().find(|c| !is_command_name(c.as_bytes())) {
            return Err(format!("commands must be ASCII uppercase words, got {bad:?}"));
        }
        let limits = Limits {
            max_frame_bytes: limits.max_frame_bytes.max(1),
            max_header_count: limits.max_header_count.max(1),
            max_header_line_bytes: limits.max_header_line_bytes.max(1),
        };
        let max_command = max_command_bytes.max(1);
        Ok(Decoder {
            limits,
            max_command,
            max_head: limits.max_head_bytes(max_command),
            commands: commands.iter().map(|&c| Box::from(c)).collect(),
            accepted: commands
                .iter()
                .filter(|c| c.len() <= max_command)
                .map(|&c| Box::from(c))
                .collect(),
            version,
            keep_wire: true,
            oversized: false,
            buf: Vec::new(),
            state: State::Head,
            scan: 0,
            nl: 0,
            need: 0,
            error: None,
            skip_left: 0,
            skip_nul: false,
            violation: None,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    pub fn oversized(&self) -> bool {
        self.oversized
    }

    /// Hand frames over the limits on as [`Item::Oversized`] instead of failing: for a
    /// trusted peer, whose one odd frame must not end the connection.
    pub fn set_oversized(&mut self, on: bool) {
        self.oversized = on;
    }

    /// Whether decoded frames keep their received octets ([`RawFrame::wire`]).
    pub fn set_keep_wire(&mut self, on: bool) {
        self.keep_wire = on;
    }

    /// Octets held of an incomplete frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends to `out` the items completed by `data`, in order; the rest stays
    /// buffered. On error, `out` holds what was completed before it.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Item>) -> Result<(), FrameError> {
        if let Some(reason) = self.error {
            return Err(FrameError::new(
                reason,
                "the decoder failed earlier; close the connection",
            ));
        }
        let result = self.feed_inner(data, out);
        if let Err(error) = &result {
            self.error = Some(error.reason);
            self.buf = Vec::new();
        }
        result
    }

    fn feed_inner(&mut self, mut data: &[u8], out: &mut Vec<Item>) -> Result<(), FrameError> {
        if self.skip_left > 0 || self.skip_nul {
            data = self.skip(data)?;
            if data.is_empty() {
                return Ok(());
            }
        }
        if !self.buf.is_empty() {
            self.buf.extend_from_slice(data);
            if !self.may_complete()? {
                return Ok(());
            }
            let buf = std::mem::take(&mut self.buf);
            return self.parse(&buf, out);
        }
        if data.is_empty() {
            return Ok(());
        }
        self.parse(data, out)
    }

    /// Discards the rest of an oversized frame's body; what follows it in `data`.
    fn skip<'a>(&mut self, data: &'a [u8]) -> Result<&'a [u8], FrameError> {
        if self.skip_nul {
            return Ok(match memchr(NUL, data) {
                None => &[],
                Some(nul) => {
                    self.skip_nul = false;
                    &data[nul + 1..]
                }
            });
        }
        let left = self.skip_left;
        if data.len() < left {
            self.skip_left = left - data.len();
            return Ok(&[]);
        }
        self.skip_left = 0;
        if data[left - 1] != NUL {
            return Err(FrameError::new("missing NUL after body", "after an oversized frame"));
        }
        Ok(&data[left..])
    }

    /// False if the buffered frame certainly is still incomplete (limits checked).
    fn may_complete(&mut self) -> Result<bool, FrameError> {
        let n = self.buf.len();
        match self.state {
            State::BodyLen => Ok(n >= self.need),
            State::BodyNul => {
                let stop = self.limits.max_frame_bytes; // the NUL must lie below this
                let end = stop.min(n);
                if self.scan < end && memchr(NUL, &self.buf[self.scan..end]).is_some() {
                    return Ok(true);
                }
                if n >= stop {
                    if self.oversized {
                        return Ok(true); // parse() hands it on as Oversized
                    }
                    return Err(FrameError::new("frame too large", "no NUL within max_frame_bytes"));
                }
                self.scan = n;
                Ok(false)
            }
            State::Head => {
                let first = self.buf[0];
                if first == LF || (first == CR && (n == 1 || self.buf[1] == LF)) {
                    return Ok(true); // a heart-beat (or half of one) leads
                }
                let from = self.scan.saturating_sub(2);
                if find_head_end(&self.buf, from, n.min(self.max_head)).is_some() {
                    return Ok(true);
                }
                let buf = std::mem::take(&mut self.buf);
                let checked = self.check_partial_head(&buf, 0, self.scan, n);
                self.buf = buf;
                checked?;
                self.scan = n;
                Ok(false)
            }
        }
    }

    /// Limits on a frame whose header block is unterminated in `buf[start..n]`;
    /// `buf[start..scan]` was checked before (`nl` counts its LFs), so a head that
    /// trickles in is checked in linear time, with the same outcome however it is split.
    fn check_partial_head(
        &mut self,
        buf: &[u8],
        start: usize,
        scan: usize,
        n: usize,
    ) -> Result<(), FrameError> {
        let seen = self.nl;
        self.nl = seen + count_lf(&buf[scan..n]);
        if self.nl == 0 {
            // still on the command line
            let line = &buf[start..n];
            if memchr(NUL, line).is_some() {
                return Err(self.command_error(&latin1(line)).unwrap_or_else(nul_in_headers));
            }
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() > self.max_command {
                return Err(FrameError::new("command too long", short_bytes(line)));
            }
            if !is_command_name(line) {
                return Err(FrameError::new("bad command", short_bytes(line)));
            }
        } else {
            let lines_from = if seen == 0 {
                let first = start + memchr(LF, &buf[start..n]).unwrap_or(n - start);
                self.check_command_line(&buf[start..first])?;
                first + 1
            } else {
                // from the start of the line that was incomplete at `scan`
                memrchr(LF, &buf[start..scan]).map_or(0, |at| start + at + 1)
            };
            let limits = self.limits;
            if self.nl - 1 > limits.max_header_count && !self.oversized {
                return Err(FrameError::new(
                    "too many headers",
                    format!("more than {}", limits.max_header_count),
                ));
            }
            if !self.oversized {
                let max_line = limits.max_header_line_bytes;
                let mut lines = buf[lines_from..n].split(|&octet| octet == LF).peekable();
                while let Some(line) = lines.next() {
                    let too_long = if lines.peek().is_none() {
                        line.len() > max_line + 1 // + 1: it may end with the CR of a CRLF
                    } else {
                        line.len() - usize::from(line.ends_with(b"\r")) > max_line
                    };
                    if too_long {
                        return Err(FrameError::new(
                            "header line too long",
                            format!("more than {max_line} bytes"),
                        ));
                    }
                }
            }
        }
        if memchr(NUL, &buf[scan..n]).is_some() {
            return Err(nul_in_headers());
        }
        if n - start >= self.max_head {
            return Err(FrameError::new(
                "headers too large",
                format!("no blank line within {} bytes", self.max_head),
            ));
        }
        Ok(())
    }

    fn check_command_line(&self, line: &[u8]) -> Result<(), FrameError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match self.command_error(&latin1(line)) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn is_accepted(&self, command: &str) -> bool {
        self.accepted.iter().any(|c| &**c == command)
    }

    /// The FrameError that `command` deserves, or None if it is acceptable.
    fn command_error(&self, command: &str) -> Option<FrameError> {
        let mut command = command;
        if let Some(nul) = command.find('\0') {
            if self.is_accepted(&command[..nul]) {
                return Some(nul_in_headers());
            }
            command = &command[..nul];
        }
        if command.len() > self.max_command {
            return Some(FrameError::new("command too long", short_str(command)));
        }
        if !is_command_name(command.as_bytes()) {
            return Some(FrameError::new("bad command", short_str(command)));
        }
        if !self.commands.iter().any(|c| &**c == command) {
            return Some(FrameError::new("unknown command", command));
        }
        None
    }

    fn stash(&mut self, buf: &[u8], start: usize, state: State) {
        self.buf = buf[start..].to_vec();
        self.state = state;
    }

    fn parse(&mut self, buf: &[u8], out: &mut Vec<Item>) -> Result<(), FrameError> {
        let max_frame = self.limits.max_frame_bytes;
        let n = buf.len();
        let mut pos = 0;
        while pos < n {
            let octet = buf[pos];
            if octet == LF {
                out.push(Item::Heartbeat);
                pos += 1;
                continue;
            }
            if octet == CR {
                if pos + 1 == n {
                    break; // maybe the first half of a CRLF heart-beat
                }
                if buf[pos + 1] == LF {
                    out.push(Item::Heartbeat);
                    pos += 2;
                    continue;
                }
            }
            let start = pos;
            let Some((mut head_end, body_start)) =
                find_head_end(buf, start, n.min(start.saturating_add(self.max_head)))
            else {
                self.nl = 0;
                self.check_partial_head(buf, start, start, n)?;
                self.stash(buf, start, State::Head);
                self.scan = n - start;
                return Ok(());
            };
            if buf[head_end - 1] == CR {
                head_end -= 1;
            }
            let (command, headers, length) = self.parse_head(&buf[start..head_end])?;
            let body: &[u8];
            match length {
                None => {
                    let stop = start.saturating_add(max_frame);
                    // from start: also catches a NUL in the head
                    let nul = memchr(NUL, &buf[start..stop.min(n)]).map(|at| start + at);
                    match nul {
                        Some(nul) if nul >= body_start => {
                            body = &buf[body_start..nul];
                            pos = nul + 1;
                        }
                        Some(_) => return Err(nul_in_headers()),
                        None => {
                            if n >= stop {
                                let detail = "no NUL within max_frame_bytes";
                                if !self.oversized {
                                    return Err(FrameError::new("frame too large", detail));
                                }
                                out.push(self.skipped(command, headers, detail.to_owned()));
                                match memchr(NUL, &buf[stop..]) {
                                    None => {
                                        self.skip_nul = true;
                                        return Ok(());
                                    }
                                    Some(at) => {
                                        pos = stop + at + 1;
                                        continue;
                                    }
                                }
                            }
                            self.stash(buf, start, State::BodyNul);
                            self.scan = n - start;
                            return Ok(());
                        }
                    }
                }
                Some(length) => {
                    if memchr(NUL, &buf[start..head_end]).is_some() {
                        return Err(nul_in_headers());
                    }
                    let end = body_start.saturating_add(length);
                    if end - start >= max_frame {
                        let detail = format!("content-length {length}");
                        if !self.oversized {
                            return Err(FrameError::new("frame too large", detail));
                        }
                        out.push(self.skipped(command, headers, detail.clone()));
                        if end >= n {
                            self.skip_left = end + 1 - n;
                            return Ok(());
                        }
                        if buf[end] != NUL {
                            return Err(FrameError::new("missing NUL after body", detail));
                        }
                        pos = end + 1;
                        continue;
                    }
                    if end >= n {
                        self.stash(buf, start, State::BodyLen);
                        self.need = end + 1 - start;
                        return Ok(());
                    }
                    if buf[end] != NUL {
                        return Err(FrameError::new(
                            "missing NUL after body",
                            format!("content-length {length}"),
                        ));
                    }
                    body = &buf[body_start..end];
                    pos = end + 1;
                }
            }
            // Octets kept for relaying unchanged, unless a repeated content-length makes
            // the frame ambiguous (encode() keeps only the first one: a peer reading the
            // last one would see other frame boundaries than the proxy did).
            let keep = self.keep_wire
                && pos - start <= MAX_WIRE_KEPT
                && (length.is_none()
                    || memmem::find_iter(&buf[start..head_end], b"\ncontent-length:").count() == 1);
            let mut frame = RawFrame { command, headers, body: body.to_vec(), wire: None };
            match self.violation.take() {
                None => {
                    if keep {
                        frame.wire = Some(buf[start..pos].to_vec());
                    }
                    out.push(Item::Frame(frame));
                }
                Some((reason, detail)) => out.push(Item::Oversized(OversizedFrame {
                    frame,
                    reason,
                    detail,
                    body_kept: true,
                })),
            }
        }
        if pos < n {
            self.stash(buf, pos, State::Head);
            self.scan = 0;
            self.nl = 0;
        }
        Ok(())
    }

    /// The item of a frame whose body is skipped (over max_frame_bytes).
    fn skipped(&mut self, command: String, headers: Vec<(String, String)>, detail: String) -> Item {
        self.violation = None; // the size is what it is handed on for
        Item::Oversized(OversizedFrame {
            frame: RawFrame { command, headers, body: Vec::new(), wire: None },
            reason: "frame too large",
            detail,
            body_kept: false,
        })
    }

    /// Command and headers from the header block (without its final EOL). In oversized
    /// mode too many headers or a header line too long are recorded in `violation`
    /// instead of failing.
    ///
    /// The checks run in the order [`Decoder::check_partial_head`] runs them on a head
    /// still arriving (command line, header count, line length, NUL, then the rest), so
    /// a frame gets the same error whether it came in one read or many.
    fn parse_head(&mut self, raw: &[u8]) -> Result<Head, FrameError> {
        let limits = self.limits;
        self.violation = None;
        let command_end = memchr(LF, raw);
        let command_line = &raw[..command_end.unwrap_or(raw.len())];
        let command_line = match command_end {
            Some(_) => command_line.strip_suffix(b"\r").unwrap_or(command_line),
            None => command_line,
        };
        let command = match std::str::from_utf8(command_line) {
            Ok(command) if self.is_accepted(command) => command,
            _ => {
                return Err(self
                    .command_error(&latin1(command_line))
                    .unwrap_or_else(|| FrameError::bare("bad command")))
            }
        };
        if command_end.is_none() {
            return Ok((command.to_owned(), Vec::new(), None));
        }
        let line_count = count_lf(raw);
        if line_count > limits.max_header_count {
            let error = FrameError::new(
                "too many headers",
                format!("more than {}", limits.max_header_count),
            );
            if !self.oversized {
                return Err(error);
            }
            self.violation = Some((error.reason, error.detail));
        }
        let max_line = limits.max_header_line_bytes;
        if raw.len() > max_line {
            // only then can a single line be too long
            for line in raw.split(|&octet| octet == LF).skip(1) {
                if line.len() - usize::from(line.ends_with(b"\r")) > max_line {
                    let error = FrameError::new(
                        "header line too long",
                        format!("more than {max_line} bytes"),
                    );
                    if !self.oversized {
                        return Err(error);
                    }
                    if self.violation.is_none() {
                        self.violation = Some((error.reason, error.detail));
                    }
                    break;
                }
            }
        }
        if memchr(NUL, raw).is_some() {
            return Err(nul_in_headers());
        }
        let text = std::str::from_utf8(raw)
            .map_err(|e| FrameError::new("invalid UTF-8 in headers", utf8_detail(raw, e)))?;
        let text: Cow<'_, str> = if memchr(CR, raw).is_some() {
            Cow::Owned(text.replace("\r\n", "\n"))
        } else {
            Cow::Borrowed(text)
        };
        let rest = &text[text.find('\n').map_or(text.len(), |at| at + 1)..];
        let mut split: Vec<(&str, &str)> = Vec::with_capacity(line_count);
        for line in rest.split('\n') {
            match line.find(':') {
                Some(0) => return Err(FrameError::new("empty header name", short_str(line))),
                Some(at) => split.push((&line[..at], &line[at + 1..])),
                None => return Err(FrameError::new("header line without ':'", short_str(line))),
            }
        }
        let version = self.version;
        let unescaping =
            version != Version::V10 && !is_unescaped_command(command) && rest.contains('\\');
        let mut headers = Vec::with_capacity(split.len());
        for (name, value) in split {
            if unescaping {
                let name = unescape(name, version)?.into_owned();
                let value = unescape(value, version)?.into_owned();
                headers.push((name, value));
            } else {
                headers.push((name.to_owned(), value.to_owned()));
            }
        }
        let mut length = None;
        if let Some(at) = text.find("\ncontent-length:") {
            // An escape in the value cannot make (or unmake) a string of digits, so the
            // raw value decides; its escapes were validated above.
            let value = &text[at + 16..];
            let value = &value[..value.find('\n').unwrap_or(value.len())];
            length = Some(parse_content_length(value)?);
        }
        Ok((command.to_owned(), headers, length))
    }
}
