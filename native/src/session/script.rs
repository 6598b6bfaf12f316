//! A native session driven without sockets or Python: arbitrary client bytes in, a
//! scripted broker and a scripted guard around it, on a runtime whose clock only moves
//! when every task waits (tokio's paused time), so connect and drain timeouts cost no
//! wall time. The property test below and the `session` fuzz target run it on random
//! input and check that the session never panics and always ends: with an ERROR as the
//! client's last frame, or cleanly (the client disconnected or went away), every frame
//! it wrote to either peer well formed.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use super::bridge::{code, Bridge, GuardBatch, Verdict};
use super::run::{Connecting, Host, Session, SessionConfig};
use super::stopping::{Stopping, STOP_MESSAGE};
use crate::stomp::{encode, Decoder, Item, Limits, RawFrame, Version};
use crate::transport::events::{Event, Events};
use crate::transport::leg::{Cmd, Shared};

const CLIENT: u64 = 1;
const BROKER: u64 = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Limits of the broker leg: small, so that the scripted broker's big MESSAGE is over.
const BROKER_LIMITS: Limits = Limits { max_frame_bytes: 4096, max_header_count: 32, max_header_line_bytes: 1024 };
/// How the script reads what the session writes: far beyond anything it may write.
const READ_LIMITS: Limits = Limits { max_frame_bytes: 1 << 24, max_header_count: 1 << 16, max_header_line_bytes: 1 << 24 };

/// How the scripted broker answers CONNECT.
#[derive(Clone, Copy, Debug)]
pub enum Answer {
    Connected(Version),
    /// An ERROR (bad credentials).
    Refuse,
}

/// One run: what the client sends and how everything around the session behaves.
#[derive(Clone, Debug)]
pub struct Script {
    pub client: Vec<u8>,
    /// Octets per client read.
    pub step: usize,
    /// Small client-leg limits (frames over them are refused).
    pub tight: bool,
    /// After so many client reads the plane stops (SIGTERM).
    pub stop_after: Option<usize>,
    /// The client's stream ends with end-of-file (else its connection is lost).
    pub client_eof: bool,
    pub answer: Answer,
    /// Octets the broker writes on its own once connected (anything at all).
    pub broker_noise: Vec<u8>,
    /// Each subscription first gets a MESSAGE over the broker leg's limits.
    pub oversized: bool,
    /// The guard fails (raises) on its batch of this number.
    pub guard_fails_at: Option<usize>,
    /// What the guard lets the session do without it (`bypass` flags).
    pub bypass: u64,
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The outcome the session reported (its `Ended` notice).
    pub outcome: String,
    /// Each frame the client was written, decoded as a client would.
    pub to_client: Vec<RawFrame>,
}

/// Why a run broke the session's promises.
pub type Broken = String;

struct ScriptHost {
    broker: Arc<Shared>,
    sink: Mutex<Option<UnboundedSender<Event>>>,
}

impl Host for ScriptHost {
    fn connect(&self, sink: UnboundedSender<Event>) -> Connecting {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
        let broker = self.broker.clone();
        Box::pin(async move { Ok(broker) })
    }

    fn forget(&self, _leg: u64) {}
}

/// The scripted broker: answers what the session writes to it.
struct Broker {
    answer: Answer,
    version: Version,
    decoder: Decoder,
    subs: Vec<(String, String)>,
    next: u64,
    oversized: bool,
    noise: Vec<u8>,
    out: Vec<u8>,
    closing: bool,
}

impl Broker {
    fn frame(&mut self, command: &str, headers: Vec<(String, String)>, body: &[u8]) {
        let frame = RawFrame::new(command, headers, body.to_vec());
        if let Ok(data) = encode(&frame, self.version) {
            self.out.extend_from_slice(&data);
        }
    }

