//! What a session does itself when the guard would do nothing with a kind of frame.
//!
//! With no event log and no plugin implementing the hooks a SEND (outside transactions)
//! or a delivery goes through, calling Python for it only costs time: the Python side
//! says so when the session opens (`GuardBatch::Open`'s verdicts, see `Bypass::from_verdicts`)
//! and the session then does, for those frames, what the guard's Python side would
//! have done:
//!
//! - **SENDs**: forwarded with the message's own headers (first of each name, framing
//!   ones left out), `destination`, the sidecar's receipt, and an `mqguard-id` of the
//!   derived form `<producer>.<n>` (the session's own producer id, given by Python, and
//!   its own count): what a guarded SEND carries, so that a guarded consumer downstream
//!   knows the message. A SEND that needs the guard's conversions or checks still goes
//!   to Python: one with a header Python names (reserved ones, `expires`, `expiration`,
//!   the guard's own `mqguard-*`), one over the bounds Python gives (size, header count,
//!   header block), one that cannot be encoded.
//! - **Deliveries**: every MESSAGE goes to the client; an `auto` one is acknowledged at
//!   once, the others when the client ACKs them (one ACK per delivery, as the broker
//!   subscription is `client-individual`). A NACK is passed on, one per delivery, where
//!   the broker's NACK requeues and the version has one; elsewhere the delivery stays
//!   unacknowledged (the broker redelivers it once the connection is gone), as the guard
//!   does without a plugin. ACKs and NACKs inside a transaction are written with its id,
//!   and the ACKs given back to the client if it is aborted.

use std::collections::HashMap;

use super::bridge::{code, Verdict};
use super::wire::first_headers;
use crate::stomp::{encode, encode_parts, HeaderText, RawFrame, Version};

/// `Open` verdict flags: SENDs outside transactions need no guard.
pub const SENDS: u64 = 1;
/// ... deliveries (MESSAGE, ACK, NACK) need no guard.
pub const DELIVERIES: u64 = 2;
/// ... the broker's NACK requeues (RabbitMQ); elsewhere a NACK is not passed on.
pub const NACK_REQUEUE: u64 = 4;

/// The guard's header naming the message (Python's `mqguard.message.MESSAGE_ID_HEADER`).
const MESSAGE_ID_HEADER: &str = "mqguard-id";
/// SEND headers that frame the message rather than belong to it.
pub const FRAMING_SEND_HEADERS: [&str; 4] = ["destination", "receipt", "transaction", "content-length"];

#[derive(Debug, Default)]
pub struct Bypass {
    pub sends: bool,
    pub deliveries: bool,
    pub nack_requeue: bool,
    producer: String,
    /// Messages stamped so far (the sequence of `producer`).
    produced: u64,
    /// An encoded SEND (without the receipt) longer than this goes to the guard.
    max_send_bytes: usize,
    /// ... or with more headers than this (destination and `mqguard-id` included).
    max_send_headers: usize,
    /// ... or with a header block (command line to the blank line) longer than this.
    max_send_head: usize,
    /// Header names that need the guard.
    guarded_names: Vec<String>,
    /// ACKs written inside each open transaction, `(subscription, token)`: the client's
    /// to settle again if it is aborted.
    tx_acks: HashMap<String, Vec<(String, String)>>,
}

impl Bypass {
    /// From Python's verdicts on `Open`: `(LOCAL, flags, broker, producer id)`, then, when
    /// SENDs are bypassed, `(LOCAL, max_send_bytes, "", "")`, `(LOCAL, max_send_headers,
    /// "", "")` and `(LOCAL, max_send_head, "", names)` (the guarded header names, one
    /// per line).
    pub fn from_verdicts(verdicts: &[Verdict]) -> Bypass {
        let Some((code::LOCAL, flags, _, producer)) = verdicts.first() else {
            return Bypass::default();
        };
        let number = |at: usize| verdicts.get(at).map(|v| usize::try_from(v.1).unwrap_or(usize::MAX));
        let producer = String::from_utf8_lossy(producer).into_owned();
        let mut bypass = Bypass {
            deliveries: flags & DELIVERIES != 0,
            nack_requeue: flags & NACK_REQUEUE != 0,
            ..Bypass::default()
        };
        if let (true, Some(max_bytes), Some(max_headers), Some(max_head), false) =
            (flags & SENDS != 0, number(1), number(2), number(3), producer.is_empty())
        {
            bypass.sends = true;
            bypass.producer = producer;
            bypass.max_send_bytes = max_bytes;
            bypass.max_send_headers = max_headers;
            bypass.max_send_head = max_head;
            bypass.guarded_names = String::from_utf8_lossy(&verdicts[3].3)
                .split('\n')
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect();
        }
        bypass
    }

