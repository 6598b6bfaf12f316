//! What the MQTT sessions tell Python: a queue of events and one wake-up per burst
//! (the same scheme as the STOMP plane: a byte on a socket pair when the queue goes from
//! drained to pending, one `drain()` call takes everything).

/// One application message as Python sees it: plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub topic: String,
    pub qos: u8,
    pub retain: bool,
    pub dup: bool,
    /// 0 for QoS 0.
    pub packet_id: u16,
    pub user: Vec<(String, String)>,
    /// MQTT 5 Message Expiry Interval (seconds), if set.
    pub expiry: Option<u32>,
    pub payload: Vec<u8>,
}

pub enum Event {
    /// A client's CONNECT was read: client id, protocol level, clean start, peer address.
    Opened {
        conn: u64,
        client_id: String,
        level: u8,
        clean: bool,
        peer: String,
    },
    /// The client's PUBLISHes of one read; Python answers with `verdicts(batch, ...)`.
    Sends {
        conn: u64,
        batch: u64,
        messages: Vec<Msg>,
    },
    /// The broker's PUBLISHes of one read; Python answers with `verdicts(batch, ...)`.
    Deliveries {
        conn: u64,
        batch: u64,
        messages: Vec<Msg>,
    },
    /// Outcome of forwarded sends: (token, reason code; 0x80 and above: refused,
    /// `LOST`: the connection ended first).
    Settled { conn: u64, outcomes: Vec<(u64, u8)> },
    /// The client acknowledged these deliveries (PUBACK, or PUBREC for QoS 2).
    Acked { conn: u64, packet_ids: Vec<u16> },
    /// A publish of the sidecar's own was acknowledged (or not: `LOST`).
    Published { token: u64, reason: u8 },
    /// The client side ended (DISCONNECT when `graceful`); the upstream stays open until
    /// Python calls `release` (or a grace period passes), so acknowledgements the guard
    /// owes the broker (dead letters) can still go over it.
    Gone { conn: u64, graceful: bool },
    /// Both legs are closed.
    Closed { conn: u64, reason: String },
    /// A peer sent a packet the codec refused: side ("client" / "broker"), kind, detail.
    ProtocolError {
        conn: u64,
        side: &'static str,
        kind: &'static str,
        detail: String,
    },
}

/// Reason code reported for a send or publish whose connection ended before its ack.
pub const LOST: u8 = 0xFF;

/// The MQTT plane's event queue: the STOMP plane's, carrying MQTT events.
pub type Events = crate::transport::events::Events<Event>;
