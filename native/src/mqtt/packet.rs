//! The control packets, as plain data.

use std::fmt;

use super::props::Properties;

/// The protocol level: 4 is MQTT 3.1.1, 5 is MQTT 5.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V311,
    V5,
}

impl Version {
    pub fn level(self) -> u8 {
        match self {
            Version::V311 => 4,
            Version::V5 => 5,
        }
    }

    pub fn from_level(level: u8) -> Option<Version> {
        match level {
            4 => Some(Version::V311),
            5 => Some(Version::V5),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Version::V311 => "3.1.1",
            Version::V5 => "5",
        }
    }
}

/// The will message of a CONNECT.
#[derive(Clone, PartialEq, Eq)]
pub struct Will {
    pub qos: u8,
    pub retain: bool,
    /// MQTT 5 only (empty on 3.1.1).
    pub properties: Properties,
    pub topic: String,
    pub payload: Vec<u8>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Connect {
    pub version: Version,
    /// Clean session (3.1.1) or clean start (5).
    pub clean_start: bool,
    pub keep_alive: u16,
    pub properties: Properties,
    pub client_id: String,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    /// The 3.1.1 return code or the MQTT 5 reason code.
    pub code: u8,
    pub properties: Properties,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: u8,
    pub retain: bool,
    pub topic: String,
    /// Present exactly when `qos` > 0.
    pub packet_id: Option<u16>,
    pub properties: Properties,
    pub payload: Vec<u8>,
}

/// PUBACK, PUBREC, PUBREL, PUBCOMP. On MQTT 5 the reason code and the properties may be
/// left out (`None`), and are kept so when they were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub packet_id: u16,
    pub reason: Option<u8>,
    /// `Some` only when `reason` is.
    pub properties: Option<Properties>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    pub properties: Properties,
    /// Topic filter and its subscription options octet (QoS in bits 0-1; on MQTT 5 also
    /// no-local, retain-as-published and retain handling).
    pub filters: Vec<(String, u8)>,
}

/// SUBACK and UNSUBACK (3.1.1 UNSUBACK has no codes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    pub properties: Properties,
    pub codes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub properties: Properties,
    pub filters: Vec<String>,
}

/// DISCONNECT and AUTH: on MQTT 5 an optional reason code and properties; on 3.1.1
/// DISCONNECT has neither.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reasoned {
    pub reason: Option<u8>,
    pub properties: Option<Properties>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    Connect(Connect),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(SubAck),
    PingReq,
    PingResp,
    Disconnect(Reasoned),
    Auth(Reasoned),
}

impl Packet {
    /// The control packet type, as the spec spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }

    /// The packet type number of the fixed header.
    pub fn type_number(&self) -> u8 {
        match self {
            Packet::Connect(_) => 1,
            Packet::ConnAck(_) => 2,
            Packet::Publish(_) => 3,
            Packet::PubAck(_) => 4,
            Packet::PubRec(_) => 5,
            Packet::PubRel(_) => 6,
            Packet::PubComp(_) => 7,
            Packet::Subscribe(_) => 8,
            Packet::SubAck(_) => 9,
            Packet::Unsubscribe(_) => 10,
            Packet::UnsubAck(_) => 11,
            Packet::PingReq => 12,
            Packet::PingResp => 13,
            Packet::Disconnect(_) => 14,
            Packet::Auth(_) => 15,
        }
    }
}

impl fmt::Debug for Connect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Credentials never reach a log: only whether they were given.
        f.debug_struct("Connect")
            .field("version", &self.version)
            .field("clean_start", &self.clean_start)
            .field("keep_alive", &self.keep_alive)
            .field("properties", &self.properties)
            .field("client_id", &self.client_id)
            .field("will", &self.will)
            .field("username", &self.username.as_ref().map(|_| "<redacted>"))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl fmt::Debug for Will {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Will")
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("properties", &self.properties)
            .field("topic", &self.topic)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl fmt::Debug for Publish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publish")
            .field("dup", &self.dup)
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("topic", &self.topic)
            .field("packet_id", &self.packet_id)
            .field("properties", &self.properties)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl Packet {
    /// Checks that every property section holds only properties its packet may carry.
    pub(crate) fn check_properties(&self) -> Result<(), super::error::MqttError> {
        use super::props::{check_allowed, WILL};
        let (name, kind) = (self.name(), self.type_number());
        let own = match self {
            Packet::Connect(c) => {
                if let Some(will) = &c.will {
                    check_allowed(&will.properties, WILL, "a will")?;
                }
                Some(&c.properties)
            }
            Packet::ConnAck(c) => Some(&c.properties),
            Packet::Publish(p) => Some(&p.properties),
            Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => a.properties.as_ref(),
            Packet::Subscribe(s) => Some(&s.properties),
            Packet::SubAck(a) | Packet::UnsubAck(a) => Some(&a.properties),
            Packet::Unsubscribe(u) => Some(&u.properties),
            Packet::Disconnect(r) | Packet::Auth(r) => r.properties.as_ref(),
            Packet::PingReq | Packet::PingResp => None,
        };
        match own {
            Some(props) => check_allowed(props, kind, name),
            None => Ok(()),
        }
    }
}
