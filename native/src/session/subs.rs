//! A session's subscriptions, their ack modes and the deliveries the client has not
//! settled yet.
//!
//! Towards the broker every subscription is `client-individual` (the guard settles each
//! delivery itself); the client's mode decides what its ACK covers: `client` is
//! cumulative (everything delivered on the subscription up to the acked one).

use std::collections::HashMap;

pub const ACK_MODES: [&str; 3] = ["auto", "client", "client-individual"];

#[derive(Debug)]
pub struct Subscription {
    pub destination: String,
    /// The client's ack mode.
    pub mode: String,
    pub browse: bool,
    pub quorum: bool,
    /// Ack tokens handed to the client and not settled yet, in delivery order.
    pending: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Subs {
    subs: HashMap<String, Subscription>,
    /// Ack token -> its subscription id.
    tokens: HashMap<String, String>,
    next: u64,
}

impl Subs {
    pub fn get(&self, id: &str) -> Option<&Subscription> {
        self.subs.get(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.subs.contains_key(id)
    }

    /// An id for a STOMP 1.0 SUBSCRIBE without one.
    pub fn new_id(&mut self) -> String {
        self.next += 1;
        format!("mqguard-sub-{}", self.next)
    }

    pub fn add(&mut self, id: String, destination: String, mode: String, browse: bool, quorum: bool) {
        self.subs.insert(id, Subscription { destination, mode, browse, quorum, pending: Vec::new() });
    }

    /// Remove the subscription; returns its unsettled tokens (the broker takes them back).
    pub fn remove(&mut self, id: &str) -> Vec<String> {
        let Some(sub) = self.subs.remove(id) else {
            return Vec::new();
        };
        for token in &sub.pending {
            self.tokens.remove(token);
        }
        sub.pending
    }

    /// A delivery handed to the client, to be settled by its ACK/NACK.
    pub fn delivered(&mut self, sub_id: &str, token: String) {
        if let Some(sub) = self.subs.get_mut(sub_id) {
            sub.pending.push(token.clone());
            self.tokens.insert(token, sub_id.to_owned());
        }
    }

    /// The subscription of a tracked `token`.
    pub fn sub_of(&self, token: &str) -> Option<&str> {
        self.tokens.get(token).map(String::as_str)
    }

    /// Whether the guard tracks `token` (else an ACK of it goes to the broker as is).
    pub fn tracks(&self, token: &str) -> bool {
        self.tokens.contains_key(token)
    }

    /// The tokens an ACK/NACK of `token` settles, taken out of the pending ones: itself,
    /// or in `client` mode everything delivered on the subscription up to it.
    pub fn take_covered(&mut self, token: &str) -> Vec<String> {
        let Some(sub_id) = self.tokens.get(token).cloned() else {
            return Vec::new();
        };
        let Some(sub) = self.subs.get_mut(&sub_id) else {
            return Vec::new();
        };
        let Some(position) = sub.pending.iter().position(|t| t == token) else {
            return Vec::new();
        };
        let covered: Vec<String> = if sub.mode == "client" {
            sub.pending.drain(..=position).collect()
        } else {
            vec![sub.pending.remove(position)]
        };
        for each in &covered {
            self.tokens.remove(each);
        }
        covered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs_with(mode: &str) -> Subs {
        let mut subs = Subs::default();
        subs.add("s".into(), "/queue/q".into(), mode.into(), false, false);
        for token in ["t1", "t2", "t3"] {
            subs.delivered("s", token.into());
        }
        subs
    }

    #[test]
    fn client_mode_acks_are_cumulative() {
        let mut subs = subs_with("client");
        assert_eq!(subs.take_covered("t2"), vec!["t1", "t2"]);
        assert!(!subs.tracks("t1") && !subs.tracks("t2") && subs.tracks("t3"));
        assert!(subs.take_covered("t2").is_empty(), "settled once");
        assert_eq!(subs.take_covered("t3"), vec!["t3"]);
    }

    #[test]
    fn client_individual_acks_one() {
        let mut subs = subs_with("client-individual");
        assert_eq!(subs.take_covered("t2"), vec!["t2"]);
        assert!(subs.tracks("t1") && subs.tracks("t3"));
        assert_eq!(subs.take_covered("t1"), vec!["t1"]);
    }

    #[test]
    fn unsubscribe_hands_back_what_is_pending() {
        let mut subs = subs_with("client-individual");
        subs.take_covered("t1");
        assert_eq!(subs.remove("s"), vec!["t2", "t3"]);
        assert!(!subs.tracks("t2") && !subs.contains("s"));
        assert!(subs.remove("s").is_empty());
        subs.delivered("s", "t9".into());
        assert!(!subs.tracks("t9"), "no delivery is tracked for a subscription that is gone");
    }

    #[test]
    fn generated_ids_differ() {
        let mut subs = Subs::default();
        assert_ne!(subs.new_id(), subs.new_id());
        assert_eq!(subs.get("x").map(|s| s.mode.as_str()), None);
        assert!(ACK_MODES.contains(&"client"));
    }
}
