//! Receipts in the order the client asked for them.
//!
//! The session answers some frames itself (a duplicate SEND is not forwarded, yet its
//! receipt is owed) while the broker answers others. STOMP lets a client read a receipt
//! as "every earlier frame was processed", so every receipt, local or the broker's, goes
//! through one chain and leaves it only when everything before it is confirmed.
//! Forwarded frames carry an id of the session's own (`mqguard-r-<n>`): client receipt
//! ids never collide with internal ones, and the sidecar's own receipt on every SEND is
//! consumed here, never shown to the client.

use std::collections::{HashMap, VecDeque};

/// Prefix of the receipt ids the chain puts on forwarded frames (as the Python session).
pub const CHAIN_RECEIPT_PREFIX: &str = "mqguard-r-";

/// What leaving the chain means, in chain order.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    /// A RECEIPT with this id is owed to the client now.
    Receipt(String),
    /// The SEND with this sequence number was confirmed by the broker.
    Confirmed(u64),
    /// The session's last frame (an ERROR), written once everything before it left.
    Last(Vec<u8>),
}

#[derive(Debug)]
struct Entry {
    /// The id on the forwarded frame; empty for local entries and holds.
    id: String,
    client: Option<String>,
    send: Option<u64>,
    last: Option<Vec<u8>>,
    /// Key of a hold (work finished off the chain), 0 for none.
    hold: u64,
    done: bool,
}

/// Pending receipts of one connection, released strictly in order.
#[derive(Debug, Default)]
pub struct Chain {
    entries: VecDeque<Entry>,
    by_id: HashMap<String, ()>,
    next: u64,
}

/// What [`Chain::fail_all`] leaves: outputs of entries confirmed but queued behind an
/// unconfirmed one, the SENDs never confirmed, and the client receipts that never come.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Failed {
    pub outputs: Vec<Output>,
    pub sends: Vec<u64>,
    pub lost_receipts: usize,
}

impl Chain {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A frame about to be forwarded; returns the receipt id to put on it. `send`: the
    /// SEND's sequence number, reported confirmed when its entry leaves the chain.
    pub fn expect(&mut self, client: Option<String>, send: Option<u64>) -> String {
        self.next += 1;
        let id = format!("{CHAIN_RECEIPT_PREFIX}{}", self.next);
        self.by_id.insert(id.clone(), ());
        self.entries.push_back(Entry { id: id.clone(), client, send, last: None, hold: 0, done: false });
        id
    }

    /// A frame the session settled itself: its receipt follows every earlier one.
    pub fn local(&mut self, client: Option<String>, out: &mut Vec<Output>) {
        if client.is_none() {
            return;
        }
        self.entries.push_back(Entry { id: String::new(), client, send: None, last: None, hold: 0, done: true });
        self.release(out);
    }

    /// The session's last frame, after every receipt owed before it.
    pub fn last(&mut self, frame: Vec<u8>, out: &mut Vec<Output>) {
        self.entries.push_back(Entry { id: String::new(), client: None, send: None, last: Some(frame), hold: 0, done: true });
        self.release(out);
    }

    /// Work finished off the chain (a delayed re-send of the guard's, waiting for a
    /// RECEIPT of its own): every later receipt, and a held DISCONNECT, waits for
    /// [`Chain::released`] with the same `key` (non-zero).
    pub fn hold(&mut self, client: Option<String>, key: u64) {
        self.entries.push_back(Entry { id: String::new(), client, send: None, last: None, hold: key, done: false });
    }

    pub fn released(&mut self, key: u64, out: &mut Vec<Output>) {
        if let Some(entry) = self.entries.iter_mut().find(|e| e.hold == key && !e.done) {
            entry.done = true;
            self.release(out);
        }
    }

