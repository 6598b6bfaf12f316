//! `Plane`: the tokio runtime of one sidecar, its listeners and legs, seen from Python.
//!
//! Every method is called with the GIL held (on the asyncio loop's thread, or on the
//! runtime's own by a native session's batch handler) and returns without waiting for
//! I/O: it hands a command to a leg's task or spawns one. What happens on the sockets
//! comes back as events (see `events`), taken by `drain`.

use std::collections::HashMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::admission::{Admission, Admit};
use super::driver::Driver;
use super::events::{Event, Events};
use super::leg::{self, Io, Shared};
use super::tls;
use crate::session::{self, Bridge, Host, PyVerdict, Session, SessionConfig};
use crate::stomp::{self, Decoder, Limits, Version};

/// How a leg decodes what it reads: (max_frame_bytes, max_header_count,
/// max_header_line_bytes, max_command_bytes), as the sidecar's FrameLimits.
type LimitsTuple = (usize, usize, usize, usize);

#[derive(Clone, Copy)]
struct Decoding {
    limits: LimitsTuple,
    /// The broker's commands (MESSAGE, RECEIPT...) rather than the client's.
    server: bool,
    /// Frames keep their received octets (relayed unchanged when not rewritten).
    keep_wire: bool,
}

impl Decoding {
    fn decoder(&self) -> PyResult<Decoder> {
        let (max_frame_bytes, max_header_count, max_header_line_bytes, max_command) = self.limits;
        let limits = Limits {
            max_frame_bytes,
            max_header_count,
            max_header_line_bytes,
        };
        let commands: &[&str] = if self.server {
            &stomp::SERVER_COMMANDS
        } else {
            &stomp::CLIENT_COMMANDS
        };
        let mut decoder = Decoder::with_commands(limits, commands, max_command, Version::V12)
            .map_err(PyValueError::new_err)?;
        decoder.set_keep_wire(self.keep_wire);
        Ok(decoder)
    }
}

/// Event kinds, as `drain` returns them (first item of each tuple).
const ITEMS: u8 = 0;
const EOF: u8 = 1;
const CLOSED: u8 = 2;
const REFUSED: u8 = 6;
const MALFORMED: u8 = 7;
const GUARD: u8 = 8;

struct Inner {
    events: Arc<Events>,
    legs: Mutex<HashMap<u64, Arc<Shared>>>,
    next_id: AtomicU64,
    upstream_tls: Mutex<Option<Arc<ClientConfig>>>,
    /// Native sessions' guard batches awaiting Python's verdicts.
    bridge: Bridge,
    /// Frames the native sessions relayed.
    tally: Arc<session::FrameTally>,
    /// The native sessions alive, told when the plane closes (see `stop_sessions`).
    stopping: Arc<session::Stopping>,
    /// Client connections of native sessions ended by a protocol error.
    protocol_errors: Arc<AtomicU64>,
}

impl Inner {
    fn leg(&self, id: u64) -> Option<Arc<Shared>> {
        self.legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    fn new_leg(&self, decoder: Decoder) -> (Arc<Shared>, mpsc::UnboundedReceiver<leg::Cmd>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Shared::new(id, tx, decoder);
        self.legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, shared.clone());
        (shared, rx)
    }

    fn start<S: Io + 'static>(
        self: &Arc<Self>,
        io: S,
        shared: Arc<Shared>,
        rx: mpsc::UnboundedReceiver<leg::Cmd>,
        quick_ack: bool,
    ) {
        let quick_ack = if quick_ack {
            leg::quick_ack_of(&io)
        } else {
            None
        };
        tokio::spawn(leg::run(io, shared, rx, self.events.clone(), quick_ack));
    }

    /// A plain TCP leg, whose socket Python's writes may use directly (see `SharedTcp`).
    fn start_plain(
        self: &Arc<Self>,
        tcp: TcpStream,
        shared: Arc<Shared>,
        rx: mpsc::UnboundedReceiver<leg::Cmd>,
        quick_ack: bool,
    ) {
        let tcp = Arc::new(tcp);
        shared.set_direct(tcp.clone());
        self.start(leg::SharedTcp(tcp), shared, rx, quick_ack);
    }
}

/// What a listener needs to know besides its address.
struct Listening {
    tls: Option<TlsAcceptor>,
    /// TLS handshakes in progress, at most.
    max_setting_up: usize,
    setting_up: Arc<AtomicUsize>,
    handshake_timeout: Duration,
    /// The ERROR frame a client gets when no descriptor is left to serve it.
    refusal: Vec<u8>,
    decoding: Decoding,
    /// How each client's native session reaches the broker, and who is admitted.
    sessions: Arc<SessionSetup>,
}

