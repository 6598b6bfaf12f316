//! The broker's side of a session: its answers to the client's publishes and its
//! deliveries, through the guard, to the client.

use super::packets::{msg_of, resolve_alias, stamp};
use super::*;

impl Session {
    pub(super) async fn upstream_packets(&mut self, packets: Vec<Packet>) -> Flow {
        let mut batch = Vec::new();
        let mut flow = Flow::Go;
        for packet in packets {
            match packet {
                Packet::Publish(publish) => batch.push(publish),
                other => {
                    flow = self.flush_deliveries(std::mem::take(&mut batch)).await;
                    if flow == Flow::Go {
                        flow = self.upstream_packet(other);
                    }
                    if flow != Flow::Go {
                        break;
                    }
                }
            }
        }
        if flow == Flow::Go {
            flow = self.flush_deliveries(batch).await;
        }
        self.flush_reports();
        flow
    }

    pub(super) fn upstream_packet(&mut self, packet: Packet) -> Flow {
        match packet {
            Packet::ConnAck(connack) => {
                let accepted = connack.code == 0;
                self.to_client.packet(&Packet::ConnAck(connack));
                if !accepted {
                    return Flow::End("broker refused the connection".to_string());
                }
                self.connected = true;
                Flow::Go
            }
            Packet::PubAck(mut a) => {
                match self.ids.release(a.packet_id) {
                    Some(Owner::Client {
                        client_id, token, ..
                    }) => {
                        self.settled.push((token, a.reason.unwrap_or(0)));
                        if !self.gone {
                            a.packet_id = client_id;
                            self.to_client.packet(&Packet::PubAck(a));
                        }
                    }
                    Some(Owner::Own { token }) => {
                        self.ctx.events.push(Event::Published {
                            token,
                            reason: a.reason.unwrap_or(0),
                        });
                    }
                    None => {}
                }
                Flow::Go
            }
            Packet::PubRec(mut a) => {
                let reason = a.reason.unwrap_or(0);
                if let Some(Owner::Client {
                    client_id, token, ..
                }) = self.ids.owner(a.packet_id)
                {
                    self.settled.push((token, reason));
                    if reason >= 0x80 {
                        self.ids.release(a.packet_id);
                    } else {
                        self.ids.received(a.packet_id);
                    }
                    if !self.gone {
                        a.packet_id = client_id;
                        self.to_client.packet(&Packet::PubRec(a));
                    }
                }
                Flow::Go
            }
            Packet::PubComp(mut a) => {
                if let Some(Owner::Client { client_id, .. }) = self.ids.release(a.packet_id) {
                    if !self.gone {
                        a.packet_id = client_id;
                        self.to_client.packet(&Packet::PubComp(a));
                    }
                }
                Flow::Go
            }
            Packet::PubRel(a) => {
                if self.withheld_rel.remove(&a.packet_id) {
                    self.to_upstream.packet(&Packet::PubComp(ack(a.packet_id)));
                } else if !self.gone {
                    self.to_client.packet(&Packet::PubRel(a));
                }
                Flow::Go
            }
            Packet::Disconnect(r) => {
                if !self.gone {
                    self.to_client.packet(&Packet::Disconnect(r));
                }
                Flow::End("broker sent DISCONNECT".to_string())
            }
            p @ (Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp | Packet::Auth(_)) => {
                if !self.gone {
                    self.to_client.packet(&p);
                }
                Flow::Go
            }
            other => {
                self.ctx.events.push(Event::ProtocolError {
                    conn: self.conn,
                    side: "broker",
                    kind: "protocol",
                    detail: format!("{} from the broker", other.name()),
                });
                Flow::End("broker sent a client packet".to_string())
            }
        }
    }

    pub(super) async fn flush_deliveries(&mut self, mut batch: Vec<Publish>) -> Flow {
        // A client that is gone gets nothing: the broker keeps what it has not had
        // acknowledged in the session, for its next connection.
        if batch.is_empty() || self.gone {
            return Flow::Go;
        }
        for publish in batch.iter_mut() {
            if let Err(detail) = resolve_alias(publish, &mut self.upstream_aliases) {
                self.ctx.events.push(Event::ProtocolError {
                    conn: self.conn,
                    side: "broker",
                    kind: "protocol",
                    detail: detail.clone(),
                });
                return Flow::End(detail);
            }
        }
        let messages: Vec<Msg> = batch.iter().map(msg_of).collect();
        let conn = self.conn;
        let Some(verdicts) = self
            .ctx
            .decide(|batch| Event::Deliveries {
                conn,
                batch,
                messages,
            })
            .await
        else {
            return Flow::End("sidecar stopping".to_string());
        };
        for (index, mut publish) in batch.into_iter().enumerate() {
            let verdict = verdicts.get(index).cloned().unwrap_or_default();
            if verdict.action == FORWARD {
                stamp(
                    &mut publish,
                    &Verdict {
                        topic: None,
                        user: Vec::new(),
                        ..verdict
                    },
                    self.version,
                );
                self.to_client.packet(&Packet::Publish(publish));
            }
        }
        Flow::Go
    }
}
