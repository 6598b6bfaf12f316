//! What the codec produces and consumes: frames, decoder items, versions, errors.

use std::fmt;

/// Decoded frames up to this size keep their received octets ([`RawFrame::wire`]), so a
/// proxy relays them unchanged without encoding them again; bigger ones would double the
/// memory a frame in flight holds, for a saving that the copy of their body dwarfs anyway.
pub const MAX_WIRE_KEPT: usize = 64 * 1024;

pub const CLIENT_COMMANDS: [&str; 11] = [
    "CONNECT",
    "STOMP",
    "SEND",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACK",
    "NACK",
    "BEGIN",
    "COMMIT",
    "ABORT",
    "DISCONNECT",
];
pub const SERVER_COMMANDS: [&str; 4] = ["CONNECTED", "MESSAGE", "RECEIPT", "ERROR"];

/// Frames whose headers are never escaped (backward compatibility with 1.0, all specs).
pub const UNESCAPED_COMMANDS: [&str; 3] = ["CONNECT", "STOMP", "CONNECTED"];

pub fn is_known_command(command: &str) -> bool {
    CLIENT_COMMANDS.contains(&command) || SERVER_COMMANDS.contains(&command)
}

/// ASCII uppercase letters only, at least one.
pub fn is_command_name(command: &[u8]) -> bool {
    !command.is_empty() && command.iter().all(u8::is_ascii_uppercase)
}

pub fn is_unescaped_command(command: &str) -> bool {
    UNESCAPED_COMMANDS.contains(&command)
}

/// A STOMP protocol version: it decides header escaping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V10,
    V11,
    V12,
}

impl Version {
    pub const ALL: [Version; 3] = [Version::V10, Version::V11, Version::V12];

    pub fn parse(text: &str) -> Option<Version> {
        match text {
            "1.0" => Some(Version::V10),
            "1.1" => Some(Version::V11),
            "1.2" => Some(Version::V12),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V10 => "1.0",
            Version::V11 => "1.1",
            Version::V12 => "1.2",
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One STOMP frame. `headers` keeps wire order; a name may repeat (the first one wins).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawFrame {
    pub command: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The octets the frame was decoded from (command to NUL), for frames up to
    /// [`MAX_WIRE_KEPT`] from a decoder that keeps them; None once headers changed.
    pub wire: Option<Vec<u8>>,
}

impl RawFrame {
    pub fn new(command: &str, headers: Vec<(String, String)>, body: Vec<u8>) -> RawFrame {
        RawFrame { command: command.to_owned(), headers, body, wire: None }
    }

    /// Value of the first header called `name` (the spec's rule for repeats).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// A frame over the limits, from a decoder in oversized mode: `frame` has its command
/// and headers, its body too when `body_kept` (too many headers or a header line too
/// long, the whole frame within `max_frame_bytes`), else the body was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OversizedFrame {
    pub frame: RawFrame,
    pub reason: &'static str,
    pub detail: String,
    pub body_kept: bool,
}

/// What a decoder hands on, in stream order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// An EOL (`\n` or `\r\n`) between frames.
    Heartbeat,
    Frame(RawFrame),
    Oversized(OversizedFrame),
}

/// Malformed or over-limit input. `reason` is a constant text, safe for an ERROR
/// frame's `message` header (it never holds peer data); `detail` says more (it may
/// quote the offending input, shortened).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError {
    pub reason: &'static str,
    pub detail: String,
}

impl FrameError {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> FrameError {
        FrameError { reason, detail: detail.into() }
    }

    pub fn bare(reason: &'static str) -> FrameError {
        FrameError { reason, detail: String::new() }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.detail)
        }
    }
}

impl std::error::Error for FrameError {}