/// Where and how native sessions reach the broker.
struct SessionSetup {
    host: String,
    port: u16,
    tls: Option<Arc<ClientConfig>>,
    decoding: Decoding,
    config: Arc<SessionConfig>,
    /// Sessions and pending handshakes (see `admission`); an evicted one is told
    /// through its task's channel.
    admission: Admission<mpsc::UnboundedSender<Event>>,
    /// What a client may send before its CONNECT is complete (0: no bound).
    handshake_bytes: usize,
    /// The ERROR frame a client over `max_sessions` gets.
    full_refusal: Vec<u8>,
}

/// A session's way to the plane: the broker leg it opens, the legs it drops.
struct SessionHost {
    inner: Arc<Inner>,
    setup: Arc<SessionSetup>,
}

impl Host for SessionHost {
    fn connect(&self, sink: mpsc::UnboundedSender<Event>) -> session::Connecting {
        let inner = self.inner.clone();
        let setup = self.setup.clone();
        Box::pin(async move {
            let decoder = setup.decoding.decoder().map_err(|e| e.to_string())?;
            let upstream = match open_upstream(&setup.host, setup.port, setup.tls.clone()).await {
                Ok(upstream) => upstream,
                Err((errno, _, false)) if out_of_descriptors_errno(errno) => {
                    inner.events.push(Event::Refused("upstream-fd"));
                    return Err(session::run::NO_DESCRIPTOR.to_owned());
                }
                Err((_, text, _)) => return Err(text),
            };
            let (shared, rx) = inner.new_leg(decoder);
            shared.set_sink(sink);
            // Quick-acks on demand only: the session asks for them where it caused the
            // broker's answer itself (see `Shared::quick_ack`).
            match upstream {
                Upstream::Plain(tcp) => {
                    shared.set_quick_ack(leg::quick_ack_of(&tcp));
                    inner.start_plain(tcp, shared.clone(), rx, false);
                }
                Upstream::Tls(stream) => {
                    shared.set_quick_ack(leg::quick_ack_of(stream.as_ref()));
                    inner.start(*stream, shared.clone(), rx, false);
                }
            }
            Ok(shared)
        })
    }

    fn forget(&self, leg: u64) {
        self.inner.legs.lock().unwrap_or_else(|e| e.into_inner()).remove(&leg);
    }

    fn handshake_over(&self, session: u64) {
        self.setup.admission.handshake_over(session);
    }

    fn ended(&self, session: u64) {
        self.setup.admission.ended(session);
    }
}

/// The sidecar's native data plane: a tokio runtime owning its sockets.
#[pyclass(module = "mqguard_native", frozen)]
pub struct Plane {
    runtime: Mutex<Option<Driver>>,
    inner: Arc<Inner>,
    wake_read: UnixStream,
    listeners: Mutex<Vec<JoinHandle<()>>>,
    /// Callables to run on the runtime's thread, in the order given.
    calls: mpsc::UnboundedSender<Py<PyAny>>,
}

#[pymethods]
impl Plane {
    #[new]
    fn new() -> PyResult<Self> {
        let runtime = Driver::start("mqguard-native")
            .map_err(|e| PyRuntimeError::new_err(format!("tokio runtime: {e}")))?;
        let (wake_read, wake_write) = UnixStream::pair()?;
        wake_read.set_nonblocking(true)?;
        wake_write.set_nonblocking(true)?;
        let events = Arc::new(Events::new(wake_write));
        let (calls, mut queued) = mpsc::unbounded_channel::<Py<PyAny>>();
        runtime.handle().spawn(async move {
            while let Some(call) = queued.recv().await {
                Python::attach(|py| {
                    if let Err(error) = call.call0(py) {
                        error.print(py);
                    }
                    drop(call);
                });
            }
        });
        Ok(Plane {
            runtime: Mutex::new(Some(runtime)),
            inner: Arc::new(Inner {
                bridge: Bridge::new(events.clone()),
                tally: Arc::default(),
                stopping: Arc::default(),
                protocol_errors: Arc::default(),
                events,
                legs: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                upstream_tls: Mutex::new(None),
            }),
            wake_read,
            listeners: Mutex::new(Vec::new()),
            calls,
        })
    }

