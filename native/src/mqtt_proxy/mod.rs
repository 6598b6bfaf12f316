//! The MQTT sidecar's data plane: listener, both legs of every connection and the MQTT
//! session state on a tokio runtime; the guard's decisions come from Python per read.
//!
//! Each client connection is one task ([`session`]) that owns the client socket and its
//! upstream connection. PUBLISHes read from either side are handed to Python as one batch
//! event per read ([`events`]); the task waits for that batch's verdicts before it reads
//! on, so the guard sees every message of a connection in order and the broker never sees
//! a message the guard has not decided. Packet ids of the client's publishes are mapped
//! onto the upstream connection's id space ([`ids`]), which the sidecar shares with the
//! publishes of its own (dead letters, expired messages). See docs/sidecar-mqtt.md.

use pyo3::prelude::*;

pub mod events;
pub mod ids;
mod plane;
mod session;
mod tls;

pub use plane::MqttPlane;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MqttPlane>()?;
    Ok(())
}
