//! The project's one STOMP 1.0 / 1.1 / 1.2 codec.
//!
//! Wire format (all three versions): `COMMAND EOL *(name ":" value EOL) EOL *OCTET NUL
//! *(EOL)`, the trailing EOLs being heart-beats. EOL is LF or CRLF in every version
//! (1.0 and 1.1 peers send CRLF too): exactly one CR before an LF belongs to the EOL.
//!
//! Headers are UTF-8; a line splits at its first `:`; nothing is trimmed; repeated
//! names are kept in order and the first occurrence wins. 1.1 and 1.2 escape names and
//! values (`\n` `\c` `\\`, plus `\r` in 1.2; an undefined escape is fatal); 1.0 has no
//! escaping, and CONNECT, STOMP and CONNECTED are never escaped. A body runs for its
//! `content-length` (the first one) and must be followed by NUL, else to the first NUL.
//!
//! Rust callers use [`Decoder`], [`encode`] and [`item_into_py`]; Python sees the same
//! codec through the classes and functions of [`py`]. The STOMP adapter's SEND and its
//! stomp.py-compatible reading of received frames are in `adapter`.

mod adapter;
mod decode;
mod encode;
mod escape;
mod frame;
mod limits;
pub mod py;
mod wire;

pub use adapter::{encode_send, parse_head, split_received, unescape_lenient, ReceivedHeaders};
pub use decode::Decoder;
pub use encode::{check_command, encode, encode_checked, encode_parts, wire_of, with_plain_header, HeaderText};
pub use escape::{escape_into, needs_escape, unescape};
pub use frame::{
    is_command_name, is_known_command, is_unescaped_command, FrameError, Item, OversizedFrame,
    RawFrame, Version, CLIENT_COMMANDS, MAX_WIRE_KEPT, SERVER_COMMANDS, UNESCAPED_COMMANDS,
};
pub use limits::{Limits, DEFAULT_MAX_COMMAND_BYTES};
pub use py::item_into_py;
pub use wire::without_header_line;

use pyo3::prelude::*;

/// Adds the codec's classes and functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