    /// Run `callback()` on the runtime's thread, after the callables given before it:
    /// the native sessions' counterpart of the asyncio loop's method of the same name
    /// (their guard state belongs to that thread when `serve_sessions` got a handler).
    fn call_soon_threadsafe(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.calls
            .send(callback)
            .map_err(|_| PyRuntimeError::new_err("the native data plane is shut down"))
    }

    /// The descriptor the asyncio loop watches: readable when events are pending.
    fn wake_fd(&self) -> i32 {
        self.wake_read.as_raw_fd()
    }

    /// Listen as `listen` does, each client served by a native session of its own
    /// (handshake, receipts, subscriptions...), the guard called per batch: by
    /// `handler(session, asked, (kind, payload))` on the runtime's thread, which returns
    /// the verdicts (None: deciding failed), or without a handler through `GUARD` events
    /// answered by `verdicts`. `broker_limits`: how the broker's frames are decoded;
    /// `upstream_where`: the broker's address for error texts. At most `max_sessions`
    /// sessions (a client over it gets `full_refusal`), `max_handshakes` of them waiting
    /// for their CONNECT (the oldest is evicted for a newcomer), each sending at most
    /// `handshake_bytes` (0: no bound) before its CONNECT is complete.
    #[pyo3(signature = (hosts, port, refusal, limits, broker_limits, upstream_host, upstream_port, upstream_where, connect_timeout_ms, drain_timeout_ms, upstream_tls = false, cert = None, key = None, max_tls_handshakes = 128, handshake_timeout_ms = 10_000, handler = None, max_sessions = usize::MAX, max_handshakes = usize::MAX, handshake_bytes = 0, full_refusal = Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn serve_sessions(
        &self,
        hosts: Vec<String>,
        port: u16,
        refusal: Vec<u8>,
        limits: LimitsTuple,
        broker_limits: LimitsTuple,
        upstream_host: String,
        upstream_port: u16,
        upstream_where: String,
        connect_timeout_ms: u64,
        drain_timeout_ms: u64,
        upstream_tls: bool,
        cert: Option<String>,
        key: Option<String>,
        max_tls_handshakes: usize,
        handshake_timeout_ms: u64,
        handler: Option<Py<PyAny>>,
        max_sessions: usize,
        max_handshakes: usize,
        handshake_bytes: usize,
        full_refusal: Vec<u8>,
    ) -> PyResult<u16> {
        if let Some(handler) = handler {
            if !self.inner.bridge.set_handler(handler) {
                return Err(PyRuntimeError::new_err("this plane's batch handler is set already"));
            }
        }
        let tls_config = if upstream_tls {
            let config = self.inner.upstream_tls.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Some(config.ok_or_else(|| PyRuntimeError::new_err("upstream TLS not configured"))?)
        } else {
            None
        };
        let decoding = Decoding { limits: broker_limits, server: true, keep_wire: true };
        decoding.decoder()?;
        let setup = Arc::new(SessionSetup {
            host: upstream_host,
            port: upstream_port,
            tls: tls_config,
            decoding,
            config: Arc::new(SessionConfig {
                tally: self.inner.tally.clone(),
                connect_timeout: Duration::from_millis(connect_timeout_ms),
                drain_timeout: Duration::from_millis(drain_timeout_ms),
                upstream_where,
                stopping: self.inner.stopping.clone(),
                protocol_errors: self.inner.protocol_errors.clone(),
            }),
            admission: Admission::new(max_sessions, max_handshakes),
            handshake_bytes,
            full_refusal,
        });
        let tls = TlsFiles { cert, key, max_tls_handshakes, handshake_timeout_ms };
        self.listen_with(hosts, port, refusal, limits, tls, setup)
    }

    /// Python's verdicts on guard batch `batch` (None: deciding failed, the session
    /// ends with an ERROR): `(code, number, text, data)` each (see `session::bridge`).
    fn verdicts(&self, batch: u64, verdicts: Option<Vec<PyVerdict<'_>>>) {
        self.inner.bridge.answer(batch, verdicts.map(session::verdicts_from_py));
    }

    /// Client connections of native sessions ended by a malformed or over-limit frame.
    fn protocol_errors(&self) -> u64 {
        self.inner.protocol_errors.load(Ordering::Relaxed)
    }

    /// Frames the native sessions relayed: `(direction, command, frames)`.
    fn frame_counts(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.inner.tally.snapshot()
    }

    /// The native sessions' other totals for `/metrics`: `(metric, label, count)` (see
    /// `session::tally`).
    fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.inner.tally.counters()
    }

    /// `(sends, deliveries)` the native sessions passed on without the guard (it had
    /// nothing to do with them).
    fn bypassed(&self) -> (u64, u64) {
        self.inner.tally.bypassed()
    }

    /// Work the guard did off the receipt chain for `session` is done: what waits
    /// behind hold `key` (receipts, a DISCONNECT) may go.
    fn release(&self, session: u64, key: u64) {
        if let Some(sink) = self.inner.leg(session).and_then(|shared| shared.sink()) {
            let _ = sink.send(Event::Released(key));
        }
    }


    /// Stop accepting (listening sockets closed); legs are not touched.
    fn close_listeners(&self) {
        for task in self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }

    /// How the upstream leg does TLS: trust `cafile`'s CAs, or any certificate.
    #[pyo3(signature = (cafile = None, insecure = false))]
    fn upstream_tls(&self, cafile: Option<String>, insecure: bool) -> PyResult<()> {
        let config =
            tls::client_config(cafile.as_deref(), insecure).map_err(PyValueError::new_err)?;
        *self
            .inner
            .upstream_tls
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(config);
        Ok(())
    }

    /// Queue `data` on the leg (nothing happens once the leg has closed): what the guard
    /// writes to a session's broker leg (acknowledgements, copies, re-sends).
    fn write(&self, leg: u64, data: &[u8]) {
        if let Some(shared) = self.inner.leg(leg) {
            shared.write(data);
        }
    }

    /// Octets queued on every leg and not written yet (what the runtime holds for
    /// peers that read slower than the other side writes).
    fn queued_total(&self) -> usize {
        self.inner
            .legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|l| l.queued())
            .sum()
    }

    /// Every event since the last call, as tuples `(kind, leg, a, b)`.
    ///
    /// The one place the tokio side's results become Python objects: one GIL-holding
    /// call per burst of reads, whatever the number of connections.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut buf = [0u8; 256];
        // One byte per wake-up (see `Events::push`): one read takes it.
        let _ = (&self.wake_read).read_ready(&mut buf);
        let events = self.inner.events.take();
        let out = PyList::empty(py);
        for event in events {
            let item = match event {
                Event::Items(id, items, size, error) => {
                    if let Some(shared) = self.inner.leg(id) {
                        shared.drained(size);
                    }
                    let list = PyList::empty(py);
                    for item in items {
                        list.append(stomp::item_into_py(py, item)?)?;
                    }
                    match error {
                        None => (
                            ITEMS,
                            id,
                            list.into_any(),
                            size.into_pyobject(py)?.into_any(),
                        ),
                        Some(error) => (
                            MALFORMED,
                            id,
                            list.into_any(),
                            (size, error.reason, error.detail)
                                .into_pyobject(py)?
                                .into_any(),
                        ),
                    }
                }
                Event::Eof(id) => (EOF, id, py.None().into_bound(py), py.None().into_bound(py)),
                Event::Closed(id, error) => {
                    self.inner
                        .legs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id);
                    match error {
                        Some((errno, text)) => (
                            CLOSED,
                            id,
                            errno.into_pyobject(py)?.into_any(),
                            text.into_pyobject(py)?.into_any(),
                        ),
                        None => (
                            CLOSED,
                            id,
                            py.None().into_bound(py),
                            py.None().into_bound(py),
                        ),
                    }
                }
                Event::Guard(session, batch, guard) => (
                    GUARD,
                    session,
                    batch.into_pyobject(py)?.into_any(),
                    session::batch_into_py(py, guard)?,
                ),
                Event::Released(_) | Event::Stop | Event::Evicted(_) => continue,
                Event::Refused(why) => (
                    REFUSED,
                    0,
                    why.into_pyobject(py)?.into_any(),
                    py.None().into_bound(py),
                ),
            };
            out.append(PyTuple::new(
                py,
                [
                    item.0.into_pyobject(py)?.into_any(),
                    item.1.into_pyobject(py)?.into_any(),
                    item.2,
                    item.3,
                ],
            )?)?;
        }
        Ok(out)
    }

    /// Legs open now (connections being set up included).
    fn leg_count(&self) -> usize {
        self.inner
            .legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Graceful stop of the native sessions: no more clients are accepted, and every
    /// session reads no more client frames, lets what is in flight settle (within its
    /// drain-timeout-ms), tells its client with an ERROR and ends. Waits `timeout_ms` at
    /// most for them to end, without the GIL (they call the guard meanwhile); returns
    /// how many are still alive.
    fn stop_sessions(&self, py: Python<'_>, timeout_ms: u64) -> usize {
        self.close_listeners();
        let stopping = self.inner.stopping.clone();
        py.detach(|| {
            stopping.stop();
            stopping.wait(Duration::from_millis(timeout_ms));
        });
        stopping.live()
    }

    /// Stop the runtime: every leg still open is dropped (after `timeout_ms` at most for
    /// its tasks to notice).
    #[pyo3(signature = (timeout_ms = 1000))]
    fn shutdown(&self, py: Python<'_>, timeout_ms: u64) {
        self.close_listeners();
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(runtime) = runtime {
            py.detach(|| runtime.shutdown(Duration::from_millis(timeout_ms)));
        }
        self.inner
            .legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Plane {
    fn listen_with(
        &self,
        hosts: Vec<String>,
        port: u16,
        refusal: Vec<u8>,
        limits: LimitsTuple,
        files: TlsFiles,
        sessions: Arc<SessionSetup>,
    ) -> PyResult<u16> {
        let TlsFiles { cert, key, max_tls_handshakes, handshake_timeout_ms } = files;
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsAcceptor::from(
                tls::server_config(&cert, &key).map_err(PyValueError::new_err)?,
            )),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "TLS needs both a certificate and a key",
                ))
            }
        };
        let setup = Arc::new(Listening {
            tls,
            max_setting_up: max_tls_handshakes.max(1),
            setting_up: Arc::new(AtomicUsize::new(0)),
            handshake_timeout: Duration::from_millis(handshake_timeout_ms),
            refusal,
            decoding: Decoding {
                limits,
                server: false,
                keep_wire: false,
            },
            sessions,
        });
        setup.decoding.decoder()?; // invalid limits: an error now, not at each accept
        let handle = self.handle()?;
        let _guard = handle.enter();
        let mut port = port;
        let mut listeners = Vec::new();
        for host in hosts {
            let ip: std::net::IpAddr = host
                .parse()
                .map_err(|_| PyValueError::new_err(format!("not an IP address: {host:?}")))?;
            let addr = SocketAddr::new(ip, port);
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            if addr.is_ipv6() {
                socket2::SockRef::from(&socket).set_only_v6(true)?;
            }
            socket.bind(addr)?;
            let listener = socket.listen(128)?;
            port = listener.local_addr()?.port();
            listeners.push(listener);
        }
        let mut tasks = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        for listener in listeners {
            tasks.push(handle.spawn(accept_loop(listener, setup.clone(), self.inner.clone())));
        }
        Ok(port)
    }

    fn handle(&self) -> PyResult<tokio::runtime::Handle> {
        self.runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|rt| rt.handle().clone())
            .ok_or_else(|| PyRuntimeError::new_err("the native data plane was shut down"))
    }
}

