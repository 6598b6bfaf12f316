//! The one way from a native session to the guard: batches of plain data out, verdicts
//! of plain data back.
//!
//! A session hands over one batch per read (the SENDs of it, the MESSAGEs, the
//! ACK/NACKs) and applies its verdicts before it goes on. Two ways to reach Python:
//!
//! - **In the runtime** (a handler is set, see `Bridge::set_handler`): the session's own
//!   thread takes the GIL and calls the handler (`mqguard.sidecar.native_bridge`), which
//!   calls the guard and returns the verdicts. No thread is woken and no queue is
//!   crossed: a batch costs one GIL acquisition on a thread that already runs.
//! - **Through the event queue**: the batch is pushed as an event, the asyncio loop takes
//!   it with `Plane.drain` and answers with `Plane.verdicts(batch, [...])` while the
//!   session awaits it; other sessions keep flowing meanwhile. Notices (batch id 0)
//!   await nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::oneshot;

use crate::transport::events::{Event, Events};

pub type Headers = Vec<(String, String)>;

/// One SEND of a batch: sequence number (the session's), destination, the client's
/// receipt, the message's own headers (first of each name; framing ones left out), body.
pub struct SendItem {
    pub seq: u64,
    pub destination: String,
    pub receipt: Option<String>,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// One MESSAGE to open: subscription id, its destination, whether its queue is a quorum
/// queue, the client's ack mode, ack token, headers (first of each name), body.
pub struct MessageItem {
    pub sub: String,
    pub destination: String,
    pub quorum: bool,
    pub mode: String,
    pub token: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// A MESSAGE over the broker leg's limits (never given to the client): its
/// subscription's id, destination, quorum flag and ack mode, and its ack token, when it
/// is a delivery the guard could settle (None: unsubscribed, browsing, or no token);
/// every header in order, the body (empty when skipped), whether the body was kept, and
/// why it is over the limits.
pub struct OversizedItem {
    pub sub: String,
    pub destination: String,
    pub quorum: bool,
    pub mode: String,
    pub token: Option<String>,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub body_kept: bool,
    pub reason: String,
    pub detail: String,
}

/// One ACK or NACK: command, the tokens it settles, the client's receipt. A batch of
/// ACKs without receipts is told (batch id 0), not asked.
pub struct AckItem {
    pub nack: bool,
    pub tokens: Vec<String>,
    pub receipt: Option<String>,
    /// The subscription the tokens belong to (not handed to Python).
    pub sub: String,
}

/// A frame of a client transaction (BEGIN, COMMIT, ABORT, a SEND or ACK/NACK inside
/// one), decided on its own: sequence number, command, headers (first of each name),
/// body, and for an ACK/NACK the tokens it settles.
pub struct TxItem {
    pub seq: u64,
    pub command: String,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub tokens: Vec<String>,
}

/// What a session asks (or tells) the Python side.
pub enum GuardBatch {
    /// Notice: a client was accepted (peer host, port); its session starts.
    Started(String, u16),
    /// The broker answered CONNECT: peer host and port, version, `server` header, the
    /// broker leg's id (Python's writes to the broker go there). Verdict: the broker kind.
    Open(String, u16, String, Option<String>, u64),
    Sends(Vec<SendItem>),
    Messages(Vec<MessageItem>),
    Acks(Vec<AckItem>),
    /// The client's DISCONNECT: verdict 0, or a hold key (work on the broker leg first).
    Disconnect,
    /// A transaction frame; its verdicts are actions applied in order (see `code`).
    Tx(TxItem),
    /// Nothing to decide: answered once the batches before it are handled.
    Sync,
    /// Notice: SENDs the broker confirmed, in order.
    Confirmed(Vec<u64>),
    /// Notice: a RECEIPT for a frame the guard's own broker-leg work wrote.
    LegReceipt(String),
    /// Notice: an UNSUBSCRIBE handed these unsettled deliveries back to the broker.
    Unsubscribed(Vec<String>),
    /// A MESSAGE over the broker leg's limits: the guard dead-letters it, or hands it
    /// back to the broker (verdict: 0, nothing for the client).
    Oversized(OversizedItem),
    /// Notice: the session ended (outcome), with the SENDs never confirmed and the
    /// number of client receipts that will not come; also for a session that never
    /// opened.
    Ended(String, Vec<u64>, usize),
}

const OPEN: u8 = 0;
const SENDS: u8 = 1;
const MESSAGES: u8 = 2;
const ACKS: u8 = 3;
const DISCONNECT: u8 = 4;
const CONFIRMED: u8 = 5;
const LEG_RECEIPT: u8 = 6;
const UNSUBSCRIBED: u8 = 7;
const ENDED: u8 = 8;
const TX: u8 = 9;
const SYNC: u8 = 10;
const STARTED: u8 = 11;
const OVERSIZED: u8 = 12;

/// One verdict: `(code, number, text, data)`; what each means depends on the batch
/// (see `Code`).
pub type Verdict = (u8, u64, String, Vec<u8>);

/// Verdict codes.
pub mod code {
    /// SEND: answered here (receipt in order); MESSAGE: taken by the guard; ACK: done.
    pub const LOCAL: u8 = 0;
    /// SEND: forward `data` (the encoded SEND, without receipt); MESSAGE: deliver.
    /// Transaction frame: forward the client's frame (empty `data`), or write `data`,
    /// with a receipt of the chain's (tracked under the frame's sequence number) when
    /// `number` is 1.
    pub const FORWARD: u8 = 1;
    /// SEND: ERROR `text` (detail in `data`), the session ends.
    pub const ERROR: u8 = 2;
    /// ACK/NACK, DISCONNECT: hold the receipt until `Plane.release(session, number)`.
    pub const HOLD: u8 = 3;
    /// Transaction frame (ABORT): delivery `text` of subscription `data` is the
    /// client's to settle again.
    pub const RESTORE: u8 = 4;
}

/// Batches in flight, shared by the sessions and `Plane.verdicts`.
#[derive(Clone)]
pub struct Bridge {
    events: Arc<Events>,
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<Verdict>>>>>,
    next: Arc<AtomicU64>,
    /// `handler(session, asked, (kind, payload))`: called in the runtime when set.
    handler: Arc<OnceLock<Py<PyAny>>>,
}

impl Bridge {
    pub fn new(events: Arc<Events>) -> Bridge {
        Bridge {
            events,
            waiting: Arc::default(),
            next: Arc::new(AtomicU64::new(1)),
            handler: Arc::default(),
        }
    }

