//! Frames relayed by every native session, by direction and command, for `/metrics`
//! (read when it is scraped, never pushed per frame).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stomp::{CLIENT_COMMANDS, SERVER_COMMANDS};

#[derive(Default)]
pub struct FrameTally {
    client: [AtomicU64; CLIENT_COMMANDS.len()],
    broker: [AtomicU64; SERVER_COMMANDS.len()],
}

impl FrameTally {
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
    }
}
