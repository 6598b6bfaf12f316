//! The project's MQTT 3.1.1 and 5.0 codec: every control packet, both directions.
//!
//! A packet is a fixed header (type and flags, then the remaining length as a
//! variable-byte integer) and a body. The decoder accepts only the canonical form the
//! specs require (minimal variable-byte integers, reserved bits as specified, well-formed
//! UTF-8 without U+0000), so a decoded packet that is not changed encodes again to the
//! very octets it came from: the sidecar can relay it unchanged without keeping them.
//! MQTT 5 properties keep their wire order (user properties included); an acknowledgement
//! whose reason code or properties were left out keeps them left out.
//!
//! Limits are checked while data arrives: the packet size as soon as the fixed header is
//! complete, before any of the body is buffered. Errors name what is wrong and carry the
//! MQTT 5 reason code a server would answer with. Credentials (password, authentication
//! data) never appear in a `Debug` or error string.
//!
//! Rust callers use [`Decoder`] and [`encode`]; Python sees the codec through [`py`].

mod decode;
mod encode;
mod error;
mod packet;
pub mod props;
pub mod py;
mod varint;

pub use decode::{decode_packet, Decoder, Limits};
pub use encode::{encode, encode_to_vec};
pub use error::MqttError;
pub use packet::{Ack, Connect, ConnAck, Packet, Publish, Reasoned, SubAck, Subscribe, Unsubscribe, Version, Will};
pub use props::{prop_allowed, prop_name, Properties, PropValue, Property, WILL};
pub use varint::{read_varint, write_varint, MAX_VARINT};

use pyo3::prelude::*;

/// Adds the codec's classes and functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}

#[cfg(test)]
mod tests;