    /// From now on batches are handed to `handler` on the session's thread; false if
    /// one was set already.
    pub fn set_handler(&self, handler: Py<PyAny>) -> bool {
        self.handler.set(handler).is_ok()
    }

    /// Hand `batch` to the guard and wait for its verdicts; None when the Python side
    /// failed (or is gone): the session ends.
    pub async fn ask(&self, session: u64, batch: GuardBatch) -> Option<Vec<Verdict>> {
        if let Some(handler) = self.handler.get() {
            return call_handler(handler, session, true, batch);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.events.push(Event::Guard(session, id, batch));
        rx.await.ok()
    }

    pub fn tell(&self, session: u64, batch: GuardBatch) {
        if let Some(handler) = self.handler.get() {
            call_handler(handler, session, false, batch);
            return;
        }
        self.events.push(Event::Guard(session, 0, batch));
    }

    /// Python's answer to batch `id`; None: it failed.
    pub fn answer(&self, id: u64, verdicts: Option<Vec<Verdict>>) {
        let waiter = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        if let (Some(waiter), Some(verdicts)) = (waiter, verdicts) {
            let _ = waiter.send(verdicts);
        }
    }
}

/// A verdict as Python gives it (see `Verdict`).
pub type PyVerdict<'py> = (u8, u64, String, Bound<'py, PyBytes>);

/// Python's verdicts as the session applies them.
pub fn verdicts_from_py(list: Vec<PyVerdict<'_>>) -> Vec<Verdict> {
    list.into_iter()
        .map(|(code, number, text, data)| (code, number, text, data.as_bytes().to_vec()))
        .collect()
}

/// One batch through `handler`, on this thread with the GIL; None when it raised (or
/// answered what is not a list of verdicts), after the error is printed.
fn call_handler(handler: &Py<PyAny>, session: u64, asked: bool, batch: GuardBatch) -> Option<Vec<Verdict>> {
    Python::attach(|py| {
        let answer = batch_into_py(py, batch)
            .and_then(|payload| handler.call1(py, (session, asked, payload)))
            .and_then(|answer| {
                if answer.is_none(py) {
                    Ok(None)
                } else {
                    answer.extract::<Vec<PyVerdict<'_>>>(py).map(|list| Some(verdicts_from_py(list)))
                }
            });
        answer.unwrap_or_else(|error| {
            error.print(py);
            None
        })
    })
}

/// Where a delivery came in: its subscription, that subscription's destination, whether
/// its queue is a quorum queue, the client's ack mode.
struct Delivered {
    sub: String,
    destination: String,
    quorum: bool,
    mode: String,
}

/// The fields a MESSAGE item and an oversized one start with, in Python's order:
/// subscription, destination, quorum, mode, token, headers, body.
fn delivery_fields<'py, T>(
    py: Python<'py>,
    at: Delivered,
    token: T,
    headers: Headers,
    body: &[u8],
) -> PyResult<Vec<Bound<'py, PyAny>>>
where
    T: IntoPyObject<'py>,
{
    Ok(vec![
        at.sub.into_pyobject(py)?.into_any(),
        at.destination.into_pyobject(py)?.into_any(),
        pyo3::types::PyBool::new(py, at.quorum).to_owned().into_any(),
        at.mode.into_pyobject(py)?.into_any(),
        token.into_bound_py_any(py)?,
        headers_py(py, headers)?.into_any(),
        PyBytes::new(py, body).into_any(),
    ])
}

fn headers_py<'py>(py: Python<'py>, headers: Headers) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, headers)
}

