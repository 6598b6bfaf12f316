//! `MqttPlane`: the tokio runtime of one MQTT sidecar, seen from Python.
//!
//! Every method is called on the asyncio loop's thread (or a job thread) and returns
//! without waiting for I/O. Events come back through `drain()`, one call per wake-up.

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::net::TcpSocket;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::events::{Event, Events, Msg};
use super::session::{serve, Cmd, Ctx, Verdict};
use crate::mqtt::Limits;

/// Event kinds, as `drain` returns them (first item of each 4-tuple).
const OPENED: u8 = 0;
const SENDS: u8 = 1;
const DELIVERIES: u8 = 2;
const SETTLED: u8 = 3;
const ACKED: u8 = 4;
const PUBLISHED: u8 = 5;
const GONE: u8 = 6;
const CLOSED: u8 = 7;
const PROTOCOL_ERROR: u8 = 8;

/// A verdict as Python gives it: (action, token, topic, expiry, user properties, reason).
type VerdictTuple = (
    u8,
    u64,
    Option<String>,
    Option<u32>,
    Vec<(String, String)>,
    Option<String>,
);

/// The MQTT sidecar's data plane: listener, sessions and upstream connections on tokio.
#[pyclass(module = "mqguard_native", frozen)]
pub struct MqttPlane {
    runtime: Mutex<Option<Runtime>>,
    ctx: Arc<Ctx>,
    wake_read: UnixStream,
    listeners: Mutex<Vec<JoinHandle<()>>>,
}

fn msgs_into_py<'py>(py: Python<'py>, messages: Vec<Msg>) -> PyResult<Bound<'py, PyAny>> {
    let list = PyList::empty(py);
    for m in messages {
        let item = (
            m.topic,
            m.qos,
            m.retain,
            m.dup,
            m.packet_id,
            m.user,
            m.expiry,
            PyBytes::new(py, &m.payload),
        );
        list.append(item.into_pyobject(py)?)?;
    }
    Ok(list.into_any())
}

impl MqttPlane {
    fn command(&self, conn: u64, cmd: Cmd) -> bool {
        match self
            .ctx
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&conn)
        {
            Some(tx) => tx.send(cmd).is_ok(),
            None => false,
        }
    }

    fn handle(&self) -> PyResult<tokio::runtime::Handle> {
        self.runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|rt| rt.handle().clone())
            .ok_or_else(|| PyRuntimeError::new_err("the MQTT plane is shut down"))
    }
}

