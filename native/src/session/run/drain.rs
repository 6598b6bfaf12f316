//! A session's graceful end when the plane closes (the sidecar got SIGTERM; see
//! `session::stopping`), as the Python plane's: no more client frames are read; what is
//! in flight settles (receipts owed to the client, the guard's acknowledgements and
//! dead-letter copies, a DISCONNECT receipted by the broker) within drain-timeout-ms;
//! the client is told with an ERROR, behind the receipts owed before it.

use std::time::Duration;

use tokio::time::{timeout_at, Instant};

use super::super::stopping::STOP_MESSAGE;
use super::Session;
use crate::stomp::RawFrame;
use crate::transport::events::Event;
use crate::transport::leg::STOP;

/// How long a closing client leg may take to write what was queued for it (the ERROR
/// last) once the session is over: the runtime stops when the last session has ended.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

impl Session {
    /// The plane is closing: the relay ends once the broker answered the session's
    /// DISCONNECT (or at drain-timeout-ms), as after a client's DISCONNECT.
    pub(super) async fn on_stop(&mut self) {
        if self.client_over.is_some() || self.broker_over.is_some() {
            return; // ending already: it drains the same way
        }
        self.client.set_pause(STOP, true);
        self.send_error(STOP_MESSAGE, None, "");
        self.client_over = Some("shutdown".into());
        if self.pending_disconnect.is_none() && !self.disconnect_sent {
            // The sidecar's own: its receipt is the chain's, not owed to the client.
            self.disconnect(RawFrame::new("DISCONNECT", Vec::new(), Vec::new())).await;
        }
    }

    /// While the plane closes: wait (briefly) for the client leg to write what is queued
    /// for it and close, before this session counts as ended.
    pub(super) async fn await_client_closed(&mut self) {
        if self.client_closed || !self.config.stopping.is_stopping() {
            return;
        }
        let deadline = Instant::now() + CLOSE_WAIT;
        loop {
            match timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(Event::Closed(id, _))) if id == self.id => return,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }
}
