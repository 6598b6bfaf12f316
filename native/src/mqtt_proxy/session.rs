//! One client connection and its upstream connection: the MQTT session state.
//!
//! The task reads both sockets; two writer tasks drain each side's outgoing queue. A
//! read's PUBLISHes go to Python as one batch and the task waits for their verdicts
//! before it handles anything after them, so the order of a connection's packets is kept
//! on both legs. The broker's acknowledgement of a client publish is what acknowledges it
//! to the client: a forwarded QoS 1/2 PUBLISH is answered only when the broker answered.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::events::{Event, Events, Msg, LOST};
use super::ids::{Ids, Owner};
use crate::mqtt::props::{int_property, MESSAGE_EXPIRY, USER_PROPERTY};
mod client;
mod outbox;
mod packets;
mod upstream;

use crate::mqtt::{
    encode, read_varint, Ack, Decoder, Limits, MqttError, Packet, PropValue, Properties, Property,
    Publish, Reasoned, Version,
};
use outbox::Out;
use packets::{ack, stamp};

/// Verdict actions. Sends: forward, drop (acknowledged, not sent), reject (refused to
/// the client). Deliveries: forward, or withhold (Python settles it upstream itself).
pub const FORWARD: u8 = 0;
pub const DROP: u8 = 1;
pub const REJECT: u8 = 2;

const TOPIC_ALIAS: u8 = 0x23;
const REASON_STRING: u8 = 0x1F;
/// MQTT 5 "implementation specific error": a send the guard refused.
const REFUSED: u8 = 0x83;
/// MQTT 5 "server unavailable" (3.1.1 return code 3): the broker cannot be reached.
const UNAVAILABLE_V5: u8 = 0x88;
const UNAVAILABLE_V311: u8 = 3;
/// MQTT 5 "quota exceeded": the sidecar serves its maximum of connections already.
const QUOTA_EXCEEDED: u8 = 0x97;
/// MQTT 5 "server shutting down".
const SERVER_SHUTTING_DOWN: u8 = 0x8B;
/// MQTT 5 "keep alive timeout".
const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;

const READ_SIZE: usize = 64 * 1024;
/// Queued outgoing octets above which the other side stops being read (back-pressure).
const HIGH_WATER: usize = 1 << 20;
/// Most queued octets joined into one write.
const COALESCE: usize = 256 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const PAUSE_POLL: Duration = Duration::from_millis(5);
/// Longest reason string put into a refusal (octets, cut at a character boundary).
const MAX_REASON: usize = 256;

/// Either half of a leg, TCP or TLS.
type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// One verdict from Python.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    pub action: u8,
    /// The guard's token for a forwarded send (reported back in `Settled`).
    pub token: u64,
    /// Another topic to publish to (a MOVE).
    pub topic: Option<String>,
    /// Message Expiry Interval to set (MQTT 5); 0 removes it.
    pub expiry: Option<u32>,
    /// User properties to add (MQTT 5).
    pub user: Vec<(String, String)>,
    /// Why a send was refused (MQTT 5 reason string).
    pub reason: Option<String>,
}

/// What Python asks of a connection.
pub enum Cmd {
    /// Acknowledge a delivery upstream without the client (PUBACK, or PUBREC for QoS 2).
    Ack {
        packet_id: u16,
        qos: u8,
    },
    /// Publish a message of the sidecar's own upstream at QoS 1.
    Publish {
        token: u64,
        topic: String,
        payload: Vec<u8>,
        retain: bool,
        user: Vec<(String, String)>,
        expiry: Option<u32>,
    },
    /// The client is gone and the guard is done with the connection.
    Release,
    /// The sidecar stops: the client is told (MQTT 5: DISCONNECT 0x8B) and left as if it
    /// had gone, so the guard settles what it had in flight.
    Shutdown,
    Abort,
}

