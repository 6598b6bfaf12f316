//! A native STOMP session per client connection: both legs, the handshake, receipts in
//! order, subscriptions and ack modes, DISCONNECT held until earlier receipts are in,
//! ERROR frames; the guard consulted once per read batch through `bridge` (see
//! docs/sidecar.md, "The native-session data plane").

pub mod bridge;
pub mod bypass;
pub mod chain;
pub mod run;
#[cfg(any(test, feature = "script"))]
pub mod script;
pub mod stopping;
pub mod subs;
pub mod tally;
pub mod wire;

pub use bridge::{batch_into_py, verdicts_from_py, Bridge, GuardBatch, OversizedItem, PyVerdict, Verdict};
pub use run::{Connecting, Host, Session, SessionConfig};
pub use stopping::{Stopping, STOP_MESSAGE};
pub use tally::FrameTally;