/// A listener's TLS: certificate and key files, handshakes in progress at most, and how
/// long one may take.
struct TlsFiles {
    cert: Option<String>,
    key: Option<String>,
    max_tls_handshakes: usize,
    handshake_timeout_ms: u64,
}

trait ReadReady {
    fn read_ready(self, buf: &mut [u8]) -> std::io::Result<usize>;
}

impl ReadReady for &UnixStream {
    fn read_ready(self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Read;
        let mut stream = self;
        stream.read(buf)
    }
}

enum Upstream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn open_upstream(
    host: &str,
    port: u16,
    tls: Option<Arc<ClientConfig>>,
) -> Result<Upstream, (i32, String, bool)> {
    let os_error = |e: std::io::Error| (e.raw_os_error().unwrap_or(0), e.to_string(), false);
    let tcp = TcpStream::connect((host, port)).await.map_err(os_error)?;
    let _ = tcp.set_nodelay(true);
    let Some(config) = tls else {
        return Ok(Upstream::Plain(tcp));
    };
    let name = tls::server_name(host).map_err(|text| (0, text, true))?;
    match TlsConnector::from(config).connect(name, tcp).await {
        Ok(stream) => Ok(Upstream::Tls(Box::new(stream))),
        Err(e) => Err((
            e.raw_os_error().unwrap_or(0),
            e.to_string(),
            e.raw_os_error().is_none(),
        )),
    }
}