    pub fn owns(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// The client's receipt id behind one of the chain's ids (an ERROR naming it).
    pub fn client_receipt_of(&self, id: &str) -> Option<&str> {
        self.entries.iter().find(|e| e.id == id).and_then(|e| e.client.as_deref())
    }

    /// The broker's RECEIPT for one of the chain's ids arrived.
    pub fn confirmed(&mut self, id: &str, out: &mut Vec<Output>) {
        if self.by_id.remove(id).is_none() {
            return;
        }
        if let Some(entry) = self.entries.iter_mut().find(|e| e.id == id) {
            entry.done = true;
        }
        self.release(out);
    }

    /// The connection ended: every unconfirmed entry failed.
    pub fn fail_all(&mut self) -> Failed {
        let mut failed = Failed::default();
        self.by_id.clear();
        for entry in std::mem::take(&mut self.entries) {
            if entry.done {
                emit(entry, &mut failed.outputs);
                continue;
            }
            if entry.client.is_some() {
                failed.lost_receipts += 1;
            }
            if let Some(seq) = entry.send {
                failed.sends.push(seq);
            }
        }
        failed
    }

    fn release(&mut self, out: &mut Vec<Output>) {
        while self.entries.front().is_some_and(|e| e.done) {
            if let Some(entry) = self.entries.pop_front() {
                emit(entry, out);
            }
        }
    }
}

fn emit(entry: Entry, out: &mut Vec<Output>) {
    if let Some(seq) = entry.send {
        out.push(Output::Confirmed(seq));
    }
    if let Some(client) = entry.client {
        out.push(Output::Receipt(client));
    }
    if let Some(frame) = entry.last {
        out.push(Output::Last(frame));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(id: &str) -> Output {
        Output::Receipt(id.to_owned())
    }

    #[test]
    fn local_receipts_wait_for_earlier_forwarded_ones() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        let first = chain.expect(Some("a".into()), Some(1));
        chain.local(Some("b".into()), &mut out);
        assert!(out.is_empty(), "b must wait for a");
        chain.confirmed(&first, &mut out);
        assert_eq!(out, vec![Output::Confirmed(1), receipt("a"), receipt("b")]);
        assert!(chain.is_empty());
    }

    #[test]
    fn own_receipts_are_consumed_and_confirm_in_order() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        let one = chain.expect(None, Some(1));
        let two = chain.expect(Some("c2".into()), Some(2));
        assert!(one.starts_with(CHAIN_RECEIPT_PREFIX) && one != two);
        chain.confirmed(&two, &mut out);
        assert!(out.is_empty(), "two is confirmed but queued behind one");
        chain.confirmed(&one, &mut out);
        assert_eq!(out, vec![Output::Confirmed(1), Output::Confirmed(2), receipt("c2")]);
        chain.confirmed(&one, &mut out);
        assert_eq!(out.len(), 3, "a second RECEIPT for the same id is ignored");
    }

    #[test]
    fn holds_and_the_last_frame_keep_their_place() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        chain.hold(Some("n".into()), 7);
        chain.last(b"ERROR".to_vec(), &mut out);
        assert!(out.is_empty());
        chain.released(8, &mut out);
        assert!(out.is_empty(), "another key releases nothing");
        chain.released(7, &mut out);
        assert_eq!(out, vec![receipt("n"), Output::Last(b"ERROR".to_vec())]);
    }

    #[test]
    fn fail_all_reports_what_never_came() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        let one = chain.expect(Some("x".into()), Some(1));
        let two = chain.expect(None, Some(2));
        chain.last(b"E".to_vec(), &mut out);
        chain.confirmed(&two, &mut out);
        assert!(chain.owns(&one) && !chain.owns(&two));
        assert_eq!(chain.client_receipt_of(&one), Some("x"));
        let failed = chain.fail_all();
        assert_eq!(failed.sends, vec![1]);
        assert_eq!(failed.lost_receipts, 1);
        assert_eq!(failed.outputs, vec![Output::Confirmed(2), Output::Last(b"E".to_vec())]);
        assert!(chain.is_empty() && !chain.owns(&one));
    }

    #[test]
    fn no_receipt_asked_leaves_nothing_local() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        chain.local(None, &mut out);
        assert!(chain.is_empty() && out.is_empty());
    }
}
