//! mqguard's native data plane: a Rust core with a thin Python face.
//!
//! `stomp` is the project's one STOMP codec (frames, escaping, limits); `transport`
//! owns the sidecar's sockets, TLS and relaying on a tokio runtime; `session` serves
//! whole STOMP sessions there, the guard called per batch. Python sees them
//! through the `mqguard_native` extension module registered here.
#![forbid(unsafe_code)]

use pyo3::prelude::*;

pub mod mqtt;
pub mod mqtt_proxy;
pub mod session;
pub mod stomp;
pub mod transport;

#[pymodule]
fn mqguard_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    mqtt::register(m)?;
    mqtt_proxy::register(m)?;
    stomp::register(m)?;
    transport::register(m)?;
    Ok(())
}