    fn message(&mut self, sub: &str, destination: &str, headers: Vec<(String, String)>, body: &[u8]) {
        self.next += 1;
        let mut all = vec![
            ("subscription".to_owned(), sub.to_owned()),
            ("destination".to_owned(), destination.to_owned()),
            ("message-id".to_owned(), format!("m-{}", self.next)),
            ("ack".to_owned(), format!("a-{}", self.next)),
        ];
        all.extend(headers);
        self.frame("MESSAGE", all, body);
    }

    /// A frame the session wrote; what it asks for is answered in `out`.
    fn on_frame(&mut self, frame: RawFrame) {
        let header = |name: &str| frame.get(name).map(str::to_owned);
        match frame.command.as_str() {
            "CONNECT" | "STOMP" => match self.answer {
                Answer::Refuse => {
                    self.frame("ERROR", vec![("message".into(), "bad credentials".into())], b"");
                    self.closing = true;
                }
                Answer::Connected(version) => {
                    let headers = vec![
                        ("version".into(), version.as_str().into()),
                        ("server".into(), "ActiveMQ/5.17.2".into()),
                        ("heart-beat".into(), "0,0".into()),
                    ];
                    self.frame("CONNECTED", headers, b"");
                    self.version = version;
                    self.decoder.set_version(version);
                    let noise = std::mem::take(&mut self.noise);
                    self.out.extend_from_slice(&noise);
                }
            },
            "SUBSCRIBE" => {
                let (id, destination) = (header("id").unwrap_or_default(), header("destination").unwrap_or_default());
                if self.oversized {
                    self.message(&id, &destination, Vec::new(), &[b'h'; 5000]);
                    let many = (0..40).map(|i| (format!("x-{i}"), "v".to_owned())).collect();
                    self.message(&id, &destination, many, b"wide");
                }
                self.message(&id, &destination, Vec::new(), b"waiting");
                self.subs.push((id, destination));
            }
            "SEND" => {
                let destination = header("destination").unwrap_or_default();
                let subs: Vec<String> =
                    self.subs.iter().filter(|(_, d)| *d == destination).map(|(id, _)| id.clone()).collect();
                for sub in subs {
                    self.message(&sub, &destination, Vec::new(), &frame.body);
                }
            }
            "DISCONNECT" => self.closing = true,
            _ => {}
        }
        if let Some(receipt) = header("receipt") {
            self.frame("RECEIPT", vec![("receipt-id".into(), receipt)], b"");
        }
    }
}

/// The scripted guard's verdicts on one batch (None: it failed).
struct Guard {
    bypass: u64,
    batches: usize,
    fails_at: Option<usize>,
    version: Version,
    next_hold: u64,
    /// Holds to release on the next turn.
    holds: Vec<u64>,
    ended: Vec<String>,
}

impl Guard {
    fn hold(&mut self) -> Verdict {
        self.next_hold += 1;
        self.holds.push(self.next_hold);
        (code::HOLD, self.next_hold, String::new(), Vec::new())
    }

