//! The handshake budget of a client leg: what an unauthenticated peer may send.
//!
//! Before CONNECTED the client is nobody yet, so its first frame (the CONNECT) may take
//! `max-handshake-frame-bytes` at most, not `max-frame-bytes`, and once that frame is
//! complete the leg reads no more until the session resumes it: what the sidecar holds
//! for a connection that never finishes its handshake is bounded by the budget plus
//! one read, whatever the client sends (as `FrameConnection` does on the asyncio
//! plane, see mqguard/sidecar/connection.py).

use crate::stomp::{FrameError, Item, RawFrame};

/// The octets a leg may still read before its first frame is complete.
pub struct HandshakeBudget {
    limit: usize,
    used: usize,
}

/// What one read did to the budget.
#[derive(Debug, PartialEq)]
pub enum Check {
    /// No frame complete yet, within the budget.
    Pending,
    /// The first frame is complete and within the budget: hold reading.
    Complete,
    /// Over the budget: the connection ends with this error.
    Over(FrameError),
}

impl HandshakeBudget {
    pub fn new(limit: usize) -> Self {
        HandshakeBudget { limit, used: 0 }
    }

    /// One read of `size` octets that decoded `items`. Until the first frame is
    /// decoded every octet received counts (heart-beats included); then the frame's own
    /// size is checked, as a read may complete it and exceed the budget at once.
    pub fn check(&mut self, size: usize, items: &[Item]) -> Check {
        let first = items.iter().find_map(|item| match item {
            Item::Frame(frame) => Some(frame),
            _ => None,
        });
        let Some(first) = first else {
            self.used = self.used.saturating_add(size);
            if self.used <= self.limit {
                return Check::Pending;
            }
            let detail = format!(
                "more than {} bytes before CONNECTED (max-handshake-frame-bytes)",
                self.limit
            );
            return Check::Over(FrameError::new("frame too large", detail));
        };
        if frame_size(first) > self.limit {
            let detail = format!("CONNECT over {} bytes (max-handshake-frame-bytes)", self.limit);
            return Check::Over(FrameError::new("frame too large", detail));
        }
        Check::Complete
    }
}

/// About the octets of `frame` on the wire (escapes left out): enough to bound it.
fn frame_size(frame: &RawFrame) -> usize {
    let headers: usize = frame.headers.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    frame.command.len() + headers + frame.body.len() + 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(body: usize) -> Item {
        Item::Frame(RawFrame::new(
            "CONNECT",
            vec![("accept-version".into(), "1.2".into())],
            vec![b'x'; body],
        ))
    }

    #[test]
    fn octets_count_until_the_first_frame() {
        let mut budget = HandshakeBudget::new(100);
        assert_eq!(budget.check(60, &[]), Check::Pending);
        assert_eq!(budget.check(40, &[Item::Heartbeat]), Check::Pending);
        match budget.check(1, &[]) {
            Check::Over(error) => {
                assert_eq!(error.reason, "frame too large");
                assert!(error.detail.contains("more than 100 bytes before CONNECTED"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_complete_first_frame_holds_reading() {
        let mut budget = HandshakeBudget::new(100);
        assert_eq!(budget.check(10, &[]), Check::Pending);
        assert_eq!(budget.check(40, &[Item::Heartbeat, connect(10)]), Check::Complete);
    }

    #[test]
    fn a_first_frame_over_the_budget_is_refused_even_in_one_read() {
        let mut budget = HandshakeBudget::new(100);
        match budget.check(200, &[connect(150)]) {
            Check::Over(error) => assert!(error.detail.contains("CONNECT over 100 bytes")),
            other => panic!("{other:?}"),
        }
    }
}
