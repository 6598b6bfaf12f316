//! The sidecar's sockets on a tokio runtime: listeners, both legs of every proxied
//! connection (TCP or TLS), back-pressure between the legs, and the event queue that
//! hands their reads to Python in batches (see docs/sidecar.md, "Data planes").

use pyo3::prelude::*;

pub(crate) mod admission;
mod driver;
pub(crate) mod events;
pub(crate) mod handshake;
pub(crate) mod leg;
mod plane;
pub(crate) mod tls;

pub use plane::Plane;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Plane>()?;
    Ok(())
}
