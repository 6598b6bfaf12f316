//! What the tokio side tells Python: a queue of events and one wake-up per burst.
//!
//! Every I/O task pushes here; the asyncio loop watches the read end of a socket pair
//! (`loop.add_reader`) and takes the whole queue in one `Plane.drain()` call. A byte is
//! written to the pair only when the queue goes from "drained" to "pending", so a burst
//! of reads on many connections costs the loop one wake-up and the GIL one acquisition.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::session::GuardBatch;
use crate::stomp::{FrameError, Item};

/// One thing that happened on a leg (a connection's socket), or on a listener.
pub enum Event {
    /// The items decoded from one read of so many octets, and the error that ended
    /// decoding (after those items), if one did.
    Items(u64, Vec<Item>, usize, Option<FrameError>),
    /// The peer closed its sending side; writing may go on.
    Eof(u64),
    /// The leg is gone (socket closed): `Some` for an I/O error (errno, text).
    Closed(u64, Option<(i32, String)>),
    /// A client was refused by the listener itself: "fd" (out of descriptors) or "tls"
    /// (too many TLS handshakes in progress, or one that failed).
    Refused(&'static str),
    /// A native session's batch for the guard: session id (its client leg), batch id
    /// (0: nothing is awaited), what to decide (see `session::bridge`).
    Guard(u64, u64, GuardBatch),
    /// To a native session's task: work it held a receipt for is done (see `Chain::hold`).
    Released(u64),
    /// To a native session's task: the plane is closing; drain and end (see
    /// `session::stopping`).
    Stop,
    /// To a native session's task: its handshake is ended to make room for a newer one
    /// (see `admission`); the client's ERROR message.
    Evicted(String),
}

/// The queue of one plane's events (`E`: this plane's event type) and its wake-up pair.
pub struct Events<E = Event> {
    queue: Mutex<Vec<E>>,
    pending: AtomicBool,
    wake: UnixStream,
}

impl<E> Events<E> {
    pub fn new(wake: UnixStream) -> Self {
        Events {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            wake,
        }
    }

    pub fn push(&self, event: E) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        if !self.pending.swap(true, Ordering::AcqRel) {
            // Non-blocking: a full pair means a wake-up is already on its way.
            let _ = (&self.wake).write(&[1]);
        }
    }

    /// Everything pushed so far. The flag is cleared first: an event pushed after this
    /// call's swap writes a new wake-up byte, so none is left unseen.
    pub fn take(&self) -> Vec<E> {
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
