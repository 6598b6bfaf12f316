//! Packet ids on the upstream connection.
//!
//! The client's QoS 1/2 publishes keep their own id upstream whenever it is free there
//! (so a resumed session's retransmission meets the broker's record of the first try);
//! the sidecar's own publishes take ids from the top of the range down, and a client id
//! that one of them holds is mapped to another free id.

use std::collections::{HashMap, HashSet};

/// Who an upstream packet id belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A client publish: its id on the client connection, its QoS and the guard's token.
    Client { client_id: u16, qos: u8, token: u64 },
    /// A publish of the sidecar's own, with Python's token.
    Own { token: u64 },
}

#[derive(Debug, Default)]
pub struct Ids {
    upstream: HashMap<u16, Owner>,
    /// Client id -> upstream id, from the client's PUBLISH to the broker's PUBCOMP (QoS 2)
    /// or PUBACK (QoS 1).
    by_client: HashMap<u16, u16>,
    /// Upstream ids of QoS 2 publishes the broker has answered with PUBREC: what is left
    /// of their exchange waits on the client (PUBREL), not on the broker.
    received: HashSet<u16>,
    next_own: u16,
}

impl Ids {
    pub fn new() -> Ids {
        Ids {
            upstream: HashMap::new(),
            by_client: HashMap::new(),
            received: HashSet::new(),
            next_own: u16::MAX,
        }
    }

    fn free(&self, id: u16) -> bool {
        id != 0 && !self.upstream.contains_key(&id)
    }

    /// The upstream id for a client publish; None when all 65535 are in use.
    pub fn map_client(&mut self, client_id: u16, qos: u8, token: u64) -> Option<u16> {
        if let Some(&old) = self.by_client.get(&client_id) {
            // A retransmission (DUP) of a publish still in flight: same upstream id.
            self.upstream.insert(
                old,
                Owner::Client {
                    client_id,
                    qos,
                    token,
                },
            );
            return Some(old);
        }
        let id = if self.free(client_id) {
            client_id
        } else {
            (1..=u16::MAX).find(|&id| self.free(id))?
        };
        self.upstream.insert(
            id,
            Owner::Client {
                client_id,
                qos,
                token,
            },
        );
        self.by_client.insert(client_id, id);
        Some(id)
    }

    /// An id for a publish of the sidecar's own.
    pub fn map_own(&mut self, token: u64) -> Option<u16> {
        for _ in 0..u16::MAX {
            let id = self.next_own;
            self.next_own = if id <= 1 { u16::MAX } else { id - 1 };
            if self.free(id) && !self.by_client.contains_key(&id) {
                self.upstream.insert(id, Owner::Own { token });
                return Some(id);
            }
        }
        None
    }

    pub fn owner(&self, upstream_id: u16) -> Option<Owner> {
        self.upstream.get(&upstream_id).copied()
    }

    /// The upstream id of a client id in flight (its PUBREL goes there).
    pub fn upstream_of(&self, client_id: u16) -> Option<u16> {
        self.by_client.get(&client_id).copied()
    }

    /// The exchange of `upstream_id` is complete.
    pub fn release(&mut self, upstream_id: u16) -> Option<Owner> {
        self.received.remove(&upstream_id);
        let owner = self.upstream.remove(&upstream_id)?;
        if let Owner::Client { client_id, .. } = owner {
            self.by_client.remove(&client_id);
        }
        Some(owner)
    }

    /// The broker answered the QoS 2 publish `upstream_id` with PUBREC.
    pub fn received(&mut self, upstream_id: u16) {
        if self.upstream.contains_key(&upstream_id) {
            self.received.insert(upstream_id);
        }
    }

    /// Whether some exchange waits for the broker's answer.
    pub fn waiting_on_broker(&self) -> bool {
        self.upstream.keys().any(|id| !self.received.contains(id))
    }

    /// Everything still in flight (the connection ended), emptied.
    pub fn take_all(&mut self) -> Vec<Owner> {
        self.by_client.clear();
        self.received.clear();
        self.upstream.drain().map(|(_, owner)| owner).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_kept_when_free_and_mapped_around_own_ids() {
        let mut ids = Ids::new();
        assert_eq!(ids.map_own(7), Some(u16::MAX));
        assert_eq!(ids.map_client(5, 1, 1), Some(5));
        assert_eq!(ids.map_client(u16::MAX, 1, 2), Some(1));
        assert_eq!(
            ids.owner(1),
            Some(Owner::Client {
                client_id: u16::MAX,
                qos: 1,
                token: 2
            })
        );
        assert_eq!(ids.upstream_of(u16::MAX), Some(1));
        assert_eq!(
            ids.release(1),
            Some(Owner::Client {
                client_id: u16::MAX,
                qos: 1,
                token: 2
            })
        );
        assert_eq!(ids.upstream_of(u16::MAX), None);
        // A retransmission of an id in flight keeps its upstream id.
        assert_eq!(ids.map_client(5, 1, 3), Some(5));
        assert!(ids.waiting_on_broker());
        assert_eq!(ids.take_all().len(), 2);
        assert!(!ids.waiting_on_broker());
    }

    #[test]
    fn a_qos2_publish_after_pubrec_waits_on_the_client_only() {
        let mut ids = Ids::new();
        assert_eq!(ids.map_client(3, 2, 1), Some(3));
        assert!(ids.waiting_on_broker());
        ids.received(3);
        assert!(!ids.waiting_on_broker());
        ids.release(3);
        assert_eq!(ids.map_client(3, 2, 2), Some(3));
        assert!(
            ids.waiting_on_broker(),
            "a new exchange on the id waits again"
        );
    }

    #[test]
    fn own_ids_skip_ids_in_use() {
        let mut ids = Ids::new();
        assert_eq!(ids.map_client(u16::MAX, 2, 1), Some(u16::MAX));
        assert_eq!(ids.map_own(9), Some(u16::MAX - 1));
    }
}
