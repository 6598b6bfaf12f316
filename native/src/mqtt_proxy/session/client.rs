//! The client's side of a session: its PUBLISHes to the guard and on to the broker, its
//! acknowledgements of deliveries, its refusals.

use super::packets::{msg_of, resolve_alias, stamp, truncate};
use super::*;

impl Session {
    pub(super) fn client_error(&mut self, error: &MqttError) -> Flow {
        self.ctx.events.push(Event::ProtocolError {
            conn: self.conn,
            side: "client",
            kind: error.kind,
            detail: error.detail.clone(),
        });
        if self.version == Version::V5 {
            self.to_client.packet(&Packet::Disconnect(Reasoned {
                reason: Some(error.reason_code()),
                properties: None,
            }));
        }
        Flow::Gone(false)
    }

    pub(super) async fn client_packets(&mut self, packets: Vec<Packet>) -> Flow {
        let mut batch = Vec::new();
        let mut flow = Flow::Go;
        for packet in packets {
            match packet {
                Packet::Publish(publish) => batch.push(publish),
                other => {
                    flow = self.flush_sends(std::mem::take(&mut batch)).await;
                    if flow == Flow::Go {
                        flow = self.client_packet(other);
                    }
                    if flow != Flow::Go {
                        break;
                    }
                }
            }
        }
        if flow == Flow::Go {
            flow = self.flush_sends(batch).await;
        }
        self.flush_reports();
        flow
    }

    pub(super) fn client_packet(&mut self, packet: Packet) -> Flow {
        match packet {
            Packet::PubAck(a) | Packet::PubRec(a) if self.gone => {
                let _ = a;
                Flow::Go
            }
            Packet::PubAck(a) => {
                self.acked.push(a.packet_id);
                self.to_upstream.packet(&Packet::PubAck(a));
                Flow::Go
            }
            Packet::PubRec(a) => {
                if a.reason.unwrap_or(0) < 0x80 {
                    self.acked.push(a.packet_id);
                }
                self.to_upstream.packet(&Packet::PubRec(a));
                Flow::Go
            }
            Packet::PubRel(mut a) => {
                if self.local_rel.remove(&a.packet_id) {
                    self.to_client.packet(&Packet::PubComp(ack(a.packet_id)));
                } else {
                    if let Some(upstream) = self.ids.upstream_of(a.packet_id) {
                        a.packet_id = upstream;
                    }
                    self.to_upstream.packet(&Packet::PubRel(a));
                }
                Flow::Go
            }
            Packet::Disconnect(r) => {
                self.disconnect = Some(Packet::Disconnect(r));
                Flow::Gone(true)
            }
            p @ (Packet::PubComp(_)
            | Packet::Subscribe(_)
            | Packet::Unsubscribe(_)
            | Packet::PingReq
            | Packet::Auth(_)) => {
                self.to_upstream.packet(&p);
                Flow::Go
            }
            other => self.client_error(&MqttError::protocol(format!(
                "{} from a client",
                other.name()
            ))),
        }
    }

    pub(super) async fn flush_sends(&mut self, mut batch: Vec<Publish>) -> Flow {
        if batch.is_empty() {
            return Flow::Go;
        }
        for publish in batch.iter_mut() {
            if let Err(detail) = resolve_alias(publish, &mut self.client_aliases) {
                return self.client_error(&MqttError::protocol(detail));
            }
        }
        let messages: Vec<Msg> = batch.iter().map(msg_of).collect();
        let conn = self.conn;
        let Some(verdicts) = self
            .ctx
            .decide(|batch| Event::Sends {
                conn,
                batch,
                messages,
            })
            .await
        else {
            return Flow::End("sidecar stopping".to_string());
        };
        for (index, mut publish) in batch.into_iter().enumerate() {
            let verdict = verdicts.get(index).cloned().unwrap_or(Verdict {
                action: REJECT,
                ..Verdict::default()
            });
            let client_id = publish.packet_id.unwrap_or(0);
            match verdict.action {
                FORWARD => {
                    stamp(&mut publish, &verdict, self.version);
                    if publish.qos == 0 {
                        if self.to_upstream.packet(&Packet::Publish(publish)) {
                            self.settled.push((verdict.token, 0));
                        }
                        continue;
                    }
                    let Some(upstream_id) =
                        self.ids.map_client(client_id, publish.qos, verdict.token)
                    else {
                        return Flow::End("no upstream packet id left".to_string());
                    };
                    publish.packet_id = Some(upstream_id);
                    let qos = publish.qos;
                    if !self.to_upstream.packet(&Packet::Publish(publish)) {
                        self.ids.release(upstream_id);
                        let refused = Verdict {
                            reason: Some("the message cannot be encoded".to_string()),
                            ..verdict
                        };
                        if let Flow::Gone(g) = self.refuse(client_id, qos, &refused) {
                            return Flow::Gone(g);
                        }
                    }
                }
                DROP => match publish.qos {
                    1 => {
                        self.to_client.packet(&Packet::PubAck(ack(client_id)));
                    }
                    2 => {
                        self.local_rel.insert(client_id);
                        self.to_client.packet(&Packet::PubRec(ack(client_id)));
                    }
                    _ => {}
                },
                _ => {
                    if let Flow::Gone(g) = self.refuse(client_id, publish.qos, &verdict) {
                        return Flow::Gone(g);
                    }
                }
            }
        }
        Flow::Go
    }

    /// Tell the client its publish was refused: an MQTT 5 PUBACK/PUBREC with a failure
    /// reason code; MQTT 3.1.1 has none, so the connection is closed (the client keeps
    /// the message and retries it on its next connection).
    pub(super) fn refuse(&mut self, client_id: u16, qos: u8, verdict: &Verdict) -> Flow {
        if qos == 0 {
            return Flow::Go;
        }
        if self.version != Version::V5 {
            return Flow::Gone(false);
        }
        let properties: Properties = match &verdict.reason {
            Some(reason) if !reason.is_empty() => {
                vec![Property {
                    id: REASON_STRING,
                    value: PropValue::Str(truncate(reason, MAX_REASON)),
                }]
            }
            _ => Vec::new(),
        };
        let answer = Ack {
            packet_id: client_id,
            reason: Some(REFUSED),
            properties: Some(properties),
        };
        let packet = if qos == 1 {
            Packet::PubAck(answer)
        } else {
            Packet::PubRec(answer)
        };
        if !self.to_client.packet(&packet) {
            self.to_client.packet(&if qos == 1 {
                Packet::PubAck(Ack {
                    packet_id: client_id,
                    reason: Some(REFUSED),
                    properties: None,
                })
            } else {
                Packet::PubRec(Ack {
                    packet_id: client_id,
                    reason: Some(REFUSED),
                    properties: None,
                })
            });
        }
        Flow::Go
    }
}
