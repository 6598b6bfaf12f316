//! Per-connection bounds on what a peer may send.

/// Bounds on one frame, in octets of its encoded form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The whole frame, command line to NUL inclusive.
    pub max_frame_bytes: usize,
    pub max_header_count: usize,
    /// One `name:value` line, encoded, without its EOL.
    pub max_header_line_bytes: usize,
}

/// The command line, without its EOL, unless a decoder is told otherwise
/// ([`crate::stomp::Decoder::with_commands`]).
pub const DEFAULT_MAX_COMMAND_BYTES: usize = 32;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 16 * 1024 * 1024,
            max_header_count: 128,
            max_header_line_bytes: 8192,
        }
    }
}

impl Limits {
    /// Largest possible command line + header lines + blank line, EOLs as CRLF.
    pub fn max_head_bytes(&self, max_command_bytes: usize) -> usize {
        let lines = self
            .max_header_count
            .saturating_mul(self.max_header_line_bytes.saturating_add(2));
        let head = max_command_bytes
            .saturating_add(2)
            .saturating_add(lines)
            .saturating_add(2);
        head.min(self.max_frame_bytes)
    }
}
