//! One client connection served end to end on the tokio runtime: the handshake, then
//! every frame of both legs, the guard consulted once per read batch (see `bridge`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::{timeout_at, Instant};

use super::bridge::{code, AckItem, Bridge, GuardBatch, MessageItem, SendItem, TxItem};
use super::bypass::{settle_frame, Bypass, FRAMING_SEND_HEADERS};
use super::chain::{Chain, Output, CHAIN_RECEIPT_PREFIX};
use super::subs::{Subs, ACK_MODES};
use super::tally::UpstreamFailure;
use super::wire::{error_frame, first_headers, receipt_frame, remove_header, set_header};
use crate::stomp::{encode, wire_of, with_plain_header, FrameError, Item, RawFrame, Version};
use crate::transport::events::Event;
use crate::transport::leg::{Shared, PY, STOP};

mod drain;
mod oversized;

/// Prefix of the receipts the guard's own broker-leg work waits for (Python's
/// `mqguard.sidecar.upstream.LEG_RECEIPT_PREFIX`).
const LEG_RECEIPT_PREFIX: &str = "mqguard-i-";
/// Confirmed SENDs (and ACKs owing the client nothing) are told to the guard with the
/// session's next batch, or after this long without one: a RECEIPT or such an ACK
/// alone never wakes the Python side.
const CONFIRM_DELAY: Duration = Duration::from_millis(1);
/// ... or once this many are waiting.
const CONFIRM_BATCH: usize = 256;
/// A broker heart-beat goes on to the client unless one went less than this long ago.
/// EOLs bunched together say nothing more than one, and a client that reads two of them
/// in one go right before a frame can take them for that frame's start: stomp.py then
/// drops the frame (RabbitMQ's EOL after a frame's NUL often arrives in a read of its
/// own and is passed on as a heart-beat, so two in a row are common).
const HEARTBEAT_GAP: Duration = Duration::from_millis(100);
/// How long a leg's queued octets may take to leave once its session ended; a peer
/// that reads nothing meanwhile is reset, instead of holding the socket and its
/// buffers forever (as `FrameConnection.close` does on the asyncio plane).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// A `Host::connect` error: no descriptor was left for the broker connection. The
/// sidecar's limit, not the broker's fault: the client is told so.
pub const NO_DESCRIPTOR: &str = "too many connections: the sidecar is out of file descriptors; try again later";

pub type Connecting = Pin<Box<dyn Future<Output = Result<Arc<Shared>, String>> + Send>>;

/// What a session needs from the plane that runs it.
pub trait Host: Send + Sync + 'static {
    /// Open the broker leg, its reads handed to `sink`.
    fn connect(&self, sink: UnboundedSender<Event>) -> Connecting;
    /// The leg is done with: Python's writes no longer reach it.
    fn forget(&self, leg: u64);
    /// The session has its first frame: it no longer waits for its CONNECT.
    fn handshake_over(&self, _session: u64) {}
    /// The session ended.
    fn ended(&self, _session: u64) {}
}

pub struct SessionConfig {
    /// Frames relayed, for `/metrics`.
    pub tally: Arc<super::FrameTally>,
    pub connect_timeout: Duration,
    pub drain_timeout: Duration,
    /// The broker's address as the logs name it (no credentials).
    pub upstream_where: String,
    /// The plane's live sessions, told when it closes.
    pub stopping: Arc<super::Stopping>,
    /// Client connections ended by a malformed or over-limit frame, for `/metrics`.
    pub protocol_errors: Arc<std::sync::atomic::AtomicU64>,
}