    fn decide(&mut self, asked: bool, batch: GuardBatch) -> Option<Vec<Verdict>> {
        if asked {
            self.batches += 1;
            if self.fails_at == Some(self.batches) {
                return None;
            }
        }
        let local = || (code::LOCAL, 0, String::new(), Vec::new());
        let forward = |data: Vec<u8>| (code::FORWARD, 0, String::new(), data);
        Some(match batch {
            GuardBatch::Open(_, _, version, ..) => {
                self.version = Version::parse(&version).unwrap_or(Version::V10);
                let mut verdicts = vec![(code::LOCAL, self.bypass, "activemq".into(), b"P".to_vec())];
                if self.bypass & super::bypass::SENDS != 0 {
                    // Small bounds: the scripted big SENDs still go to the guard.
                    verdicts.push((code::LOCAL, 256, String::new(), Vec::new()));
                    verdicts.push((code::LOCAL, 8, String::new(), Vec::new()));
                    verdicts.push((code::LOCAL, 200, String::new(), b"expires\nid".to_vec()));
                }
                verdicts
            }
            GuardBatch::Sends(items) => items
                .into_iter()
                .map(|item| {
                    if item.body.starts_with(b"reject") {
                        (code::ERROR, 0, "message rejected".into(), Vec::new())
                    } else if item.seq % 4 == 0 {
                        local() // a duplicate: answered here
                    } else {
                        let mut headers = vec![("destination".to_owned(), item.destination)];
                        headers.extend(item.headers);
                        forward(encode(&RawFrame::new("SEND", headers, item.body), self.version).unwrap_or_default())
                    }
                })
                .collect(),
            GuardBatch::Messages(items) => {
                items.iter().map(|item| if item.token.ends_with('7') { local() } else { forward(Vec::new()) }).collect()
            }
            GuardBatch::Acks(items) => items.iter().map(|item| if item.nack { self.hold() } else { local() }).collect(),
            GuardBatch::Disconnect => vec![self.hold()],
            GuardBatch::Tx(item) if item.command == "SEND" && item.body.starts_with(b"reject") => {
                vec![(code::ERROR, 0, "message rejected".into(), Vec::new())]
            }
            GuardBatch::Tx(_) => vec![forward(Vec::new())],
            GuardBatch::Oversized(_) => vec![local()],
            GuardBatch::Ended(outcome, ..) => {
                self.ended.push(outcome);
                Vec::new()
            }
            _ => Vec::new(),
        })
    }
}

/// What the session wrote to one peer, decoded as that peer reads it.
struct Reader {
    decoder: Decoder,
    frames: Vec<RawFrame>,
    broken: Option<String>,
    closed: bool,
}

impl Reader {
    fn new(server_commands: bool) -> Reader {
        Reader {
            decoder: Decoder::new(READ_LIMITS, server_commands, Version::V10),
            frames: Vec::new(),
            broken: None,
            closed: false,
        }
    }

    /// The frames of one write (none once a write was malformed), kept in `frames` too.
    fn feed(&mut self, data: &[u8]) -> Vec<RawFrame> {
        let mut items = Vec::new();
        if self.broken.is_some() {
            return Vec::new();
        }
        if let Err(error) = self.decoder.feed(data, &mut items) {
            self.broken = Some(format!("{}: {}", error.reason, error.detail));
        }
        let mut frames = Vec::new();
        for item in items {
            match item {
                Item::Frame(frame) => {
                    if frame.command == "CONNECTED" {
                        // What the client reads after it is in the version agreed on.
                        let version = frame.get("version").and_then(Version::parse).unwrap_or(Version::V10);
                        self.decoder.set_version(version);
                    }
                    frames.push(frame);
                }
                Item::Oversized(_) => self.broken = Some("a frame over the reader's limits".into()),
                Item::Heartbeat => {}
            }
        }
        self.frames.extend(frames.iter().cloned());
        frames
    }
}

fn drain_writes(rx: &mut UnboundedReceiver<Cmd>, reader: &mut Reader) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Data(data) => frames.extend(reader.feed(&data)),
            Cmd::Close => reader.closed = true,
        }
    }
    frames
}

/// Run `script` to the session's end (on a runtime of its own).
pub fn run(script: &Script) -> Result<Outcome, Broken> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(drive(script))
}