pub struct Ctx {
    pub events: Arc<Events>,
    pub upstream: (String, u16),
    pub client_limits: Limits,
    /// Largest first packet (the CONNECT) from a client not yet connected.
    pub max_handshake_bytes: usize,
    /// TLS toward clients, when the listener serves it.
    pub tls: Option<TlsAcceptor>,
    /// TLS toward the broker (`mqtts://`) and the name its certificate must have.
    pub upstream_tls: Option<(TlsConnector, ServerName<'static>)>,
    pub broker_limits: Limits,
    pub release_grace: Duration,
    /// Client connections served at once (a CONNECT beyond it is refused).
    pub max_connections: usize,
    /// Sockets accepted and not closed yet, sessions and handshakes alike.
    pub accepted: AtomicUsize,
    pub conns: Mutex<HashMap<u64, mpsc::UnboundedSender<Cmd>>>,
    pub waiting: Mutex<HashMap<u64, oneshot::Sender<Vec<Verdict>>>>,
    pub next_conn: AtomicU64,
    pub next_batch: AtomicU64,
}

impl Ctx {
    fn register(&self, conn: u64, tx: mpsc::UnboundedSender<Cmd>) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(conn, tx);
    }

    fn unregister(&self, conn: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&conn);
    }

    /// Push a batch and wait for its verdicts; None when the plane is stopping.
    async fn decide(&self, batch_event: impl FnOnce(u64) -> Event) -> Option<Vec<Verdict>> {
        let batch = self.next_batch.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(batch, tx);
        self.events.push(batch_event(batch));
        rx.await.ok()
    }
}

#[derive(Debug, PartialEq)]
enum Flow {
    Go,
    /// The client side ended (gracefully: it sent DISCONNECT).
    Gone(bool),
    /// The connection ends, for this reason.
    End(String),
}

/// Serve one accepted client until both legs are closed.
pub async fn serve(ctx: Arc<Ctx>, client: TcpStream, peer: SocketAddr) {
    let _ = client.set_nodelay(true);
    let (mut client_read, client_write): (Reader, Writer) = match &ctx.tls {
        None => {
            let (read, write) = client.into_split();
            (Box::new(read), Box::new(write))
        }
        Some(acceptor) => match timeout(CONNECT_TIMEOUT, acceptor.accept(client)).await {
            Ok(Ok(stream)) => {
                let (read, write) = tokio::io::split(stream);
                (Box::new(read), Box::new(write))
            }
            failure => {
                let detail = match failure {
                    Ok(Err(error)) => format!("TLS handshake failed: {error}"),
                    _ => "TLS handshake timed out".to_string(),
                };
                ctx.events.push(Event::ProtocolError {
                    conn: 0,
                    side: "client",
                    kind: "tls",
                    detail,
                });
                return;
            }
        },
    };
    let mut decoder = Decoder::new(ctx.client_limits, None);
    let mut buf = vec![0u8; READ_SIZE];
    let mut packets = Vec::new();
    // Before its CONNECT a client is unauthenticated: its first packet may be at most
    // `max_handshake_bytes`, checked from the fixed header before the body is buffered.
    let limit = ctx.max_handshake_bytes;
    let mut raw: Vec<u8> = Vec::new();
    let first = timeout(CONNECT_TIMEOUT, async {
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            raw.extend_from_slice(&buf[..n]);
            if raw[0] != 0x10 {
                return Some(Err(MqttError::protocol(format!(
                    "first packet (type {}) is not CONNECT",
                    raw[0] >> 4
                ))));
            }
            let header = if raw.len() >= 2 {
                read_varint(&raw[1..])
            } else {
                Ok(None)
            };
            match header {
                Ok(Some((remaining, used))) => {
                    let total = 1 + used + remaining as usize;
                    if total > limit {
                        return Some(Err(MqttError::too_large(format!(
                            "first packet of {total} octets exceeds the {limit} allowed before CONNECT"
                        ))));
                    }
                    if raw.len() >= total {
                        return Some(decoder.feed(&raw, &mut packets));
                    }
                }
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
        }
    })
    .await;
    let mut client_write = client_write;
    let connect = match first {
        Ok(Some(Ok(()))) => match packets.remove(0) {
            Packet::Connect(connect) => connect,
            other => {
                let error =
                    MqttError::protocol(format!("first packet is {}, not CONNECT", other.name()));
                refuse_early(&ctx, &mut client_write, &error).await;
                return;
            }
        },
        Ok(Some(Err(error))) => {
            refuse_early(&ctx, &mut client_write, &error).await;
            return;
        }
        _ => return,
    };
    let version = connect.version;
    if ctx.conns.lock().unwrap_or_else(|e| e.into_inner()).len() >= ctx.max_connections {
        let code = if version == Version::V5 {
            QUOTA_EXCEEDED
        } else {
            UNAVAILABLE_V311
        };
        let mut answer = Vec::new();
        let connack = Packet::ConnAck(crate::mqtt::ConnAck {
            session_present: false,
            code,
            properties: Vec::new(),
        });
        if encode(&connack, version, &mut answer).is_ok() {
            let _ = client_write.write_all(&answer).await;
        }
        let _ = client_write.shutdown().await;
        ctx.events.push(Event::ProtocolError {
            conn: 0,
            side: "client",
            kind: "refused",
            detail: format!("over max-connections ({})", ctx.max_connections),
        });
        return;
    }
    let conn = ctx.next_conn.fetch_add(1, Ordering::Relaxed);
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    ctx.register(conn, cmd_tx);
    ctx.events.push(Event::Opened {
        conn,
        client_id: connect.client_id.clone(),
        level: version.level(),
        clean: connect.clean_start,
        peer: peer.to_string(),
    });
    let (to_client, client_task) = Out::new(client_write, version);
    let upstream = match timeout(CONNECT_TIMEOUT, open_upstream(&ctx)).await {
        Ok(Ok(halves)) => halves,
        failure => {
            let why = match failure {
                Ok(Err(error)) => format!("broker unreachable: {error}"),
                _ => "broker unreachable: connect timed out".to_string(),
            };
            let code = if version == Version::V5 {
                UNAVAILABLE_V5
            } else {
                UNAVAILABLE_V311
            };
            to_client.packet(&Packet::ConnAck(crate::mqtt::ConnAck {
                session_present: false,
                code,
                properties: Vec::new(),
            }));
            finish(&ctx, conn, to_client, client_task, None, why).await;
            return;
        }
    };
    let (upstream_read, upstream_write) = upstream;
    let (to_upstream, upstream_task) = Out::new(upstream_write, version);
    let keep_alive = connect.keep_alive;
    to_upstream.packet(&Packet::Connect(connect));
    let mut session = Session {
        ctx: ctx.clone(),
        conn,
        version,
        to_client,
        to_upstream,
        ids: Ids::new(),
        client_aliases: HashMap::new(),
        upstream_aliases: HashMap::new(),
        local_rel: HashSet::new(),
        withheld_rel: HashSet::new(),
        gone: false,
        disconnect: None,
        connected: false,
        released: false,
        settled: Vec::new(),
        acked: Vec::new(),
    };
    let reason = session
        .run(
            packets,
            decoder,
            client_read,
            upstream_read,
            cmd_rx,
            keep_alive,
        )
        .await;
    let Session {
        to_client,
        to_upstream,
        ..
    } = session;
    finish(
        &ctx,
        conn,
        to_client,
        client_task,
        Some((to_upstream, upstream_task)),
        reason,
    )
    .await;
}