#[pymethods]
impl MqttPlane {
    /// `upstream_host`/`upstream_port`: the broker every client connection is relayed to;
    /// `tls_cert`/`tls_key`: PEM files to serve clients over TLS with; `upstream_tls`: the
    /// broker is reached over TLS, its certificate checked against `upstream_ca` (or not
    /// at all, `upstream_insecure`).
    /// `max_packet_bytes` etc. bound what a client may send; `release_grace_ms` is how long
    /// an upstream connection outlives its client at most, waiting for `release`.
    #[new]
    #[pyo3(signature = (upstream_host, upstream_port, max_packet_bytes = 1 << 20, max_properties = 64, max_property_bytes = 16384, max_filters = 64, worker_threads = 1, release_grace_ms = 5000, max_connections = 1024, tls_cert = None, tls_key = None, max_handshake_bytes = 65536, upstream_tls = false, upstream_ca = None, upstream_insecure = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        upstream_host: String,
        upstream_port: u16,
        max_packet_bytes: usize,
        max_properties: usize,
        max_property_bytes: usize,
        max_filters: usize,
        worker_threads: usize,
        release_grace_ms: u64,
        max_connections: usize,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        max_handshake_bytes: usize,
        upstream_tls: bool,
        upstream_ca: Option<String>,
        upstream_insecure: bool,
    ) -> PyResult<Self> {
        let upstream_tls = if upstream_tls {
            let connector = super::tls::connector(upstream_ca.as_deref(), upstream_insecure)
                .map_err(PyValueError::new_err)?;
            let name = super::tls::server_name(&upstream_host).map_err(PyValueError::new_err)?;
            Some((connector, name))
        } else {
            None
        };
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => {
                Some(super::tls::acceptor(&cert, &key).map_err(PyValueError::new_err)?)
            }
            (None, None) => None,
            _ => return Err(PyValueError::new_err("tls_cert and tls_key go together")),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.clamp(1, 16))
            .thread_name("mqguard-mqtt")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("tokio runtime: {e}")))?;
        let (wake_read, wake_write) = UnixStream::pair()?;
        wake_read.set_nonblocking(true)?;
        wake_write.set_nonblocking(true)?;
        let client_limits = Limits {
            max_packet_bytes,
            max_properties,
            max_property_bytes,
            max_filters,
        };
        Ok(MqttPlane {
            runtime: Mutex::new(Some(runtime)),
            ctx: Arc::new(Ctx {
                events: Arc::new(Events::new(wake_write)),
                upstream: (upstream_host, upstream_port),
                client_limits,
                upstream_tls,
                max_handshake_bytes: max_handshake_bytes.clamp(16, max_packet_bytes.max(16)),
                tls,
                broker_limits: Limits::default(),
                release_grace: Duration::from_millis(release_grace_ms),
                max_connections: max_connections.max(1),
                accepted: AtomicUsize::new(0),
                conns: Mutex::new(HashMap::new()),
                waiting: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                next_batch: AtomicU64::new(1),
            }),
            wake_read,
            listeners: Mutex::new(Vec::new()),
        })
    }

    /// The descriptor the asyncio loop watches: readable when events are pending.
    fn wake_fd(&self) -> i32 {
        self.wake_read.as_raw_fd()
    }

    /// Listen on `host:port` (0: any free port) and serve clients; returns the port.
    fn listen(&self, host: String, port: u16) -> PyResult<u16> {
        let handle = self.handle()?;
        let _guard = handle.enter();
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
        socket.bind(addr)?;
        let listener = socket.listen(1024)?;
        let port = listener.local_addr()?.port();
        let ctx = self.ctx.clone();
        let task = handle.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        // Handshakes count too: twice the sessions' budget at most, so
                        // idle sockets cannot pile up without bound.
                        if ctx.accepted.load(Ordering::Relaxed)
                            >= ctx.max_connections.saturating_mul(2)
                        {
                            drop(stream);
                            continue;
                        }
                        ctx.accepted.fetch_add(1, Ordering::Relaxed);
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            serve(ctx.clone(), stream, peer).await;
                            ctx.accepted.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    // Out of descriptors and the like: wait instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
        Ok(port)
    }

    /// Stop accepting clients (connections are not touched).
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

    /// The verdicts of batch `batch`, one per message in order: (action, token, topic,
    /// expiry, user properties, reason). Unknown batches are ignored (the session ended).
    fn verdicts(&self, batch: u64, verdicts: Vec<VerdictTuple>) {
        let waiting = self
            .ctx
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&batch);
        if let Some(tx) = waiting {
            let verdicts = verdicts
                .into_iter()
                .map(|(action, token, topic, expiry, user, reason)| Verdict {
                    action,
                    token,
                    topic,
                    expiry,
                    user,
                    reason,
                })
                .collect();
            let _ = tx.send(verdicts);
        }
    }

    /// Acknowledge delivery `packet_id` (of QoS `qos`) upstream on `conn`; False when the
    /// connection is gone.
    fn ack(&self, conn: u64, packet_id: u16, qos: u8) -> bool {
        self.command(conn, Cmd::Ack { packet_id, qos })
    }

    /// Publish at QoS 1 upstream on `conn`; the outcome comes as a PUBLISHED event with
    /// `token`. False when the connection is gone (no event then).
    #[pyo3(signature = (conn, token, topic, payload, retain = false, user = Vec::new(), expiry = None))]
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        conn: u64,
        token: u64,
        topic: String,
        payload: Vec<u8>,
        retain: bool,
        user: Vec<(String, String)>,
        expiry: Option<u32>,
    ) -> bool {
        self.command(
            conn,
            Cmd::Publish {
                token,
                topic,
                payload,
                retain,
                user,
                expiry,
            },
        )
    }

    /// The guard is done with `conn` after its client left: the upstream closes.
    fn release(&self, conn: u64) -> bool {
        self.command(conn, Cmd::Release)
    }

    /// Every client is told the sidecar stops and left as gone (see `Gone` events):
    /// the guard settles what each had in flight, then releases it.
    fn shutdown_sessions(&self) {
        for tx in self
            .ctx
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let _ = tx.send(Cmd::Shutdown);
        }
    }

    /// Close both legs of `conn` now.
    fn close(&self, conn: u64) -> bool {
        self.command(conn, Cmd::Abort)
    }

    /// Connections open now.
    fn connection_count(&self) -> usize {
        self.ctx
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Every event since the last call, as 4-tuples (kind, connection, a, b).
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut buf = [0u8; 256];
        let _ = (&self.wake_read).read(&mut buf);
        let out = PyList::empty(py);
        for event in self.ctx.events.take() {
            let none = || py.None().into_bound(py);
            let (kind, conn, a, b): (u8, u64, Bound<'py, PyAny>, Bound<'py, PyAny>) = match event {
                Event::Opened {
                    conn,
                    client_id,
                    level,
                    clean,
                    peer,
                } => (
                    OPENED,
                    conn,
                    (client_id, level, clean).into_pyobject(py)?.into_any(),
                    peer.into_pyobject(py)?.into_any(),
                ),
                Event::Sends {
                    conn,
                    batch,
                    messages,
                } => (
                    SENDS,
                    conn,
                    batch.into_pyobject(py)?.into_any(),
                    msgs_into_py(py, messages)?,
                ),
                Event::Deliveries {
                    conn,
                    batch,
                    messages,
                } => (
                    DELIVERIES,
                    conn,
                    batch.into_pyobject(py)?.into_any(),
                    msgs_into_py(py, messages)?,
                ),
                Event::Settled { conn, outcomes } => (
                    SETTLED,
                    conn,
                    outcomes.into_pyobject(py)?.into_any(),
                    none(),
                ),
                Event::Acked { conn, packet_ids } => (
                    ACKED,
                    conn,
                    packet_ids.into_pyobject(py)?.into_any(),
                    none(),
                ),
                Event::Published { token, reason } => (
                    PUBLISHED,
                    0,
                    token.into_pyobject(py)?.into_any(),
                    reason.into_pyobject(py)?.into_any(),
                ),
                Event::Gone { conn, graceful } => (
                    GONE,
                    conn,
                    graceful.into_pyobject(py)?.to_owned().into_any(),
                    none(),
                ),
                Event::Closed { conn, reason } => {
                    (CLOSED, conn, reason.into_pyobject(py)?.into_any(), none())
                }
                Event::ProtocolError {
                    conn,
                    side,
                    kind,
                    detail,
                } => (
                    PROTOCOL_ERROR,
                    conn,
                    (side, kind).into_pyobject(py)?.into_any(),
                    detail.into_pyobject(py)?.into_any(),
                ),
            };
            out.append(PyTuple::new(
                py,
                [
                    kind.into_pyobject(py)?.into_any(),
                    conn.into_pyobject(py)?.into_any(),
                    a,
                    b,
                ],
            )?)?;
        }
        Ok(out)
    }

    /// Stop: listeners and sessions end, the runtime shuts down (waits at most `timeout_ms`).
    #[pyo3(signature = (timeout_ms = 1000))]
    fn shutdown(&self, py: Python<'_>, timeout_ms: u64) {
        self.close_listeners();
        self.ctx
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.ctx
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(runtime) = runtime {
            py.detach(|| runtime.shutdown_timeout(Duration::from_millis(timeout_ms)));
        }
    }
}
