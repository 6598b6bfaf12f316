//! What every native session did, for `/metrics` (read when it is scraped, never pushed
//! per frame): frames relayed by direction and command, octets read per leg, broker
//! connections that failed or were lost, malformed frames from the broker.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stomp::{CLIENT_COMMANDS, SERVER_COMMANDS};

/// A broker connection that failed while a session set it up, or was lost after.
#[derive(Clone, Copy)]
pub enum UpstreamFailure {
    /// Unreachable, timed out, or closed before its CONNECTED.
    Connect,
    /// Closed by the broker while the session ran.
    Lost,
}

#[derive(Default)]
pub struct FrameTally {
    client: [AtomicU64; CLIENT_COMMANDS.len()],
    broker: [AtomicU64; SERVER_COMMANDS.len()],
    client_bytes: AtomicU64,
    broker_bytes: AtomicU64,
    upstream_connect: AtomicU64,
    upstream_lost: AtomicU64,
    broker_protocol_errors: AtomicU64,
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

    /// `octets` read from the client (`client`) or from the broker.
    pub fn read(&self, client: bool, octets: usize) {
        let counter = if client { &self.client_bytes } else { &self.broker_bytes };
        counter.fetch_add(octets as u64, Ordering::Relaxed);
    }

    pub fn upstream_failure(&self, kind: UpstreamFailure) {
        match kind {
            UpstreamFailure::Connect => &self.upstream_connect,
            UpstreamFailure::Lost => &self.upstream_lost,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// The broker sent a frame the codec refused (the session ends).
    pub fn broker_protocol_error(&self) {
        self.broker_protocol_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// `(metric, label, count)`: octets read (`bytes`, `client` / `broker`), broker
    /// connections failed (`upstream_failures`, `connect` / `lost`), malformed broker
    /// frames (`protocol_errors`, `broker`); totals since the plane started.
    pub fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            ("bytes", "client", load(&self.client_bytes)),
            ("bytes", "broker", load(&self.broker_bytes)),
            ("upstream_failures", "connect", load(&self.upstream_connect)),
            ("upstream_failures", "lost", load(&self.upstream_lost)),
            ("protocol_errors", "broker", load(&self.broker_protocol_errors)),
        ]
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

    #[test]
    fn counts_octets_failures_and_broker_errors() {
        let tally = FrameTally::default();
        tally.read(true, 120);
        tally.read(false, 30);
        tally.read(false, 12);
        tally.upstream_failure(UpstreamFailure::Connect);
        tally.upstream_failure(UpstreamFailure::Lost);
        tally.upstream_failure(UpstreamFailure::Lost);
        tally.broker_protocol_error();
        assert_eq!(
            tally.counters(),
            vec![
                ("bytes", "client", 120),
                ("bytes", "broker", 42),
                ("upstream_failures", "connect", 1),
                ("upstream_failures", "lost", 2),
                ("protocol_errors", "broker", 1),
            ]
        );
    }
}