/// The connection to the broker, TCP or TLS (`mqtts://`).
async fn open_upstream(ctx: &Ctx) -> std::io::Result<(Reader, Writer)> {
    let tcp = TcpStream::connect((ctx.upstream.0.as_str(), ctx.upstream.1)).await?;
    let _ = tcp.set_nodelay(true);
    match &ctx.upstream_tls {
        None => {
            let (read, write) = tcp.into_split();
            Ok((Box::new(read), Box::new(write)))
        }
        Some((connector, name)) => {
            let stream = connector.connect(name.clone(), tcp).await?;
            let (read, write) = tokio::io::split(stream);
            Ok((Box::new(read), Box::new(write)))
        }
    }
}

/// A client refused before its session exists: a CONNACK saying why when its version is
/// known, then the socket is closed.
async fn refuse_early(ctx: &Ctx, client: &mut Writer, error: &MqttError) {
    ctx.events.push(Event::ProtocolError {
        conn: 0,
        side: "client",
        kind: error.kind,
        detail: error.detail.clone(),
    });
    if error.kind == "unsupported-version" {
        // The 3.1.1 answer (return code 1, "unacceptable protocol version"): a client
        // of an unknown level understands no other.
        let _ = client.write_all(&[0x20, 2, 0, 1]).await;
    }
    let _ = client.shutdown().await;
}

async fn finish(
    ctx: &Ctx,
    conn: u64,
    to_client: Out,
    client_task: tokio::task::JoinHandle<()>,
    upstream: Option<(Out, tokio::task::JoinHandle<()>)>,
    reason: String,
) {
    ctx.unregister(conn);
    drop(to_client);
    let mut tasks = vec![client_task];
    if let Some((out, task)) = upstream {
        drop(out);
        tasks.push(task);
    }
    for task in tasks {
        // What was queued (a CONNACK, a DISCONNECT) leaves first, unless the peer stopped
        // reading: then the writer is ended, which closes the socket.
        let abort = task.abort_handle();
        if timeout(Duration::from_secs(1), task).await.is_err() {
            abort.abort();
        }
    }
    ctx.events.push(Event::Closed { conn, reason });
}