    /// The SEND to forward for `frame` (a SEND outside transactions, with a destination),
    /// encoded for `version` without a receipt; `Err(frame)` when the guard must see it.
    pub fn send(&mut self, frame: RawFrame, version: Version) -> Result<Vec<u8>, RawFrame> {
        let own = first_headers(&frame, &FRAMING_SEND_HEADERS);
        if own.len() + 2 > self.max_send_headers || own.iter().any(|(name, _)| self.guarded(name)) {
            return Err(frame);
        }
        let id = format!("{}.{}", self.producer, self.produced + 1);
        let destination = frame.get("destination").unwrap_or_default();
        let headers = std::iter::once(("destination", destination))
            .chain(own.iter().map(|(name, value)| (name.as_str(), value.as_str())))
            .chain(std::iter::once((MESSAGE_ID_HEADER, id.as_str())))
            .map(|(name, value)| (HeaderText::from(name), HeaderText::from(value)));
        let mut out = Vec::with_capacity(frame.body.len() + 128 + 32 * own.len());
        if encode_parts("SEND", headers, &frame.body, version, &mut out).is_err()
            || out.len() > self.max_send_bytes
            || out.len() - frame.body.len() - 1 > self.max_send_head
        {
            return Err(frame);
        }
        self.produced += 1;
        Ok(out)
    }

    fn guarded(&self, name: &str) -> bool {
        name.is_empty()
            || name.contains([':', '\\', '\n', '\r'])
            || name.starts_with("mqguard-")
            || self.guarded_names.iter().any(|guarded| guarded == name)
    }

    /// ACKs written inside `transaction`, to give back if it is aborted.
    pub fn acked_in(&mut self, transaction: &str, acked: impl IntoIterator<Item = (String, String)>) {
        self.tx_acks.entry(transaction.to_owned()).or_default().extend(acked);
    }

    /// The transaction is over: the ACKs written inside it, `(subscription, token)`.
    pub fn transaction_over(&mut self, transaction: &str) -> Vec<(String, String)> {
        self.tx_acks.remove(transaction).unwrap_or_default()
    }
}