fn out_of_descriptors(error: &std::io::Error) -> bool {
    error.raw_os_error().is_some_and(out_of_descriptors_errno)
}

fn out_of_descriptors_errno(errno: i32) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM
    matches!(errno, 24 | 23 | 105 | 12)
}

async fn accept_loop(listener: TcpListener, setup: Arc<Listening>, inner: Arc<Inner>) {
    // Held so that, out of descriptors, one can be freed to tell a client why it is
    // refused instead of leaving it in the backlog without a word.
    let mut spare = File::open("/dev/null").ok();
    let sessions = setup.sessions.clone();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                if out_of_descriptors(&error) {
                    inner.events.push(Event::Refused("fd"));
                    if spare.take().is_some() {
                        refuse_one(&listener, &setup).await;
                        spare = File::open("/dev/null").ok();
                    }
                    // Let sessions end and free descriptors before trying again.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                // Otherwise a client that left before it was accepted.
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let Some(acceptor) = setup.tls.clone() else {
            let Ok(decoder) = setup.decoding.decoder() else {
                continue;
            };
            let (shared, rx) = inner.new_leg(decoder);
            let peer = (peer.ip().to_string(), peer.port());
            sessions.admission.room().await;
            let Some(sink) = start_session(&inner, &sessions, shared.clone(), peer) else {
                tokio::spawn(refuse(tcp, sessions.full_refusal.clone()));
                continue;
            };
            shared.set_sink(sink);
            inner.start_plain(tcp, shared, rx, false);
            // Its handshake, its eviction: before the next client is accepted.
            tokio::task::yield_now().await;
            continue;
        };
        if setup.setting_up.load(Ordering::Acquire) >= setup.max_setting_up {
            // TLS handshakes in progress count as pending handshakes; over the budget
            // there is no way to say why in plain text.
            inner.events.push(Event::Refused("tls"));
            continue;
        }
        setup.setting_up.fetch_add(1, Ordering::AcqRel);
        let setup = setup.clone();
        let inner = inner.clone();
        let sessions = sessions.clone();
        tokio::spawn(async move {
            let done = tokio::time::timeout(setup.handshake_timeout, acceptor.accept(tcp)).await;
            setup.setting_up.fetch_sub(1, Ordering::AcqRel);
            if let (Ok(Ok(stream)), Ok(decoder)) = (done, setup.decoding.decoder()) {
                let (shared, rx) = inner.new_leg(decoder);
                let peer = (peer.ip().to_string(), peer.port());
                let Some(sink) = start_session(&inner, &sessions, shared.clone(), peer) else {
                    tokio::spawn(refuse(stream, sessions.full_refusal.clone()));
                    return;
                };
                shared.set_sink(sink);
                inner.start(stream, shared, rx, false);
            }
        });
        tokio::task::yield_now().await;
    }
}