pub struct Session {
    id: u64,
    host: Arc<dyn Host>,
    bridge: Bridge,
    config: Arc<SessionConfig>,
    client: Arc<Shared>,
    broker: Option<Arc<Shared>>,
    rx: UnboundedReceiver<Event>,
    tx: UnboundedSender<Event>,
    peer: (String, u16),
    version: Version,
    chain: Chain,
    subs: Subs,
    next_seq: u64,
    confirmed: Vec<u64>,
    /// The client's side is over (DISCONNECT, or the session's ERROR is queued).
    client_done: bool,
    /// The session's (or the broker's) ERROR is queued: nothing else may follow it.
    ending: bool,
    client_over: Option<String>,
    broker_over: Option<String>,
    pending_disconnect: Option<RawFrame>,
    disconnect_sent: bool,
    /// The client leg reported itself closed.
    client_closed: bool,
    /// Events met during the handshake, handled once relaying starts.
    deferred: VecDeque<Event>,
    /// Octets queued for each leg (see `flush`).
    to_client: Vec<u8>,
    to_broker: Vec<u8>,
    /// A batch was told, not asked, since the last answer (see `sync`).
    told: bool,
    /// ACKs owing the client nothing, told with the next batch or after CONFIRM_DELAY.
    acks: Vec<AckItem>,
    /// When the last broker heart-beat went to the client (see `relay_heartbeat`).
    heartbeat_sent: Option<Instant>,
    /// What the session does without the guard (told when the session opens).
    bypass: Bypass,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        host: Arc<dyn Host>,
        bridge: Bridge,
        config: Arc<SessionConfig>,
        client: Arc<Shared>,
        rx: UnboundedReceiver<Event>,
        tx: UnboundedSender<Event>,
        peer: (String, u16),
    ) -> Session {
        Session {
            id: client.id,
            host,
            bridge,
            config,
            client,
            broker: None,
            rx,
            tx,
            peer,
            version: Version::V10,
            chain: Chain::default(),
            subs: Subs::default(),
            next_seq: 0,
            confirmed: Vec::new(),
            client_done: false,
            ending: false,
            client_over: None,
            broker_over: None,
            pending_disconnect: None,
            disconnect_sent: false,
            client_closed: false,
            deferred: VecDeque::new(),
            to_client: Vec::new(),
            to_broker: Vec::new(),
            told: false,
            acks: Vec::new(),
            heartbeat_sent: None,
            bypass: Bypass::default(),
        }
    }

    /// Serve the connection to its end.
    pub async fn run(mut self) {
        self.bridge.tell(self.id, GuardBatch::Started(self.peer.0.clone(), self.peer.1));
        let stopping = self.config.stopping.clone();
        let (_live, stopped) = stopping.enter(self.id, self.tx.clone());
        let outcome = if stopped {
            self.send_error(super::STOP_MESSAGE, None, "");
            "shutdown".into()
        } else {
            match self.handshake().await {
                Ok(()) => self.relay().await,
                Err(outcome) => outcome,
            }
        };
        self.finish(outcome).await;
        self.await_client_closed().await;
    }

    // -- handshake -------------------------------------------------------------------

    async fn handshake(&mut self) -> Result<(), String> {
        let seconds = self.config.connect_timeout.as_secs_f64();
        let deadline = Instant::now() + self.config.connect_timeout;
        let connect = loop {
            let event = match timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => event,
                Ok(None) => return Err("no-connect".into()),
                Err(_) => {
                    self.send_error(&format!("no CONNECT frame within {seconds} s"), None, "");
                    return Err("no-connect".into());
                }
            };
            match event {
                Event::Items(id, items, size, error) if id == self.id => {
                    self.client.drained(size);
                    self.config.tally.read(true, size);
                    let mut items = items.into_iter();
                    let first = items.by_ref().find_map(|item| match item {
                        Item::Frame(frame) => Some(frame),
                        _ => None,
                    });
                    if first.is_some() {
                        self.host.handshake_over(self.id);
                    }
                    match first {
                        Some(frame) => {
                            let rest: Vec<Item> = items.collect();
                            if !rest.is_empty() || error.is_some() {
                                self.deferred.push_back(Event::Items(id, rest, 0, error));
                            }
                            if frame.command != "CONNECT" && frame.command != "STOMP" {
                                self.send_error(&format!("expected CONNECT, got {}", frame.command), None, "");
                                return Err("no-connect".into());
                            }
                            break frame;
                        }
                        None => {
                            if let Some(error) = error {
                                self.protocol_error(&error);
                                return Err("protocol-error".into());
                            }
                        }
                    }
                }
                Event::Eof(id) if id == self.id => {
                    self.truncated_frame();
                    return Err("no-connect".into());
                }
                Event::Closed(id, _) if id == self.id => {
                    self.client_closed = true;
                    return Err("no-connect".into());
                }
                Event::Stop => {
                    self.send_error(super::STOP_MESSAGE, None, "");
                    return Err("shutdown".into());
                }
                Event::Evicted(reason) => {
                    self.send_error(&reason, None, "");
                    return Err("no-connect".into());
                }
                _ => {}
            }
        };
        let broker = match timeout_at(deadline, self.host.connect(self.tx.clone())).await {
            Ok(Ok(broker)) => broker,
            Ok(Err(text)) if text == NO_DESCRIPTOR => {
                self.send_error(NO_DESCRIPTOR, None, "");
                return Err("broker-refused".into());
            }
            Ok(Err(text)) => {
                self.config.tally.upstream_failure(UpstreamFailure::Connect);
                let detail = format!("{}: {text}", self.config.upstream_where);
                self.send_error("broker unreachable", None, &detail);
                return Err("broker-refused".into());
            }
            Err(_) => {
                self.config.tally.upstream_failure(UpstreamFailure::Connect);
                let detail = format!("{}: timed out", self.config.upstream_where);
                self.send_error("broker unreachable", None, &detail);
                return Err("broker-refused".into());
            }
        };
        self.client.couple(Some(broker.clone()));
        broker.couple(Some(self.client.clone()));
        self.broker = Some(broker.clone());
        match encode(&connect, Version::V10) {
            Ok(data) => broker.write(&data),
            Err(error) => {
                self.send_error(&format!("CONNECT cannot be forwarded: {}", error.reason), None, "");
                return Err("broker-refused".into());
            }
        }
        loop {
            let event = match timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => event,
                Ok(None) => return Err("broker-refused".into()),
                Err(_) => {
                    self.config.tally.upstream_failure(UpstreamFailure::Connect);
                    self.send_error(&format!("broker did not answer CONNECT within {seconds} s"), None, "");
                    return Err("broker-refused".into());
                }
            };
            match event {
                Event::Items(id, items, size, error) if id == broker.id => {
                    broker.drained(size);
                    self.config.tally.read(false, size);
                    let mut items = items.into_iter();
                    let first = items.by_ref().find_map(|item| match item {
                        Item::Frame(frame) => Some(frame),
                        _ => None,
                    });
                    let Some(frame) = first else {
                        if error.is_some() {
                            self.config.tally.broker_protocol_error();
                            self.send_error("the broker sent a malformed frame during CONNECT", None, "");
                            return Err("broker-refused".into());
                        }
                        continue;
                    };
                    if frame.command != "CONNECTED" {
                        // ERROR (bad credentials...): the client gets the broker's own words.
                        if let Ok(data) = wire_of(&frame, Version::V10) {
                            self.client.write(&data);
                        }
                        self.client_done = true;
                        self.ending = true;
                        return Err("broker-refused".into());
                    }
                    let rest: Vec<Item> = items.collect();
                    if !rest.is_empty() || error.is_some() {
                        self.deferred.push_back(Event::Items(id, rest, 0, error));
                    }
                    return self.connected(frame, &broker).await;
                }
                Event::Eof(id) | Event::Closed(id, _) if id == broker.id => {
                    self.config.tally.upstream_failure(UpstreamFailure::Connect);
                    self.send_error("broker closed the connection during CONNECT", None, "");
                    return Err("broker-refused".into());
                }
                other => self.deferred.push_back(other),
            }
        }
    }

    async fn connected(&mut self, frame: RawFrame, broker: &Arc<Shared>) -> Result<(), String> {
        let version = frame.get("version").unwrap_or("1.0").to_owned();
        self.version = Version::parse(&version).unwrap_or(Version::V10);
        let opened = self
            .bridge
            .ask(
                self.id,
                GuardBatch::Open(
                    self.peer.0.clone(),
                    self.peer.1,
                    self.version.as_str().to_owned(),
                    frame.get("server").map(str::to_owned),
                    broker.id,
                ),
            )
            .await;
        let Some(opened) = opened else {
            self.internal_error();
            return Err("error".into());
        };
        self.bypass = Bypass::from_verdicts(&opened);
        self.client.set_decoding(self.version, false);
        // From now on one MESSAGE over the broker leg's limits is dead-lettered, not the
        // end of the session (see `oversized`).
        broker.set_decoding(self.version, true);
        if let Ok(data) = wire_of(&frame, self.version) {
            self.client.write(&data);
        }
        // Held since its CONNECT was complete (see `transport::handshake`).
        self.client.set_pause(PY, false);
        Ok(())
    }

    // -- relaying --------------------------------------------------------------------

    async fn relay(&mut self) -> String {
        let mut deadline: Option<Instant> = None;
        while self.broker_over.is_none() {
            if self.client_over.is_some() && deadline.is_none() {
                // Let the broker confirm what it was given before the connection goes.
                self.client.set_pause(STOP, true);
                if self.pending_disconnect.is_none() && !self.disconnect_sent && !self.ending {
                    self.disconnect(RawFrame::new("DISCONNECT", Vec::new(), Vec::new())).await;
                    self.flush();
                }
                deadline = Some(Instant::now() + self.config.drain_timeout);
            }
            let event = match self.deferred.pop_front() {
                Some(event) => event,
                None => {
                    let mut at = deadline;
                    if !self.confirmed.is_empty() || !self.acks.is_empty() {
                        let soon = Instant::now() + CONFIRM_DELAY;
                        at = Some(at.map_or(soon, |at| at.min(soon)));
                    }
                    let received = match at {
                        Some(at) => match timeout_at(at, self.rx.recv()).await {
                            Ok(received) => received,
                            Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => break,
                            Err(_) => {
                                self.tell_confirmed();
                                continue;
                            }
                        },
                        None => self.rx.recv().await,
                    };
                    match received {
                        Some(event) => self.coalesce(event),
                        None => break,
                    }
                }
            };
            self.on_event(event).await;
            self.flush();
            if self.confirmed.len() + self.acks.len() >= CONFIRM_BATCH {
                self.tell_confirmed();
            }
            if self.ending && self.client_over.is_some() && self.chain.is_empty() {
                // The session's ERROR is written, behind every receipt owed before it:
                // nothing is left to wait for.
                break;
            }
        }
        self.tell_confirmed();
        if let Some(outcome) = self.client_over.clone() {
            return outcome;
        }
        let outcome = self.broker_over.clone().unwrap_or_else(|| "broker-closed".into());
        if !self.client_done {
            self.send_error("broker connection lost", None, &outcome);
        }
        outcome
    }

    async fn on_event(&mut self, event: Event) {
        let broker_id = self.broker.as_ref().map_or(0, |b| b.id);
        match event {
            Event::Items(id, items, size, error) if id == self.id => {
                self.client.drained(size);
                self.config.tally.read(true, size);
                if self.client_over.is_some() {
                    return;
                }
                self.on_client_items(items).await;
                if self.client_done {
                    // Whatever followed the client's DISCONNECT (or the session's ERROR)
                    // in the same read is not read at all.
                    self.client_over.get_or_insert_with(|| "disconnect".into());
                }
                if let Some(error) = error {
                    if !self.client_done {
                        self.protocol_error(&error);
                    }
                    self.client_over.get_or_insert_with(|| "protocol-error".into());
                }
            }
            Event::Items(id, items, size, error) if id == broker_id => {
                if let Some(broker) = &self.broker {
                    broker.drained(size);
                }
                self.config.tally.read(false, size);
                if let Some(outcome) = self.on_broker_items(items).await {
                    self.broker_over = Some(outcome);
                } else if let Some(error) = error {
                    self.config.tally.broker_protocol_error();
                    self.broker_over = Some(format!("broker sent a malformed frame: {}", error.reason));
                }
            }
            Event::Eof(id) if id == self.id && self.client_over.is_none() => {
                let outcome = if self.truncated_frame() { "client-lost" } else { "client-closed" };
                self.client_over = Some(outcome.into());
            }
            Event::Closed(id, _) if id == self.id => {
                self.client_closed = true;
                self.client_over.get_or_insert_with(|| "client-lost".into());
            }
            Event::Eof(id) | Event::Closed(id, _) if id == broker_id => {
                if self.broker_over.is_none() && !self.disconnect_sent && !self.ending {
                    // The broker went while the client was still being served (not after
                    // a DISCONNECT, an ERROR or a drain: the session ended those itself).
                    self.config.tally.upstream_failure(UpstreamFailure::Lost);
                }
                self.broker_over = Some("broker-closed".into());
            }
            Event::Released(key) => {
                let mut out = Vec::new();
                self.chain.released(key, &mut out);
                self.apply(out);
                self.flush_disconnect();
            }
            Event::Stop => self.on_stop().await,
            _ => {}
        }
    }

    /// `event` and the reads of the same leg queued right behind it, as one read: under
    /// load the guard then decides bigger batches (the same outcome as one by one).
    fn coalesce(&mut self, event: Event) -> Event {
        let Event::Items(id, mut items, mut size, None) = event else {
            return event;
        };
        loop {
            match self.rx.try_recv() {
                Ok(Event::Items(next, more, more_size, error)) if next == id => {
                    items.extend(more);
                    size += more_size;
                    if error.is_some() {
                        return Event::Items(id, items, size, error);
                    }
                }
                Ok(other) => {
                    self.deferred.push_back(other);
                    break;
                }
                Err(_) => break,
            }
        }
        Event::Items(id, items, size, None)
    }

    /// Ask the guard; the SENDs confirmed so far are told first (the same wake-up).
    async fn ask(&mut self, batch: GuardBatch) -> Option<Vec<super::Verdict>> {
        self.tell_confirmed();
        self.flush();
        let verdicts = self.bridge.ask(self.id, batch).await;
        // The Python side handles batches in order: it is done with the told ones too.
        self.told = false;
        verdicts
    }

    /// Before a frame goes to the broker without the guard: wait until the guard has
    /// written what told batches made it write (acknowledgements), so the broker sees
    /// them first.
    async fn sync(&mut self) {
        if self.told {
            let _ = self.ask(GuardBatch::Sync).await;
        }
    }

    fn tell_confirmed(&mut self) {
        if !self.acks.is_empty() {
            // What the session wrote to the broker before them goes first.
            self.flush();
            let acks = std::mem::take(&mut self.acks);
            self.bridge.tell(self.id, GuardBatch::Acks(acks));
        }
        if !self.confirmed.is_empty() {
            let seqs = std::mem::take(&mut self.confirmed);
            self.bridge.tell(self.id, GuardBatch::Confirmed(seqs));
        }
    }

    async fn finish(&mut self, outcome: String) {
        if !self.acks.is_empty() {
            // The guard's acknowledgements of them reach the broker leg before it closes.
            let _ = self.ask(GuardBatch::Sync).await;
        }
        let failed = self.chain.fail_all();
        self.apply(failed.outputs);
        self.flush();
        self.tell_confirmed();
        // Told also of a session that never opened: its outcome is counted.
        self.host.ended(self.id);
        self.bridge.tell(self.id, GuardBatch::Ended(outcome, failed.sends, failed.lost_receipts));
        close_or_reset(&self.client);
        self.host.forget(self.id);
        if let Some(broker) = &self.broker {
            close_or_reset(broker);
            self.host.forget(broker.id);
        }
    }

    // -- writing ---------------------------------------------------------------------

    /// Queued for the broker: what one event makes leaves in one write (`flush`).
    fn write_broker(&mut self, data: &[u8]) {
        self.to_broker.extend_from_slice(data);
    }

    fn write_client(&mut self, data: &[u8]) {
        self.to_client.extend_from_slice(data);
    }

    /// A heart-beat from the broker, unless one went to the client within HEARTBEAT_GAP.
    fn relay_heartbeat(&mut self) {
        let now = Instant::now();
        if self.heartbeat_sent.is_some_and(|at| now.duration_since(at) < HEARTBEAT_GAP) {
            return;
        }
        self.heartbeat_sent = Some(now);
        self.write_client(b"\n");
    }

    fn write_client_frame(&mut self, frame: &RawFrame) {
        if let Ok(data) = wire_of(frame, self.version) {
            self.to_client.extend_from_slice(&data);
        }
    }

    /// Write what is queued for either leg. Before every batch for the guard too: what
    /// the guard writes to the broker must follow what the session queued before it.
    fn flush(&mut self) {
        if !self.to_broker.is_empty() {
            if let Some(broker) = &self.broker {
                broker.write(&self.to_broker);
            }
            self.to_broker.clear();
        }
        if !self.to_client.is_empty() {
            self.client.write(&self.to_client);
            self.to_client.clear();
        }
    }

    fn apply(&mut self, out: Vec<Output>) {
        for output in out {
            match output {
                Output::Receipt(id) => {
                    let data = receipt_frame(&id, self.version);
                    self.write_client(&data);
                }
                Output::Confirmed(seq) => self.confirmed.push(seq),
                Output::Last(data) => self.write_client(&data),
            }
        }
    }

    /// The ERROR frame, queued behind the receipts owed for earlier frames: the
    /// client's last frame (STOMP: ERROR, then close).
    fn send_error(&mut self, message: &str, receipt: Option<&str>, detail: &str) {
        if self.ending {
            return;
        }
        let data = error_frame(message, receipt, detail, self.version);
        let mut out = Vec::new();
        self.chain.last(data, &mut out);
        self.apply(out);
        self.client_done = true;
        self.ending = true;
    }

    fn fail(&mut self, message: &str, receipt: Option<&str>, detail: &str) {
        self.send_error(message, receipt, detail);
        self.client_over.get_or_insert_with(|| "client-error".into());
    }

    fn internal_error(&mut self) {
        self.send_error("internal error in the sidecar; connection closed", None, "");
        self.client_over.get_or_insert_with(|| "error".into());
    }

    fn protocol_error(&mut self, error: &FrameError) {
        self.count_protocol_error();
        let detail: String = error.to_string().chars().take(500).collect();
        self.send_error(error.reason, None, &detail);
    }

    /// At the client's end of stream: true (and an ERROR) if it ended inside a frame.
    fn truncated_frame(&mut self) -> bool {
        if self.client.buffered() == 0 {
            return false;
        }
        self.count_protocol_error();
        self.send_error("incomplete frame: the connection ended in the middle of a frame", None, "");
        true
    }

    /// Once per connection, as the ERROR it gets.
    fn count_protocol_error(&self) {
        if !self.ending {
            self.config.protocol_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    // -- client frames ---------------------------------------------------------------

    async fn on_client_items(&mut self, items: Vec<Item>) {
        let mut items = items.into_iter().peekable();
        while let Some(item) = items.next() {
            if self.client_done {
                return;
            }
            let frame = match item {
                Item::Heartbeat => {
                    self.write_broker(b"\n");
                    continue;
                }
                Item::Oversized(over) => {
                    let error = FrameError::new(over.reason, over.detail);
                    self.protocol_error(&error);
                    self.client_over.get_or_insert_with(|| "protocol-error".into());
                    return;
                }
                Item::Frame(frame) => frame,
            };
            self.config.tally.client(&frame.command);
            match frame.command.as_str() {
                "SEND" if plain_send(&frame) => {
                    let mut run = vec![frame];
                    while let Some(Item::Frame(next)) = items.peek() {
                        if next.command != "SEND" || !plain_send(next) {
                            break;
                        }
                        if let Some(Item::Frame(next)) = items.next() {
                            run.push(next);
                        }
                    }
                    for _ in 1..run.len() {
                        self.config.tally.client("SEND");
                    }
                    self.on_sends(run).await;
                }
                "SEND" => {
                    let receipt = frame.get("receipt").map(str::to_owned);
                    if !frame.get("destination").is_some_and(|d| !d.is_empty()) {
                        self.fail("SEND without a destination header", receipt.as_deref(), "");
                    } else {
                        self.on_transaction_frame(frame, Vec::new()).await;
                    }
                }
                "ACK" | "NACK" if frame.get("transaction").is_none() => {
                    let mut run = vec![frame];
                    while let Some(Item::Frame(next)) = items.peek() {
                        if !matches!(next.command.as_str(), "ACK" | "NACK") || next.get("transaction").is_some() {
                            break;
                        }
                        if let Some(Item::Frame(next)) = items.next() {
                            run.push(next);
                        }
                    }
                    for next in &run[1..] {
                        self.config.tally.client(&next.command);
                    }
                    self.on_acks(run).await;
                }
                "ACK" | "NACK" => {
                    let token = if self.version == Version::V12 { frame.get("id") } else { frame.get("message-id") };
                    match token.filter(|token| self.subs.tracks(token)).map(str::to_owned) {
                        Some(token) if self.bypass.deliveries => self.settle_in_transaction(frame, &token).await,
                        Some(token) => {
                            let tokens = self.subs.take_covered(&token);
                            self.on_transaction_frame(frame, tokens).await;
                        }
                        // Not a delivery the guard tracks: the broker has the final word.
                        None => {
                            self.sync().await;
                            self.forward(frame);
                        }
                    }
                }
                "BEGIN" => self.on_transaction_frame(frame, Vec::new()).await,
                "COMMIT" | "ABORT" => {
                    let transaction = frame.get("transaction").unwrap_or_default().to_owned();
                    let abort = frame.command == "ABORT";
                    self.on_transaction_frame(frame, Vec::new()).await;
                    if self.bypass.deliveries && !self.client_done {
                        // Acks inside an aborted transaction are void: those deliveries
                        // are the client's to settle again.
                        let acked = self.bypass.transaction_over(&transaction);
                        if abort {
                            for (sub, token) in acked {
                                self.subs.delivered(&sub, token);
                            }
                        }
                    }
                }
                "SUBSCRIBE" => {
                    self.sync().await;
                    self.on_subscribe(frame);
                }
                "UNSUBSCRIBE" => {
                    self.sync().await;
                    self.on_unsubscribe(frame);
                }
                "DISCONNECT" => {
                    self.disconnect(frame).await;
                    self.client_done = true;
                }
                command => {
                    let text = format!("{command} on a connection that is already connected");
                    self.fail(&text, None, "");
                }
            }
        }
    }

    /// A frame of a client transaction, decided on its own; the verdicts are actions,
    /// applied in order (the client's receipt goes with the last one).
    async fn on_transaction_frame(&mut self, mut frame: RawFrame, tokens: Vec<String>) {
        self.next_seq += 1;
        let seq = self.next_seq;
        let receipt = frame.get("receipt").map(str::to_owned);
        let item = TxItem {
            seq,
            command: frame.command.clone(),
            headers: first_headers(&frame, &["content-length"]),
            body: std::mem::take(&mut frame.body),
            tokens,
        };
        let Some(verdicts) = self.ask(GuardBatch::Tx(item)).await else {
            self.internal_error();
            return;
        };
        let mut frame = Some(frame);
        for (kind, number, text, data) in verdicts {
            match kind {
                code::FORWARD if data.is_empty() => {
                    if let Some(frame) = frame.take() {
                        self.forward(frame);
                    }
                }
                code::FORWARD if number == 1 => {
                    let id = self.chain.expect(receipt.clone(), Some(seq));
                    match with_plain_header(&data, "receipt", &id) {
                        Some(data) => self.write_broker(&data),
                        None => {
                            self.internal_error();
                            return;
                        }
                    }
                }
                code::FORWARD => self.write_broker(&data),
                code::ERROR => {
                    let detail = String::from_utf8_lossy(&data).into_owned();
                    self.fail(&text, receipt.as_deref(), &detail);
                    return;
                }
                code::HOLD => self.chain.hold(receipt.clone(), number),
                code::RESTORE => {
                    let sub = String::from_utf8_lossy(&data).into_owned();
                    self.subs.delivered(&sub, text);
                }
                _ => {
                    let mut out = Vec::new();
                    self.chain.local(receipt.clone(), &mut out);
                    self.apply(out);
                }
            }
        }
    }

    /// An ACK or NACK of tracked `token` inside a transaction, without the guard (see
    /// `bypass`): the guard checks the transaction, then each delivery it covers is
    /// settled with the transaction's id.
    async fn settle_in_transaction(&mut self, frame: RawFrame, token: &str) {
        let sub = self.subs.sub_of(token).unwrap_or_default().to_owned();
        let tokens = self.subs.take_covered(token);
        let transaction = frame.get("transaction").unwrap_or_default().to_owned();
        let command = frame.command.clone();
        self.on_transaction_frame(frame, Vec::new()).await;
        if self.client_done {
            return;
        }
        for token in &tokens {
            let data = settle_frame(&command, self.version, token, &sub, Some(&transaction));
            self.write_broker(&data);
        }
        if command == "ACK" {
            self.bypass.acked_in(&transaction, tokens.into_iter().map(|token| (sub.clone(), token)));
        }
    }

    /// Forward a client frame; its receipt (if asked for) comes back through the chain.
    fn forward(&mut self, mut frame: RawFrame) {
        if let Some(receipt) = frame.get("receipt").map(str::to_owned) {
            let id = self.chain.expect(Some(receipt), None);
            set_header(&mut frame, "receipt", &id);
        }
        match encode(&frame, self.version) {
            Ok(data) => self.write_broker(&data),
            Err(error) => {
                let text = format!("{} cannot be forwarded: {}", frame.command, error.reason);
                self.fail(&text, None, "");
            }
        }
    }

    /// The SENDs of one read, in order: those the guard need not see forwarded here
    /// (see `bypass`), the others decided in batches of consecutive ones.
    async fn on_sends(&mut self, run: Vec<RawFrame>) {
        if !self.bypass.sends {
            self.ask_sends(run).await;
            return;
        }
        let mut guarded = Vec::new();
        for frame in run {
            let receipt = frame.get("receipt").map(str::to_owned);
            match self.bypass.send(frame, self.version) {
                Ok(data) => {
                    if !guarded.is_empty() {
                        // Those before it first, as the client sent them.
                        self.ask_sends(std::mem::take(&mut guarded)).await;
                    }
                    if self.client_done {
                        return;
                    }
                    self.next_seq += 1;
                    // No sequence number: nobody is told when the broker confirms it.
                    let id = self.chain.expect(receipt, None);
                    match with_plain_header(&data, "receipt", &id) {
                        Some(data) => self.write_broker(&data),
                        None => {
                            self.internal_error();
                            return;
                        }
                    }
                    self.config.tally.bypassed_send();
                }
                Err(frame) => guarded.push(frame),
            }
        }
        if !guarded.is_empty() {
            self.ask_sends(guarded).await;
        }
    }

    async fn ask_sends(&mut self, run: Vec<RawFrame>) {
        let mut items = Vec::with_capacity(run.len());
        for mut frame in run {
            self.next_seq += 1;
            items.push(SendItem {
                seq: self.next_seq,
                destination: frame.get("destination").unwrap_or_default().to_owned(),
                receipt: frame.get("receipt").map(str::to_owned),
                headers: first_headers(&frame, &FRAMING_SEND_HEADERS),
                body: std::mem::take(&mut frame.body),
            });
        }
        let receipts: Vec<(u64, Option<String>)> = items.iter().map(|i| (i.seq, i.receipt.clone())).collect();
        let Some(verdicts) = self.ask(GuardBatch::Sends(items)).await else {
            self.internal_error();
            return;
        };
        for ((seq, receipt), (kind, _, text, data)) in receipts.into_iter().zip(verdicts) {
            match kind {
                code::FORWARD => {
                    let id = self.chain.expect(receipt, Some(seq));
                    match with_plain_header(&data, "receipt", &id) {
                        Some(data) => self.write_broker(&data),
                        None => {
                            self.internal_error();
                            return;
                        }
                    }
                }
                code::ERROR => {
                    let detail = String::from_utf8_lossy(&data).into_owned();
                    self.fail(&text, receipt.as_deref(), &detail);
                    return;
                }
                _ => {
                    let mut out = Vec::new();
                    self.chain.local(receipt, &mut out);
                    self.apply(out);
                }
            }
        }
    }

    async fn on_acks(&mut self, run: Vec<RawFrame>) {
        let mut batch: Vec<AckItem> = Vec::new();
        for frame in run {
            let token = if self.version == Version::V12 { frame.get("id") } else { frame.get("message-id") };
            match token {
                Some(token) if self.subs.tracks(token) => {
                    let sub = self.subs.sub_of(token).unwrap_or_default().to_owned();
                    let tokens = self.subs.take_covered(token);
                    batch.push(AckItem {
                        nack: frame.command == "NACK",
                        tokens,
                        receipt: frame.get("receipt").map(str::to_owned),
                        sub,
                    });
                }
                _ => {
                    // Not a delivery the guard tracks (browsing, or settled by the
                    // guard): the broker has the final word, after the ones before it.
                    if !self.settle(std::mem::take(&mut batch)).await {
                        return;
                    }
                    self.sync().await;
                    self.forward(frame);
                }
            }
        }
        self.settle(batch).await;
    }

    async fn settle(&mut self, batch: Vec<AckItem>) -> bool {
        if batch.is_empty() {
            return true;
        }
        if self.bypass.deliveries {
            return self.settle_here(batch).await;
        }
        if batch.iter().all(|item| !item.nack && item.receipt.is_none()) {
            // Nothing to answer the client: the guard finishes them while the session
            // goes on (its acknowledgements reach the broker before anything the
            // session forwards later: see `sync`).
            self.acks.extend(batch);
            self.told = true;
            return true;
        }
        let receipts: Vec<Option<String>> = batch.iter().map(|i| i.receipt.clone()).collect();
        let Some(verdicts) = self.ask(GuardBatch::Acks(batch)).await else {
            self.internal_error();
            return false;
        };
        let mut verdicts = verdicts.into_iter();
        for receipt in receipts {
            match verdicts.next() {
                Some((code::HOLD, key, _, _)) => self.chain.hold(receipt, key),
                _ => {
                    let mut out = Vec::new();
                    self.chain.local(receipt, &mut out);
                    self.apply(out);
                }
            }
        }
        true
    }

    /// `settle` without the guard (see `bypass`): each delivery's ACK (or NACK, where
    /// the broker's requeues) written here. A NACK's receipt, and every receipt after
    /// it, waits for the work on the broker leg the guard has queued so far, as when the
    /// guard settles it.
    async fn settle_here(&mut self, batch: Vec<AckItem>) -> bool {
        for item in batch {
            let command = if item.nack { "NACK" } else { "ACK" };
            if !item.nack || (self.bypass.nack_requeue && self.version != Version::V10) {
                for token in &item.tokens {
                    let data = settle_frame(command, self.version, token, &item.sub, None);
                    self.write_broker(&data);
                }
            }
            if !item.nack {
                let mut out = Vec::new();
                self.chain.local(item.receipt, &mut out);
                self.apply(out);
                continue;
            }
            // The guard's answer to a DISCONNECT is that very hold.
            match self.ask(GuardBatch::Disconnect).await {
                Some(verdicts) => match verdicts.first() {
                    Some((code::HOLD, key, _, _)) => self.chain.hold(item.receipt, *key),
                    _ => {
                        let mut out = Vec::new();
                        self.chain.local(item.receipt, &mut out);
                        self.apply(out);
                    }
                },
                None => {
                    self.internal_error();
                    return false;
                }
            }
        }
        true
    }

    fn on_subscribe(&mut self, mut frame: RawFrame) {
        let receipt = frame.get("receipt").map(str::to_owned);
        let Some(destination) = frame.get("destination").filter(|d| !d.is_empty()).map(str::to_owned) else {
            self.fail("SUBSCRIBE without a destination header", receipt.as_deref(), "");
            return;
        };
        let mode = frame.get("ack").unwrap_or("auto").to_owned();
        if !ACK_MODES.contains(&mode.as_str()) {
            self.fail(&format!("unknown ack mode '{mode}'"), receipt.as_deref(), "");
            return;
        }
        let id = match frame.get("id") {
            Some(id) => id.to_owned(),
            None => {
                let id = self.subs.new_id();
                set_header(&mut frame, "id", &id);
                id
            }
        };
        if self.subs.contains(&id) {
            self.fail(&format!("subscription id '{id}' is already in use"), receipt.as_deref(), "");
            return;
        }
        let browse = frame.get("browser") == Some("true");
        let quorum = frame.get("x-queue-type") == Some("quorum");
        self.subs.add(id, destination, mode, browse, quorum);
        if !browse {
            set_header(&mut frame, "ack", "client-individual");
        }
        self.forward(frame);
    }

    fn on_unsubscribe(&mut self, frame: RawFrame) {
        let tokens = self.subs.remove(frame.get("id").unwrap_or_default());
        if !tokens.is_empty() {
            self.bridge.tell(self.id, GuardBatch::Unsubscribed(tokens));
        }
        self.forward(frame);
    }

    /// Hold the DISCONNECT until every receipt owed before it came back and the work
    /// the guard deferred on the broker leg so far has run.
    async fn disconnect(&mut self, frame: RawFrame) {
        self.pending_disconnect = Some(frame);
        if let Some(verdicts) = self.ask(GuardBatch::Disconnect).await {
            if let Some((code::HOLD, key, _, _)) = verdicts.first() {
                self.chain.hold(None, *key);
            }
        }
        self.flush_disconnect();
    }

    fn flush_disconnect(&mut self) {
        if self.pending_disconnect.is_none() || !self.chain.is_empty() {
            return;
        }
        let Some(mut frame) = self.pending_disconnect.take() else {
            return;
        };
        self.disconnect_sent = true;
        if frame.get("receipt").is_none() || self.ending {
            // A receipt of the session's own: the broker's answer ends the drain. (Once
            // the session's ERROR is queued, the client is owed no receipt after it.)
            let id = self.chain.expect(None, None);
            set_header(&mut frame, "receipt", &id);
            if let Ok(data) = encode(&frame, self.version) {
                self.write_broker(&data);
            }
        } else {
            self.forward(frame);
        }
    }

    // -- broker frames ---------------------------------------------------------------

    /// Relay the frames of one broker read; Some(outcome) when the broker side is over.
    async fn on_broker_items(&mut self, items: Vec<Item>) -> Option<String> {
        let mut quick_ack = false;
        let outcome = self.relay_broker_items(items, &mut quick_ack).await;
        if quick_ack {
            // The broker answered a receipt of the sidecar's own, which the client did
            // not ask for: a broker writing with Nagle on (ActiveMQ) holds what follows
            // (the MESSAGE of a one-at-a-time exchange) until that answer is
            // acknowledged, which Linux delays by 40 ms. Everything else comes as it
            // would to the client directly: acknowledged as the kernel does, so that a
            // broker that answers one SEND after another (ActiveMQ's RECEIPTs) sends
            // them in fewer segments, waking the runtime fewer times.
            if let Some(broker) = &self.broker {
                broker.quick_ack();
            }
        }
        outcome
    }

    async fn relay_broker_items(&mut self, items: Vec<Item>, quick_ack: &mut bool) -> Option<String> {
        let mut items = items.into_iter().peekable();
        while let Some(item) = items.next() {
            let frame = match item {
                Item::Heartbeat => {
                    if !self.ending {
                        self.relay_heartbeat();
                    }
                    continue;
                }
                Item::Oversized(over) => {
                    if let Some(outcome) = self.on_oversized(over).await {
                        return Some(outcome);
                    }
                    continue;
                }
                Item::Frame(frame) => frame,
            };
            self.config.tally.broker(&frame.command);
            let command = frame.command.as_str();
            if self.ending && command != "RECEIPT" {
                // The client's last frame is queued: a MESSAGE stays unacknowledged and
                // the broker redelivers it once this connection is gone.
                if command == "ERROR" {
                    return Some("broker-error".into());
                }
                continue;
            }
            match command {
                "MESSAGE" => {
                    let mut run = vec![frame];
                    while let Some(Item::Frame(next)) = items.peek() {
                        if next.command != "MESSAGE" {
                            break;
                        }
                        if let Some(Item::Frame(next)) = items.next() {
                            run.push(next);
                        }
                    }
                    for _ in 1..run.len() {
                        self.config.tally.broker("MESSAGE");
                    }
                    self.on_messages(run).await;
                }
                "RECEIPT" => {
                    let id = frame.get("receipt-id").unwrap_or_default().to_owned();
                    if id.starts_with(LEG_RECEIPT_PREFIX) {
                        *quick_ack = true;
                        self.bridge.tell(self.id, GuardBatch::LegReceipt(id));
                    } else if self.chain.owns(&id) {
                        *quick_ack |= self.chain.client_receipt_of(&id).is_none();
                        let mut out = Vec::new();
                        self.chain.confirmed(&id, &mut out);
                        self.apply(out);
                        self.flush_disconnect();
                    } else if !self.ending {
                        self.write_client_frame(&frame);
                    }
                }
                "ERROR" => {
                    let mut frame = frame;
                    if let Some(id) = frame.get("receipt-id").map(str::to_owned) {
                        if self.chain.owns(&id) {
                            let client = self.chain.client_receipt_of(&id).map(str::to_owned);
                            remove_header(&mut frame, "receipt-id");
                            if let Some(client) = client {
                                set_header(&mut frame, "receipt-id", &client);
                            }
                        }
                    }
                    self.write_client_frame(&frame);
                    self.client_done = true;
                    self.ending = true;
                    return Some("broker-error".into());
                }
                other => {
                    let detail = other.to_owned();
                    self.send_error("the broker sent an unexpected frame", None, &detail);
                    return Some("broker-error".into());
                }
            }
        }
        None
    }

    /// The MESSAGEs of one broker read, in order: the guarded ones opened in one batch,
    /// then each written to the client (unless the guard took it).
    async fn on_messages(&mut self, run: Vec<RawFrame>) {
        enum Plan {
            Drop,
            Relay(RawFrame),
            Guard(RawFrame, String, String, String),
            Delivered(RawFrame, String, String, String),
        }
        let mut plans = Vec::with_capacity(run.len());
        let mut items = Vec::new();
        for mut frame in run {
            if frame.get("receipt").is_some_and(|r| r.starts_with(CHAIN_RECEIPT_PREFIX)) {
                // RabbitMQ echoes a SEND's receipt header: the sidecar's own id.
                remove_header(&mut frame, "receipt");
            }
            let Some(sub) = frame.get("subscription").and_then(|id| self.subs.get(id)) else {
                plans.push(Plan::Drop); // unsubscribed meanwhile: the broker gets it back
                continue;
            };
            if sub.browse {
                plans.push(Plan::Relay(frame));
                continue;
            }
            let token = if self.version == Version::V12 { frame.get("ack") } else { frame.get("message-id") };
            let Some(token) = token.map(str::to_owned) else {
                plans.push(Plan::Relay(frame));
                continue;
            };
            let sub_id = frame.get("subscription").unwrap_or_default().to_owned();
            if self.bypass.deliveries {
                // Nothing for the guard to decide: delivered as it came.
                let mode = sub.mode.clone();
                plans.push(Plan::Delivered(frame, sub_id, token, mode));
                continue;
            }
            items.push(MessageItem {
                sub: sub_id.clone(),
                destination: sub.destination.clone(),
                quorum: sub.quorum,
                mode: sub.mode.clone(),
                token: token.clone(),
                headers: first_headers(&frame, &[]),
                body: frame.body.clone(),
            });
            let mode = sub.mode.clone();
            plans.push(Plan::Guard(frame, sub_id, token, mode));
        }
        let mut verdicts = if items.is_empty() {
            Vec::new().into_iter()
        } else {
            match self.ask(GuardBatch::Messages(items)).await {
                Some(verdicts) => verdicts.into_iter(),
                None => {
                    self.internal_error();
                    return;
                }
            }
        };
        for plan in plans {
            match plan {
                Plan::Drop => {}
                Plan::Relay(frame) => self.write_client_frame(&frame),
                Plan::Guard(frame, sub, token, mode) => {
                    if let Some((code::FORWARD, ..)) = verdicts.next() {
                        self.write_client_frame(&frame);
                        if mode != "auto" {
                            self.subs.delivered(&sub, token);
                        }
                    }
                }
                Plan::Delivered(frame, sub, token, mode) => {
                    self.write_client_frame(&frame);
                    if mode == "auto" {
                        // Settled as soon as it is written, as the guard does.
                        let ack = settle_frame("ACK", self.version, &token, &sub, None);
                        self.write_broker(&ack);
                    } else {
                        self.subs.delivered(&sub, token);
                    }
                    self.config.tally.bypassed_delivery();
                }
            }
        }
    }
}

/// Close `leg` after what is queued for it was written; reset it (SO_LINGER 0) if its
/// peer has not taken that within CLOSE_TIMEOUT. Only a weak reference waits: the leg's
/// buffers go as soon as it has closed.
fn close_or_reset(leg: &Arc<Shared>) {
    leg.close();
    let leg = Arc::downgrade(leg);
    tokio::spawn(async move {
        tokio::time::sleep(CLOSE_TIMEOUT).await;
        if let Some(leg) = leg.upgrade() {
            leg.end_now(true);
        }
    });
}

/// A SEND decided in a batch: outside a transaction, with a destination.
fn plain_send(frame: &RawFrame) -> bool {
    frame.get("transaction").is_none() && frame.get("destination").is_some_and(|d| !d.is_empty())
}
