//! One leg of a proxied connection: a socket (TCP or TLS) with a reader and a writer.
//!
//! The reader hands each read to the event queue (see `events`); the writer drains the
//! leg's outgoing queue, coalescing what Python wrote since its last write into one
//! system call. On a plain TCP leg a write made while nothing is queued skips the queue
//! and goes to the socket from the calling thread (`Shared::write`). Reader and writer
//! run concurrently inside one task, so that a reset can take the two halves of the
//! stream back and drop the socket with `SO_LINGER 0`.
//!
//! Reading pauses for any of four reasons, kept as bits: Python asked (`PY`: the
//! handshake hold, a full pre-relay queue), the coupled leg's outgoing queue is over
//! its high-water mark (`PEER`: back-pressure), Python has not drained this leg's reads
//! yet (`BACKLOG`: the loop is behind) or reading stopped for good (`STOP`).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

use super::events::{Event, Events};
use super::handshake::{Check, HandshakeBudget};
use crate::stomp::{Decoder, Item, Version};

pub const PY: u8 = 1;
pub const PEER: u8 = 2;
pub const BACKLOG: u8 = 4;
pub const STOP: u8 = 8;

/// Outgoing bytes above which the coupled leg stops reading (as asyncio's write buffer).
pub const HIGH_WATER: usize = 1 << 20;
/// ... and below which it reads again.
pub const LOW_WATER: usize = HIGH_WATER / 4;
/// Read octets Python has not drained yet above which this leg stops reading.
pub const BACKLOG_LIMIT: usize = 1 << 20;
/// Size of one read.
const READ_SIZE: usize = 64 * 1024;
/// Most octets of queued writes joined into one write.
const COALESCE: usize = 256 * 1024;

/// A socket the leg can read, write and, for a reset, reach as TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Io for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// A plain TCP leg: the socket shared by the leg's task and the writes Python makes
/// when nothing is queued (see `Shared::write`), which then leave at once from the
/// calling thread instead of waking the runtime's.
pub struct SharedTcp(pub Arc<TcpStream>);

impl AsyncRead for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(size) => {
                    buf.advance(size);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(data) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}

impl Io for SharedTcp {
    fn tcp(&self) -> &TcpStream {
        &self.0
    }
}

impl Io for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl Io for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

pub enum Cmd {
    Data(Vec<u8>),
    /// Write what is queued, shut the sending side down, close.
    Close,
}

/// How a leg ends without waiting for its queue.
const END_ABORT: u8 = 1;
const END_RESET: u8 = 2;

/// The state of a leg that Python's calls and the leg's task share.
pub struct Shared {
    pub id: u64,
    pauses: AtomicU8,
    gate: Notify,
    queued: AtomicUsize,
    backlog: AtomicUsize,
    peer: Mutex<Option<Arc<Shared>>>,
    holding_peer: AtomicBool,
    end: AtomicU8,
    end_now: Notify,
    tx: UnboundedSender<Cmd>,
    /// Locked by the reader for each read, by Python to change the version (after
    /// CONNECTED) or to ask how much of a frame is buffered.
    decoder: Mutex<Decoder>,
    /// A plain TCP leg's socket, for writes made when nothing is queued; None for TLS
    /// and once the leg has closed (or is closing).
    direct: Mutex<Option<Arc<TcpStream>>>,
    /// A leg served by a native session: its reads go to the session's task, not to
    /// Python's event queue.
    sink: Mutex<Option<UnboundedSender<Event>>>,
    /// A client leg before its first frame: what it may send (see `handshake`).
    handshake: Mutex<Option<HandshakeBudget>>,
    /// Whether `handshake` holds a budget: the reads of every other leg skip its lock.
    handshaking: AtomicBool,
    /// A socket for quick-acks on demand (see `quick_ack`); None once the leg closed.
    quick_ack: Mutex<Option<socket2::Socket>>,
}