async fn drive(script: &Script) -> Result<Outcome, Broken> {
    let (_wake_read, wake) = UnixStream::pair().map_err(|e| e.to_string())?;
    wake.set_nonblocking(true).map_err(|e| e.to_string())?;
    let events = Arc::new(Events::new(wake));
    let bridge = Bridge::new(events.clone());
    let stopping = Arc::new(Stopping::default());
    let config = Arc::new(SessionConfig {
        tally: Arc::default(),
        connect_timeout: CONNECT_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
        upstream_where: "127.0.0.1:61613".into(),
        stopping: stopping.clone(),
        protocol_errors: Arc::default(),
    });
    let client_limits = if script.tight {
        Limits { max_frame_bytes: 300, max_header_count: 6, max_header_line_bytes: 60 }
    } else {
        Limits::default()
    };
    let (client_cmds, mut client_writes) = unbounded_channel();
    let client = Shared::new(CLIENT, client_cmds, Decoder::new(client_limits, false, Version::V12));
    let (broker_cmds, mut broker_writes) = unbounded_channel();
    let mut broker_decoder = Decoder::new(BROKER_LIMITS, true, Version::V12);
    broker_decoder.set_keep_wire(true);
    let broker_leg = Shared::new(BROKER, broker_cmds, broker_decoder);
    let host = Arc::new(ScriptHost { broker: broker_leg.clone(), sink: Mutex::new(None) });
    let (tx, rx) = unbounded_channel();
    let session = Session::new(host.clone(), bridge.clone(), config, client.clone(), rx, tx.clone(), ("127.0.0.1".into(), 40000));
    let task = tokio::spawn(session.run());

    let mut broker = Broker {
        answer: script.answer,
        version: Version::V10,
        decoder: Decoder::new(READ_LIMITS, false, Version::V10),
        subs: Vec::new(),
        next: 0,
        oversized: script.oversized,
        noise: script.broker_noise.clone(),
        out: Vec::new(),
        closing: false,
    };
    let mut guard = Guard {
        bypass: script.bypass,
        batches: 0,
        fails_at: script.guard_fails_at,
        version: Version::V10,
        next_hold: 0,
        holds: Vec::new(),
        ended: Vec::new(),
    };
    let mut to_client = Reader::new(true);
    let mut to_broker = Reader::new(false);
    let mut chunks = script.client.chunks(script.step.max(1));
    let mut reads = 0;
    let mut client_ended = false;
    let mut client_closed_told = false;
    let mut broker_ended = false;
    let mut releases: Vec<u64> = Vec::new();
    // Every read takes a millisecond; then the session has its timeouts to end.
    let bound = Duration::from_millis(script.client.len() as u64 + 10) + CONNECT_TIMEOUT + DRAIN_TIMEOUT * 3;
    let deadline = Instant::now() + bound;
    loop {
        if task.is_finished() {
            break;
        }
        if Instant::now() > deadline {
            task.abort();
            client.couple(None);
            broker_leg.couple(None);
            return Err(format!("the session did not end within {bound:?}"));
        }
        for key in releases.drain(..) {
            let _ = tx.send(Event::Released(key));
        }
        if !client_ended {
            match chunks.next() {
                Some(chunk) => {
                    let (items, error) = client.feed(chunk);
                    // After a malformed frame the leg reads nothing more, and says nothing.
                    client_ended = error.is_some();
                    let _ = tx.send(Event::Items(CLIENT, items, chunk.len(), error));
                    reads += 1;
                    if script.stop_after == Some(reads) {
                        stopping.stop();
                    }
                }
                None => {
                    client_ended = true;
                    if script.client_eof {
                        let _ = tx.send(Event::Eof(CLIENT));
                    } else {
                        client_closed_told = true;
                        let _ = tx.send(Event::Closed(CLIENT, Some((104, "connection reset".into()))));
                    }
                }
            }
        }
        drain_writes(&mut client_writes, &mut to_client);
        if to_client.closed && !client_closed_told {
            // The leg wrote what was queued and closed.
            client_closed_told = true;
            let _ = tx.send(Event::Closed(CLIENT, None));
        }
        for frame in drain_writes(&mut broker_writes, &mut to_broker) {
            broker.on_frame(frame);
        }
        let sink = host.sink.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(sink) = sink.filter(|_| !broker_ended) {
            if !broker.out.is_empty() {
                let data = std::mem::take(&mut broker.out);
                let (items, error) = broker_leg.feed(&data);
                let _ = sink.send(Event::Items(BROKER, items, data.len(), error));
            }
            if broker.closing || to_broker.closed {
                broker_ended = true;
                let _ = sink.send(Event::Eof(BROKER));
                let _ = sink.send(Event::Closed(BROKER, None));
            }
        }
        for event in events.take() {
            if let Event::Guard(_, id, batch) = event {
                let verdicts = guard.decide(id != 0, batch);
                if id != 0 {
                    bridge.answer(id, verdicts);
                }
            }
        }
        releases.append(&mut guard.holds);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ended = task.await;
    // The legs' tasks release their peers when they end; these legs have none.
    client.couple(None);
    broker_leg.couple(None);
    if let Err(error) = ended {
        return Err(format!("the session panicked: {error}"));
    }
    drain_writes(&mut client_writes, &mut to_client);
    drain_writes(&mut broker_writes, &mut to_broker);
    for event in events.take() {
        if let Event::Guard(_, id, batch) = event {
            guard.decide(id != 0, batch);
        }
    }
    let outcome = Outcome { outcome: guard.ended.concat(), to_client: to_client.frames.clone() };
    check(&guard.ended, &to_client, &to_broker, script)?;
    Ok(outcome)
}

/// The session's promises on how it ends.
fn check(ended: &[String], client: &Reader, broker: &Reader, script: &Script) -> Result<(), Broken> {
    let [outcome] = ended else {
        return Err(format!("the session reported its end {} times", ended.len()));
    };
    if let Some(why) = &client.broken {
        return Err(format!("the client was written a malformed frame: {why}"));
    }
    if let Some(why) = &broker.broken {
        return Err(format!("the broker was written a malformed frame: {why}"));
    }
    if !client.closed {
        return Err(format!("the client's connection was left open ({outcome})"));
    }
    let frames = &client.frames;
    if let Some(at) = frames.iter().position(|f| f.command == "ERROR") {
        if at + 1 != frames.len() {
            return Err(format!("{} written after the ERROR", frames[at + 1].command));
        }
    }
    let last_error = frames.last().is_some_and(|f| f.command == "ERROR");
    match outcome.as_str() {
        // The client ended it, cleanly or not: nothing is owed to it.
        "disconnect" | "client-closed" | "client-lost" => {}
        // The client went away (or said nothing) before CONNECT was answered.
        "no-connect" if frames.is_empty() || last_error => {}
        "shutdown" => {
            if !frames.last().is_some_and(|f| f.command == "ERROR" && f.get("message") == Some(STOP_MESSAGE)) {
                return Err("stopped without the shutting-down ERROR last".into());
            }
            if script.stop_after.is_none() {
                return Err("a shutdown nobody asked for".into());
            }
        }
        _ if last_error => {}
        other => return Err(format!("the session ended ({other}) without an ERROR to its client")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn connect(version: &str) -> Vec<u8> {
        format!("CONNECT\naccept-version:{version}\nhost:/\nlogin:guest\npasscode:guest\n\n\0").into_bytes()
    }

    fn script(client: Vec<u8>) -> Script {
        Script {
            client,
            step: 4096,
            tight: false,
            stop_after: None,
            client_eof: true,
            answer: Answer::Connected(Version::V12),
            broker_noise: Vec::new(),
            oversized: false,
            guard_fails_at: None,
            bypass: 0,
        }
    }

    fn commands(outcome: &Outcome) -> Vec<&str> {
        outcome.to_client.iter().map(|f| f.command.as_str()).collect()
    }

    #[test]
    fn a_disconnect_with_a_receipt_ends_cleanly() {
        let mut client = connect("1.2");
        client.extend_from_slice(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client\n\n\0");
        client.extend_from_slice(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\0");
        client.extend_from_slice(b"DISCONNECT\nreceipt:bye\n\n\0");
        let outcome = run(&script(client)).unwrap();
        assert_eq!(outcome.outcome, "disconnect");
        let frames = &outcome.to_client;
        assert_eq!(frames.first().map(|f| f.command.as_str()), Some("CONNECTED"));
        let receipts: Vec<_> = frames.iter().filter_map(|f| f.get("receipt-id")).collect();
        assert_eq!(receipts, ["r1", "bye"]);
    }

    #[test]
    fn sends_the_guard_need_not_see_are_forwarded_without_it() {
        let mut client = connect("1.2");
        client.extend_from_slice(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client-individual\n\n\0");
        for i in 1..=4 {
            client.extend_from_slice(format!("SEND\ndestination:/queue/a\nreceipt:r{i}\n\nm{i}\0").as_bytes());
        }
        // The same SENDs with an `expires` go to the guard, which answers the 4th itself.
        for i in 5..=8 {
            client.extend_from_slice(format!("SEND\ndestination:/queue/a\nexpires:1\nreceipt:r{i}\n\nm{i}\0").as_bytes());
        }
        client.extend_from_slice(b"DISCONNECT\nreceipt:bye\n\n\0");
        let bodies = |bypass: u64| {
            let mut run_of = script(client.clone());
            run_of.bypass = bypass;
            let outcome = run(&run_of).unwrap();
            assert_eq!(outcome.outcome, "disconnect");
            let receipts: Vec<_> = outcome.to_client.iter().filter_map(|f| f.get("receipt-id")).collect();
            assert_eq!(receipts, ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "bye"]);
            outcome
                .to_client
                .iter()
                .filter(|f| f.command == "MESSAGE")
                .map(|f| String::from_utf8_lossy(&f.body).into_owned())
                .collect::<Vec<_>>()
        };
        // The scripted guard answers every 4th SEND of the session itself (a duplicate)
        // and takes the delivery whose token ends in 7.
        assert_eq!(bodies(0), ["waiting", "m1", "m2", "m3", "m5", "m6"]);
        let everything = super::super::bypass::SENDS | super::super::bypass::DELIVERIES;
        assert_eq!(bodies(everything), ["waiting", "m1", "m2", "m3", "m4", "m5", "m6", "m7"]);
    }

    #[test]
    fn an_oversized_message_is_not_delivered_and_the_session_goes_on() {
        let mut client = connect("1.2");
        client.extend_from_slice(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client-individual\nreceipt:s\n\n\0");
        client.extend_from_slice(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nafter\0");
        let mut run_of = script(client);
        run_of.oversized = true;
        run_of.step = 40;
        let outcome = run(&run_of).unwrap();
        assert_eq!(outcome.outcome, "client-closed");
        let bodies: Vec<&[u8]> =
            outcome.to_client.iter().filter(|f| f.command == "MESSAGE").map(|f| f.body.as_slice()).collect();
        assert_eq!(bodies, [b"waiting".as_slice(), b"after".as_slice()]);
        assert!(!commands(&outcome).contains(&"ERROR"));
    }

    #[test]
    fn a_stop_answers_what_is_owed_then_errors() {
        // One read for the CONNECT, one for the SEND, then the plane stops.
        let mut client = connect("1.2");
        let step = client.len();
        client.extend_from_slice(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\0");
        let mut run_of = script(client);
        run_of.step = step;
        run_of.stop_after = Some(2);
        let outcome = run(&run_of).unwrap();
        assert_eq!(outcome.outcome, "shutdown");
        assert_eq!(commands(&outcome), ["CONNECTED", "RECEIPT", "ERROR"]);
        assert_eq!(outcome.to_client[2].get("message"), Some(STOP_MESSAGE));
    }

    #[test]
    fn a_stop_during_the_handshake_errors_at_once() {
        let mut run_of = script(b"CONNECT\naccept-version:1.2\n".to_vec());
        run_of.stop_after = Some(1);
        let outcome = run(&run_of).unwrap();
        assert_eq!(outcome.outcome, "shutdown");
        assert_eq!(commands(&outcome), ["ERROR"]);
    }

    /// Pieces a client's bytes are made of: frames of every kind, well formed or not.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        let frames: Vec<&'static [u8]> = vec![
            b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client\n\n\0",
            b"SUBSCRIBE\nid:2\ndestination:/queue/a\nack:auto\nreceipt:s2\n\n\0",
            b"SUBSCRIBE\nid:3\ndestination:/queue/b\nack:client-individual\nbrowser:true\n\n\0",
            b"UNSUBSCRIBE\nid:1\nreceipt:u\n\n\0",
            b"SEND\ndestination:/queue/a\nreceipt:r\n\nbody\0",
            b"SEND\ndestination:/queue/a\n\nno receipt\0",
            b"SEND\ndestination:/queue/a\ncontent-length:3\n\na\0b\0",
            b"SEND\ndestination:/queue/a\nreceipt:x\n\nreject me\0",
            b"SEND\nreceipt:nodest\n\n\0",
            b"ACK\nid:a-1\n\n\0",
            b"ACK\nid:a-2\nreceipt:k\n\n\0",
            b"NACK\nid:a-3\nreceipt:n\n\n\0",
            b"ACK\nmessage-id:m-1\nsubscription:1\n\n\0",
            b"BEGIN\ntransaction:t\n\n\0",
            b"SEND\ndestination:/queue/a\ntransaction:t\n\nin tx\0",
            b"ACK\nid:a-2\ntransaction:t\n\n\0",
            b"COMMIT\ntransaction:t\nreceipt:c\n\n\0",
            b"ABORT\ntransaction:t\n\n\0",
            b"DISCONNECT\nreceipt:bye\n\n\0",
            b"DISCONNECT\n\n\0",
            b"CONNECT\naccept-version:1.2\n\n\0",
            b"\n",
            b"\r\n",
            b"BOGUS\n\n\0",
            b"SEND\ndestination:/queue/a\nx:\\q\n\n\0",
        ];
        prop_oneof![
            8 => proptest::sample::select(frames).prop_map(<[u8]>::to_vec),
            1 => proptest::collection::vec(any::<u8>(), 0..40),
            1 => (1usize..400).prop_map(|n| {
                let mut data = b"SEND\ndestination:/queue/a\nreceipt:big\n\n".to_vec();
                data.resize(data.len() + n, b'z');
                data.push(0);
                data
            }),
        ]
    }

    fn any_script() -> impl Strategy<Value = Script> {
        (
            (proptest::option::weighted(0.9, prop_oneof![Just("1.2"), Just("1.1"), Just("1.0")]),
             proptest::collection::vec(piece(), 0..12)),
            (1usize..200, any::<bool>(), proptest::option::of(1usize..12), any::<bool>()),
            (0u8..8, proptest::collection::vec(any::<u8>(), 0..30), any::<bool>(), proptest::option::of(1usize..8), 0u64..8),
        )
            .prop_map(|((version, pieces), (step, tight, stop_after, client_eof), (answer, noise, oversized, fails, bypass))| {
                let mut client = version.map(connect).unwrap_or_default();
                client.extend(pieces.concat());
                Script {
                    client,
                    step,
                    tight,
                    stop_after,
                    client_eof,
                    answer: match answer {
                        0 => Answer::Refuse,
                        1 => Answer::Connected(Version::V10),
                        2 => Answer::Connected(Version::V11),
                        _ => Answer::Connected(Version::V12),
                    },
                    // Mostly a quiet broker: noise often ends the session at once.
                    broker_noise: if answer == 7 { noise } else { Vec::new() },
                    oversized,
                    guard_fails_at: fails.filter(|_| answer == 6),
                    bypass,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Never a panic, never a hang; an ERROR last or a clean end; well-formed writes.
        #[test]
        fn a_session_fed_anything_ends_with_an_error_or_cleanly(script in any_script()) {
            if let Err(broken) = run(&script) {
                prop_assert!(false, "{broken}\n{script:?}");
            }
        }
    }
}