/// The ACK or NACK of one delivery (`token`, of subscription `sub`) as the guard writes
/// it (`mqguard.sidecar.upstream.ack_headers`), inside `transaction` if given.
pub fn settle_frame(command: &str, version: Version, token: &str, sub: &str, transaction: Option<&str>) -> Vec<u8> {
    let mut headers: Vec<(String, String)> = match version {
        Version::V12 => vec![("id".into(), token.into())],
        Version::V11 => vec![("message-id".into(), token.into()), ("subscription".into(), sub.into())],
        Version::V10 => vec![("message-id".into(), token.into())],
    };
    if let Some(transaction) = transaction {
        headers.push(("transaction".into(), transaction.into()));
    }
    encode(&RawFrame::new(command, headers, Vec::new()), version).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stomp::{Decoder, Item, Limits};

    fn open(flags: u64, names: &str) -> Bypass {
        Bypass::from_verdicts(&[
            (code::LOCAL, flags, "activemq".into(), b"P".to_vec()),
            (code::LOCAL, 4096, String::new(), Vec::new()),
            (code::LOCAL, 8, String::new(), Vec::new()),
            (code::LOCAL, 1024, String::new(), names.as_bytes().to_vec()),
        ])
    }

    fn send(headers: &[(&str, &str)], body: &[u8]) -> RawFrame {
        let headers = headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        RawFrame::new("SEND", headers, body.to_vec())
    }

    fn decode(data: &[u8]) -> RawFrame {
        let mut decoder = Decoder::new(Limits::default(), false, Version::V12);
        let mut items = Vec::new();
        decoder.feed(data, &mut items).expect("a frame");
        match items.pop() {
            Some(Item::Frame(frame)) => frame,
            _ => panic!("no frame"),
        }
    }

    #[test]
    fn flags_and_bounds_come_from_the_open_verdicts() {
        let bypass = open(SENDS | DELIVERIES | NACK_REQUEUE, "expires\nid\n");
        assert!(bypass.sends && bypass.deliveries && bypass.nack_requeue);
        assert_eq!(bypass.guarded_names, vec!["expires", "id"]);
        let none = Bypass::from_verdicts(&[(code::LOCAL, 0, "activemq".into(), Vec::new())]);
        assert!(!none.sends && !none.deliveries && !none.nack_requeue);
        // Without its bounds the SEND path stays with the guard.
        let partial = Bypass::from_verdicts(&[(code::LOCAL, SENDS, "x".into(), b"P".to_vec())]);
        assert!(!partial.sends);
    }

    #[test]
    fn a_send_is_stamped_and_keeps_its_own_headers() {
        let mut bypass = open(SENDS, "expires");
        let frame = send(
            &[("destination", "/queue/a"), ("receipt", "r1"), ("x", "1"), ("x", "2"), ("content-length", "3")],
            b"abc",
        );
        let data = bypass.send(frame, Version::V12).expect("bypassed");
        let out = decode(&data);
        assert_eq!(out.command, "SEND");
        assert_eq!(out.get("destination"), Some("/queue/a"));
        assert_eq!(out.get("x"), Some("1"));
        assert_eq!(out.headers.iter().filter(|(n, _)| n == "x").count(), 1);
        assert_eq!(out.get("receipt"), None, "the client's receipt is the chain's to answer");
        assert_eq!(out.get("mqguard-id"), Some("P.1"));
        assert_eq!(out.body, b"abc");
        let again = bypass.send(send(&[("destination", "/queue/a")], b""), Version::V12).expect("bypassed");
        assert_eq!(decode(&again).get("mqguard-id"), Some("P.2"));
    }

    #[test]
    fn what_needs_the_guard_is_handed_back_unchanged() {
        let mut bypass = open(SENDS, "expires");
        for headers in [
            vec![("destination", "/queue/a"), ("expires", "1")],
            vec![("destination", "/queue/a"), ("mqguard-producer", "p")],
            vec![("destination", "/queue/a"), ("a:b", "1")],
            // Over the header count: destination, 7 of its own, mqguard-id.
            vec![("destination", "/queue/a"), ("a", ""), ("b", ""), ("c", ""), ("d", ""), ("e", ""), ("f", ""), ("g", "")],
            vec![("destination", "/queue/a"), ("long", &"v".repeat(1100))],
        ] {
            let frame = send(&headers, b"body");
            let back = bypass.send(frame, Version::V12).expect_err("guarded");
            assert_eq!(back.body, b"body");
            assert_eq!(back.headers.len(), headers.len());
        }
        assert!(bypass.send(send(&[("destination", "/q")], &[b'x'; 5000]), Version::V12).is_err(), "over max bytes");
        let stamped = bypass.send(send(&[("destination", "/q")], b""), Version::V12).expect("bypassed");
        assert_eq!(decode(&stamped).get("mqguard-id"), Some("P.1"), "what went to the guard used no number");
    }

    #[test]
    fn settle_frames_per_version() {
        assert_eq!(settle_frame("ACK", Version::V12, "t:1", "s", None), b"ACK\nid:t\\c1\n\n\0");
        assert_eq!(settle_frame("NACK", Version::V11, "t", "s", Some("tx")), b"NACK\nmessage-id:t\nsubscription:s\ntransaction:tx\n\n\0");
        assert_eq!(settle_frame("ACK", Version::V10, "t", "s", None), b"ACK\nmessage-id:t\n\n\0");
    }

    #[test]
    fn aborted_transactions_give_their_acks_back() {
        let mut bypass = open(DELIVERIES, "");
        bypass.acked_in("tx", [("s".to_owned(), "t1".to_owned())]);
        bypass.acked_in("tx", [("s".to_owned(), "t2".to_owned())]);
        assert_eq!(bypass.transaction_over("tx").len(), 2);
        assert!(bypass.transaction_over("tx").is_empty());
    }
}