struct Session {
    ctx: Arc<Ctx>,
    conn: u64,
    version: Version,
    to_client: Out,
    to_upstream: Out,
    ids: Ids,
    client_aliases: HashMap<u16, String>,
    upstream_aliases: HashMap<u16, String>,
    /// The client's QoS 2 publishes the sidecar answered itself (dropped): their PUBREL
    /// is answered here too.
    local_rel: HashSet<u16>,
    /// The broker's QoS 2 deliveries the guard acknowledged upstream itself.
    withheld_rel: HashSet<u16>,
    gone: bool,
    /// The client's DISCONNECT, forwarded upstream once the guard released the connection.
    disconnect: Option<Packet>,
    /// The broker accepted the CONNECT.
    connected: bool,
    /// The guard is done with a client that is gone: the upstream closes as soon as no
    /// exchange is in flight on it.
    released: bool,
    settled: Vec<(u64, u8)>,
    acked: Vec<u16>,
}

impl Session {
    async fn run(
        &mut self,
        pending: Vec<Packet>,
        mut client_decoder: Decoder,
        mut client_read: Reader,
        mut upstream_read: Reader,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        keep_alive: u16,
    ) -> String {
        let mut upstream_decoder = Decoder::new(self.ctx.broker_limits, Some(self.version));
        let mut client_buf = vec![0u8; READ_SIZE];
        let mut upstream_buf = vec![0u8; READ_SIZE];
        // MQTT: a server may close a connection silent for 1.5 times the keep-alive.
        let idle = Duration::from_millis(u64::from(keep_alive) * 1500);
        let mut deadline = Instant::now() + idle;
        let mut release_at: Option<Instant> = None;
        let mut flow = self.client_packets(pending).await;
        loop {
            if flow == Flow::Go && self.released && !self.ids.waiting_on_broker() {
                if let Some(disconnect) = self.disconnect.take() {
                    self.to_upstream.packet(&disconnect);
                }
                flow = Flow::End("client gone".to_string());
            }
            match std::mem::replace(&mut flow, Flow::Go) {
                Flow::Go => {}
                Flow::End(reason) => {
                    self.report_lost();
                    return reason;
                }
                Flow::Gone(graceful) => {
                    if !self.gone {
                        self.gone = true;
                        if !self.connected {
                            self.report_lost();
                            return "client left before the broker accepted it".to_string();
                        }
                        self.ctx.events.push(Event::Gone {
                            conn: self.conn,
                            graceful,
                        });
                        release_at = Some(Instant::now() + self.ctx.release_grace);
                    }
                }
            }
            let upstream_paused = self.to_client.queued() > HIGH_WATER && !self.gone;
            let client_paused = self.to_upstream.queued() > HIGH_WATER;
            tokio::select! {
                read = client_read.read(&mut client_buf), if !self.gone && !client_paused => {
                    match read {
                        Ok(0) | Err(_) => flow = Flow::Gone(false),
                        Ok(n) => {
                            deadline = Instant::now() + idle;
                            let mut packets = Vec::new();
                            let decoded = client_decoder.feed(&client_buf[..n], &mut packets);
                            flow = self.client_packets(packets).await;
                            if let (Flow::Go, Err(error)) = (&flow, decoded) {
                                flow = self.client_error(&error);
                            }
                        }
                    }
                }
                read = upstream_read.read(&mut upstream_buf), if !upstream_paused => {
                    match read {
                        Ok(0) => {
                            // The broker enforces the client's keep-alive too (1.5 x, from
                            // the last packet forwarded), so it may close first: a close
                            // when the client has been silent for a keep-alive or more is
                            // that timeout, and an MQTT 5 client is told so as the sidecar
                            // would have told it.
                            let silent_since = deadline.checked_sub(idle).unwrap_or(deadline);
                            if keep_alive > 0
                                && !self.gone
                                && self.version == Version::V5
                                && silent_since.elapsed() * 3 >= idle * 2
                            {
                                self.to_client.packet(&Packet::Disconnect(Reasoned { reason: Some(KEEP_ALIVE_TIMEOUT), properties: None }));
                            }
                            flow = Flow::End("broker closed the connection".to_string());
                        }
                        Err(error) => flow = Flow::End(format!("broker connection failed: {error}")),
                        Ok(n) => {
                            let mut packets = Vec::new();
                            let decoded = upstream_decoder.feed(&upstream_buf[..n], &mut packets);
                            flow = self.upstream_packets(packets).await;
                            if let (Flow::Go, Err(error)) = (&flow, decoded) {
                                self.ctx.events.push(Event::ProtocolError { conn: self.conn, side: "broker", kind: error.kind, detail: error.detail.clone() });
                                flow = Flow::End(format!("broker sent a {error}"));
                            }
                        }
                    }
                }
                cmd = cmds.recv() => {
                    flow = match cmd {
                        Some(cmd) => self.command(cmd),
                        None => Flow::End("sidecar stopping".to_string()),
                    };
                }
                _ = sleep(PAUSE_POLL), if upstream_paused || client_paused => {}
                _ = sleep_until(deadline), if keep_alive > 0 && !self.gone => {
                    if self.version == Version::V5 {
                        self.to_client.packet(&Packet::Disconnect(Reasoned { reason: Some(KEEP_ALIVE_TIMEOUT), properties: None }));
                    }
                    flow = Flow::Gone(false);
                }
                _ = sleep_until(release_at.unwrap_or_else(Instant::now)), if release_at.is_some() => {
                    flow = Flow::End("client gone; release grace period over".to_string());
                }
            }
        }
    }