/// `(kind, payload)` as `Plane.drain` hands a batch to Python.
pub fn batch_into_py<'py>(py: Python<'py>, batch: GuardBatch) -> PyResult<Bound<'py, PyAny>> {
    let (kind, payload): (u8, Bound<'py, PyAny>) = match batch {
        GuardBatch::Open(host, port, version, server, broker_leg) => {
            (OPEN, (host, port, version, server, broker_leg).into_pyobject(py)?.into_any())
        }
        GuardBatch::Sends(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append((
                    item.seq,
                    item.destination,
                    item.receipt,
                    headers_py(py, item.headers)?,
                    PyBytes::new(py, &item.body),
                ))?;
            }
            (SENDS, list.into_any())
        }
        GuardBatch::Messages(items) => {
            let list = PyList::empty(py);
            for item in items {
                let fields = delivery_fields(
                    py,
                    Delivered { sub: item.sub, destination: item.destination, quorum: item.quorum, mode: item.mode },
                    item.token,
                    item.headers,
                    &item.body,
                )?;
                list.append(PyTuple::new(py, fields)?)?;
            }
            (MESSAGES, list.into_any())
        }
        GuardBatch::Oversized(item) => {
            let mut fields = delivery_fields(
                py,
                Delivered { sub: item.sub, destination: item.destination, quorum: item.quorum, mode: item.mode },
                item.token,
                item.headers,
                &item.body,
            )?;
            fields.extend([
                pyo3::types::PyBool::new(py, item.body_kept).to_owned().into_any(),
                item.reason.into_pyobject(py)?.into_any(),
                item.detail.into_pyobject(py)?.into_any(),
            ]);
            (OVERSIZED, PyTuple::new(py, fields)?.into_any())
        }
        GuardBatch::Acks(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append((item.nack, item.tokens, item.receipt))?;
            }
            (ACKS, list.into_any())
        }
        GuardBatch::Disconnect => (DISCONNECT, py.None().into_bound(py)),
        GuardBatch::Sync => (SYNC, py.None().into_bound(py)),
        GuardBatch::Started(host, port) => (STARTED, (host, port).into_pyobject(py)?.into_any()),
        GuardBatch::Tx(item) => (
            TX,
            (item.seq, item.command, headers_py(py, item.headers)?, PyBytes::new(py, &item.body), item.tokens)
                .into_pyobject(py)?
                .into_any(),
        ),
        GuardBatch::Confirmed(seqs) => (CONFIRMED, seqs.into_pyobject(py)?.into_any()),
        GuardBatch::LegReceipt(id) => (LEG_RECEIPT, id.into_pyobject(py)?.into_any()),
        GuardBatch::Unsubscribed(tokens) => (UNSUBSCRIBED, tokens.into_pyobject(py)?.into_any()),
        GuardBatch::Ended(outcome, failed, lost) => {
            (ENDED, (outcome, failed, lost).into_pyobject(py)?.into_any())
        }
    };
    Ok((kind, payload).into_pyobject(py)?.into_any())
}
