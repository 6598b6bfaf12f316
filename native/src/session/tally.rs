//! Frames relayed by every native session, by direction and command, for `/metrics`
//! (read when it is scraped, never pushed per frame).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stomp::{CLIENT_COMMANDS, SERVER_COMMANDS};

#[derive(Default)]
pub struct FrameTally {
    client: [AtomicU64; CLIENT_COMMANDS.len()],
    broker: [AtomicU64; SERVER_COMMANDS.len()],
    /// SENDs forwarded and MESSAGEs delivered without the guard (see `bypass`).
    bypassed: [AtomicU64; 2],
}

impl FrameTally {
    pub fn bypassed_send(&self) {
        self.bypassed[0].fetch_add(1, Ordering::Relaxed);
    }

    pub fn bypassed_delivery(&self) {
        self.bypassed[1].fetch_add(1, Ordering::Relaxed);
    }

    /// `(sends, deliveries)` that went without the guard so far.
    pub fn bypassed(&self) -> (u64, u64) {
        (self.bypassed[0].load(Ordering::Relaxed), self.bypassed[1].load(Ordering::Relaxed))
    }

    pub fn client(&self, command: &str) {
        if let Some(i) = CLIENT_COMMANDS.iter().position(|c| *c == command) {
            self.client[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn broker(&self, command: &str) {
        if let Some(i) = SERVER_COMMANDS.iter().position(|c| *c == command) {
            self.broker[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(direction, command, frames)` for every command seen so far.
    pub fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
        let client = CLIENT_COMMANDS.iter().zip(&self.client).map(|(c, n)| ("client", *c, n));
        let broker = SERVER_COMMANDS.iter().zip(&self.broker).map(|(c, n)| ("broker", *c, n));
        client
            .chain(broker)
            .map(|(direction, command, n)| (direction, command, n.load(Ordering::Relaxed)))
            .filter(|(_, _, n)| *n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_known_commands_per_direction() {
        let tally = FrameTally::default();
        tally.client("SEND");
        tally.client("SEND");
        tally.broker("RECEIPT");
        tally.client("BOGUS");
        assert_eq!(tally.snapshot(), vec![("client", "SEND", 2), ("broker", "RECEIPT", 1)]);
        tally.bypassed_send();
        tally.bypassed_delivery();
        tally.bypassed_delivery();
        assert_eq!(tally.bypassed(), (1, 2));
    }
}