    /// Every exchange still open is reported as lost.
    fn report_lost(&mut self) {
        for owner in self.ids.take_all() {
            match owner {
                Owner::Client { token, .. } => self.settled.push((token, LOST)),
                Owner::Own { token } => self.ctx.events.push(Event::Published {
                    token,
                    reason: LOST,
                }),
            }
        }
        self.flush_reports();
    }

    fn flush_reports(&mut self) {
        if !self.settled.is_empty() {
            self.ctx.events.push(Event::Settled {
                conn: self.conn,
                outcomes: std::mem::take(&mut self.settled),
            });
        }
        if !self.acked.is_empty() {
            self.ctx.events.push(Event::Acked {
                conn: self.conn,
                packet_ids: std::mem::take(&mut self.acked),
            });
        }
    }

    fn command(&mut self, cmd: Cmd) -> Flow {
        match cmd {
            Cmd::Ack { packet_id, qos } => {
                if qos == 2 {
                    self.withheld_rel.insert(packet_id);
                    self.to_upstream.packet(&Packet::PubRec(ack(packet_id)));
                } else if qos == 1 {
                    self.to_upstream.packet(&Packet::PubAck(ack(packet_id)));
                }
                Flow::Go
            }
            Cmd::Publish {
                token,
                topic,
                payload,
                retain,
                user,
                expiry,
            } => {
                let id = if self.connected {
                    self.ids.map_own(token)
                } else {
                    None
                };
                let Some(id) = id else {
                    self.ctx.events.push(Event::Published {
                        token,
                        reason: LOST,
                    });
                    return Flow::Go;
                };
                let mut publish = Publish {
                    dup: false,
                    qos: 1,
                    retain,
                    topic,
                    packet_id: Some(id),
                    properties: Vec::new(),
                    payload,
                };
                stamp(
                    &mut publish,
                    &Verdict {
                        expiry,
                        user,
                        ..Verdict::default()
                    },
                    self.version,
                );
                if !self.to_upstream.packet(&Packet::Publish(publish)) {
                    self.ids.release(id);
                    self.ctx.events.push(Event::Published {
                        token,
                        reason: REFUSED,
                    });
                }
                Flow::Go
            }
            Cmd::Release => {
                if !self.gone {
                    return Flow::Go;
                }
                // The broker's answers to the client's last publishes still settle them
                // (as sent, rather than as an unknown outcome): the upstream closes once
                // none is in flight, or when the grace period ends.
                self.released = true;
                Flow::Go
            }
            Cmd::Shutdown => {
                if self.gone {
                    return Flow::Go;
                }
                if self.version == Version::V5 {
                    self.to_client.packet(&Packet::Disconnect(Reasoned {
                        reason: Some(SERVER_SHUTTING_DOWN),
                        properties: None,
                    }));
                }
                Flow::Gone(false)
            }
            Cmd::Abort => Flow::End("closed by the sidecar".to_string()),
        }
    }
}
