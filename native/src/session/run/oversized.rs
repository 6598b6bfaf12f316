//! A MESSAGE over the broker leg's limits (the broker leg decodes in oversized mode once
//! the session is connected): it is never given to the client, and it must not end the
//! session either, for left unacknowledged it would come back to every consumer of the
//! queue. The guard dead-letters it, or hands it back to the broker with a NACK that
//! does not requeue it, or (STOMP 1.0) drops it; see
//! `mqguard.sidecar.native_oversized`. Any other frame over the limits ends the session.

use super::super::bridge::{OversizedItem, GuardBatch};
use super::super::chain::CHAIN_RECEIPT_PREFIX;
use super::super::subs::Subs;
use super::super::wire::remove_header;
use super::Session;
use crate::stomp::{OversizedFrame, Version};

impl Session {
    /// An item the decoder handed on as over the limits; Some(outcome) when it ends the
    /// broker side.
    pub(super) async fn on_oversized(&mut self, over: OversizedFrame) -> Option<String> {
        if over.frame.command != "MESSAGE" {
            return Some(format!("broker sent a malformed frame: {}", over.reason));
        }
        self.config.tally.broker("MESSAGE");
        if self.ending {
            // The client's last frame is queued: left unacknowledged, as any MESSAGE then.
            return None;
        }
        let item = oversized_item(over, &self.subs, self.version);
        if self.ask(GuardBatch::Oversized(item)).await.is_none() {
            self.internal_error();
        }
        None
    }
}

/// What the guard is told of an oversized MESSAGE: the delivery to settle when its
/// subscription is one the guard sees (not browsing) and it carries an ack token.
pub(super) fn oversized_item(over: OversizedFrame, subs: &Subs, version: Version) -> OversizedItem {
    let OversizedFrame { mut frame, reason, detail, body_kept } = over;
    if frame.get("receipt").is_some_and(|r| r.starts_with(CHAIN_RECEIPT_PREFIX)) {
        // RabbitMQ echoes a SEND's receipt header: the sidecar's own id.
        remove_header(&mut frame, "receipt");
    }
    let sub_id = frame.get("subscription").unwrap_or_default().to_owned();
    let sub = subs.get(&sub_id).filter(|sub| !sub.browse);
    let token = sub.and_then(|_| {
        if version == Version::V12 { frame.get("ack") } else { frame.get("message-id") }
    });
    OversizedItem {
        destination: sub.map(|s| s.destination.clone()).unwrap_or_default(),
        quorum: sub.is_some_and(|s| s.quorum),
        mode: sub.map(|s| s.mode.clone()).unwrap_or_default(),
        token: token.map(str::to_owned),
        sub: sub_id,
        headers: std::mem::take(&mut frame.headers),
        body: std::mem::take(&mut frame.body),
        body_kept,
        reason: reason.to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stomp::RawFrame;

    fn over(headers: &[(&str, &str)], body_kept: bool) -> OversizedFrame {
        let headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let body = if body_kept { b"kept".to_vec() } else { Vec::new() };
        OversizedFrame {
            frame: RawFrame::new("MESSAGE", headers, body),
            reason: "too many headers",
            detail: "130 headers, over 128".into(),
            body_kept,
        }
    }

    fn subs() -> Subs {
        let mut subs = Subs::default();
        subs.add("s1".into(), "/queue/q".into(), "client".into(), false, true);
        subs.add("b".into(), "/queue/q".into(), "auto".into(), true, false);
        subs
    }

    #[test]
    fn a_delivery_of_a_guarded_subscription_carries_its_token() {
        let frame = over(
            &[("subscription", "s1"), ("ack", "a-1"), ("message-id", "m-1"), ("receipt", "mqguard-r-3"), ("x", "1")],
            true,
        );
        let item = oversized_item(frame, &subs(), Version::V12);
        assert_eq!(item.token.as_deref(), Some("a-1"));
        assert_eq!((item.destination.as_str(), item.mode.as_str(), item.quorum), ("/queue/q", "client", true));
        assert!(item.body_kept && item.body == b"kept");
        assert!(item.headers.iter().all(|(k, _)| k != "receipt"), "the sidecar's own receipt is not the message's");
        assert_eq!(item.headers.len(), 4);
        assert_eq!(item.reason, "too many headers");
    }

    #[test]
    fn stomp_10_and_11_settle_by_message_id() {
        let frame = over(&[("subscription", "s1"), ("message-id", "m-1")], false);
        let item = oversized_item(frame, &subs(), Version::V10);
        assert_eq!(item.token.as_deref(), Some("m-1"));
        assert!(!item.body_kept && item.body.is_empty());
    }

    #[test]
    fn unknown_browsing_or_tokenless_deliveries_have_no_token() {
        for headers in [
            vec![("subscription", "gone"), ("ack", "a")],
            vec![("subscription", "b"), ("ack", "a")],
            vec![("subscription", "s1"), ("message-id", "m")],
        ] {
            let item = oversized_item(over(&headers, true), &subs(), Version::V12);
            assert_eq!(item.token, None, "{headers:?}");
        }
    }
}