impl Shared {
    pub fn new(id: u64, tx: UnboundedSender<Cmd>, decoder: Decoder) -> Arc<Self> {
        Arc::new(Shared {
            id,
            pauses: AtomicU8::new(0),
            gate: Notify::new(),
            queued: AtomicUsize::new(0),
            backlog: AtomicUsize::new(0),
            peer: Mutex::new(None),
            holding_peer: AtomicBool::new(false),
            end: AtomicU8::new(0),
            end_now: Notify::new(),
            tx,
            decoder: Mutex::new(decoder),
            direct: Mutex::new(None),
            sink: Mutex::new(None),
            handshake: Mutex::new(None),
            handshaking: AtomicBool::new(false),
            quick_ack: Mutex::new(None),
        })
    }

    /// The socket to send quick-acks through when `quick_ack` is called (a duplicate,
    /// see `quick_ack_of`), instead of after every read.
    pub fn set_quick_ack(&self, socket: Option<socket2::Socket>) {
        *self.quick_ack.lock().unwrap_or_else(|e| e.into_inner()) = socket;
    }

    /// Acknowledge what was read at once (TCP_QUICKACK), if the leg is still open: a
    /// peer writing with Nagle on then sends what it holds back behind that data.
    pub fn quick_ack(&self) {
        if let Some(socket) = self.quick_ack.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = socket.set_tcp_quickack(true);
        }
    }

    /// Hand this leg's reads, end of stream and closing to `sink` from now on.
    pub fn set_sink(&self, sink: UnboundedSender<Event>) {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// Bound what the peer sends up to the end of its first frame to `limit` octets,
    /// and hold reading (`PY`) once that frame is complete.
    pub fn set_handshake(&self, limit: usize) {
        *self.handshake.lock().unwrap_or_else(|e| e.into_inner()) = Some(HandshakeBudget::new(limit));
        self.handshaking.store(true, Ordering::Release);
    }

    /// One read against the handshake budget, if the leg has one still: `items` keep
    /// only heart-beats when it is exceeded.
    fn check_handshake(&self, size: usize, items: &mut Vec<Item>) -> Result<(), crate::stomp::FrameError> {
        if !self.handshaking.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut budget = self.handshake.lock().unwrap_or_else(|e| e.into_inner());
        let Some(check) = budget.as_mut().map(|b| b.check(size, items)) else {
            return Ok(());
        };
        if check != Check::Pending {
            *budget = None;
            self.handshaking.store(false, Ordering::Release);
        }
        match check {
            Check::Pending => Ok(()),
            Check::Complete => {
                self.set_pause(PY, true);
                Ok(())
            }
            Check::Over(error) => {
                items.retain(|item| matches!(item, Item::Heartbeat));
                Err(error)
            }
        }
    }

    /// The session task serving this leg, if one does.
    pub fn sink(&self) -> Option<UnboundedSender<Event>> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn emit(&self, events: &Events, event: Event) {
        match self.sink() {
            Some(sink) => {
                let _ = sink.send(event);
            }
            None => events.push(event),
        }
    }

    pub fn set_pause(&self, bit: u8, on: bool) {
        if on {
            self.pauses.fetch_or(bit, Ordering::AcqRel);
        } else if self.pauses.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            // notify_one keeps a permit: a reader about to wait still sees it.
            self.gate.notify_one();
        }
    }

    pub fn couple(&self, peer: Option<Arc<Shared>>) {
        *self.peer.lock().unwrap_or_else(|e| e.into_inner()) = peer;
    }

    fn peer(&self) -> Option<Arc<Shared>> {
        self.peer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_direct(&self, stream: Arc<TcpStream>) {
        *self.direct.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
    }

    fn end_direct(&self) {
        self.direct.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Write `data` now if nothing is queued before it and the socket takes it (plain
    /// TCP); queue it, or what the socket did not take, otherwise. Over the high-water
    /// mark, the coupled leg stops reading.
    pub fn write(&self, data: &[u8]) {
        let mut data = data;
        if data.is_empty() {
            return;
        }
        if self.queued.load(Ordering::Acquire) == 0 {
            // Nothing queued: the leg's writer has nothing in flight, so this write
            // cannot overtake one. Only the Python thread adds to the queue.
            let direct = self.direct.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(stream) = direct.as_ref() {
                match stream.try_write(data) {
                    Ok(size) if size == data.len() => return,
                    Ok(size) => data = &data[size..],
                    Err(_) => {} // would block, or an error the writer reports
                }
            }
        }
        let data = data.to_vec();
        let size = data.len();
        // Counted before the writer can see it: its subtraction must never come first.
        let queued = self.queued.fetch_add(size, Ordering::AcqRel) + size;
        if self.tx.send(Cmd::Data(data)).is_err() {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return; // the leg is gone: nothing more reaches its peer
        }
        if queued > HIGH_WATER && !self.holding_peer.swap(true, Ordering::AcqRel) {
            if let Some(peer) = self.peer() {
                peer.set_pause(PEER, true);
            }
        }
    }

    fn wrote(&self, size: usize) {
        let queued = self.queued.fetch_sub(size, Ordering::AcqRel) - size;
        if queued <= LOW_WATER && self.holding_peer.swap(false, Ordering::AcqRel) {
            if let Some(peer) = self.peer() {
                peer.set_pause(PEER, false);
            }
        }
    }

    /// Release the coupled leg for good (this one ended: nothing waits on its queue).
    fn release_peer(&self) {
        if let Some(peer) = self.peer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if self.holding_peer.swap(false, Ordering::AcqRel) {
                peer.set_pause(PEER, false);
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Python took `size` read octets of this leg.
    pub fn drained(&self, size: usize) {
        let left = self.backlog.fetch_sub(size, Ordering::AcqRel) - size;
        if left <= BACKLOG_LIMIT / 2 {
            self.set_pause(BACKLOG, false);
        }
    }

    fn decoder(&self) -> std::sync::MutexGuard<'_, Decoder> {
        self.decoder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The STOMP version the peer speaks now, and whether a frame over the limits is
    /// handed on (`Oversized`) instead of ending the connection.
    pub fn set_decoding(&self, version: Version, oversized: bool) {
        let mut decoder = self.decoder();
        decoder.set_version(version);
        decoder.set_oversized(oversized);
    }

    /// Octets held of an incomplete frame.
    pub fn buffered(&self) -> usize {
        self.decoder().buffered()
    }

    /// Decode `data` as if this leg had read it, counted as a read (the session's
    /// scripted runs feed a leg this way, without a socket).
    pub fn feed(&self, data: &[u8]) -> (Vec<crate::stomp::Item>, Option<crate::stomp::FrameError>) {
        let mut items = Vec::new();
        let result = self.decoder().feed(data, &mut items);
        self.backlog.fetch_add(data.len(), Ordering::AcqRel);
        (items, result.err())
    }

    pub fn close(&self) {
        self.end_direct();
        let _ = self.tx.send(Cmd::Close);
    }

    /// Drop the connection now; `reset`: with an RST (SO_LINGER 0), discarding what
    /// the kernel still holds for a peer that does not read.
    pub fn end_now(&self, reset: bool) {
        self.end_direct();
        self.end
            .fetch_max(if reset { END_RESET } else { END_ABORT }, Ordering::AcqRel);
        self.end_now.notify_one();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    events: &Events,
    quick_ack: Option<&socket2::Socket>,
) -> io::Result<()> {
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        while shared.pauses.load(Ordering::Acquire) != 0 {
            shared.gate.notified().await;
        }
        let size = reader.read(&mut buf).await?;
        if size == 0 {
            shared.emit(events, Event::Eof(shared.id));
            return Ok(());
        }
        if let Some(socket) = quick_ack {
            // The kernel leaves quick-ack mode by itself: re-armed after every read.
            let _ = socket.set_tcp_quickack(true);
        }
        let mut items = Vec::new();
        let mut result = shared.decoder().feed(&buf[..size], &mut items);
        if result.is_ok() {
            result = shared.check_handshake(size, &mut items);
        }
        // What Python has not taken yet: the decoded frames, about the octets read
        // (an incomplete frame stays in the decoder, bounded by its limits).
        if shared.backlog.fetch_add(size, Ordering::AcqRel) + size > BACKLOG_LIMIT {
            shared.set_pause(BACKLOG, true);
            // Drained in between: the flag must not outlive the backlog.
            if shared.backlog.load(Ordering::Acquire) <= BACKLOG_LIMIT / 2 {
                shared.set_pause(BACKLOG, false);
            }
        }
        let failed = result.is_err();
        shared.emit(events, Event::Items(shared.id, items, size, result.err()));
        if failed {
            // A malformed frame: nothing more is read; the session answers and closes.
            shared.set_pause(STOP, true);
            return Ok(());
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: &mut W,
    rx: &mut UnboundedReceiver<Cmd>,
    shared: &Shared,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let mut close = false;
        match rx.recv().await {
            Some(Cmd::Data(data)) => buf = data,
            Some(Cmd::Close) | None => close = true,
        }
        while !close && buf.len() < COALESCE {
            match rx.try_recv() {
                Ok(Cmd::Data(data)) => buf.extend_from_slice(&data),
                Ok(Cmd::Close) => close = true,
                Err(_) => break,
            }
        }
        if !buf.is_empty() {
            writer.write_all(&buf).await?;
            writer.flush().await?;
            shared.wrote(buf.len());
            buf.clear();
        }
        if close {
            writer.shutdown().await?;
            return Ok(());
        }
    }
}

/// A duplicate of `io`'s socket to re-arm TCP_QUICKACK through after each read.
///
/// A broker writing with Nagle on (ActiveMQ's default transport) sends a RECEIPT and
/// the MESSAGE behind it as two small segments, and the MESSAGE waits for the ack of
/// the RECEIPT, which Linux delays by 40 ms unless quick-ack mode is on.
pub fn quick_ack_of<S: Io>(io: &S) -> Option<socket2::Socket> {
    use std::os::fd::AsFd;
    io.tcp()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .map(socket2::Socket::from)
}

/// Serve one leg until it closes, then report how (`Event::Closed`).
pub async fn run<S: Io + 'static>(
    io: S,
    shared: Arc<Shared>,
    mut rx: UnboundedReceiver<Cmd>,
    events: Arc<Events>,
    quick_ack: Option<socket2::Socket>,
) {
    let (mut reader, mut writer) = tokio::io::split(io);
    let outcome: Option<io::Error>;
    {
        let read = read_loop(&mut reader, &shared, &events, quick_ack.as_ref());
        let write = write_loop(&mut writer, &mut rx, &shared);
        tokio::pin!(read);
        tokio::pin!(write);
        let mut reading = true;
        outcome = loop {
            tokio::select! {
                done = &mut read, if reading => match done {
                    Ok(()) => reading = false, // end of stream: writing goes on
                    Err(error) => break Some(error),
                },
                done = &mut write => break done.err(),
                _ = shared.end_now.notified() => break None,
            }
        };
    }
    shared.set_pause(STOP, true);
    shared.release_peer();
    shared.end_direct(); // the last reference to the socket besides the task's
    if shared.end.load(Ordering::Acquire) == END_RESET {
        let io = reader.unsplit(writer);
        let _ = io.tcp().set_zero_linger();
        drop(io);
    } else {
        drop(reader);
        drop(writer);
    }
    drop(quick_ack);
    // The duplicate would keep the connection open.
    shared.set_quick_ack(None);
    rx.close();
    let error = outcome.map(|e| (e.raw_os_error().unwrap_or(0), e.to_string()));
    shared.emit(&events, Event::Closed(shared.id, error));
}