async fn refuse_one(listener: &TcpListener, setup: &Listening) {
    if let Ok(Ok((tcp, _))) =
        tokio::time::timeout(Duration::from_millis(10), listener.accept()).await
    {
        if setup.tls.is_none() {
            // Fits any socket buffer: written at once or not at all.
            let _ = tcp.try_write(&setup.refusal);
        }
    }
}

/// Spawn the native session of an accepted client; returns where its legs' reads go,
/// or None when the client is refused (max-connections; its leg is dropped).
fn start_session(
    inner: &Arc<Inner>,
    setup: &Arc<SessionSetup>,
    client: Arc<leg::Shared>,
    peer: (String, u16),
) -> Option<mpsc::UnboundedSender<Event>> {
    let (tx, rx) = mpsc::unbounded_channel();
    match setup.admission.admit(client.id, tx.clone()) {
        Admit::Refused => {
            inner.legs.lock().unwrap_or_else(|e| e.into_inner()).remove(&client.id);
            inner.events.push(Event::Refused("max"));
            return None;
        }
        Admit::Admitted(Some(oldest)) => {
            let reason = format!(
                "too many pending handshakes (max-pending-handshakes = {}): no CONNECT in time",
                setup.admission.max_pending
            );
            let _ = oldest.send(Event::Evicted(reason));
        }
        Admit::Admitted(None) => {}
    }
    if setup.handshake_bytes > 0 {
        client.set_handshake(setup.handshake_bytes);
    }
    let host: Arc<dyn Host> = Arc::new(SessionHost { inner: inner.clone(), setup: setup.clone() });
    let session = Session::new(host, inner.bridge.clone(), setup.config.clone(), client, rx, tx.clone(), peer);
    tokio::spawn(session.run());
    Some(tx)
}

/// Tell a client refused at max-connections why, then close (STOMP: ERROR, then close).
async fn refuse<S: tokio::io::AsyncWrite + Unpin>(mut stream: S, refusal: Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    let written = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&refusal).await?;
        stream.shutdown().await
    });
    let _ = written.await;
}
