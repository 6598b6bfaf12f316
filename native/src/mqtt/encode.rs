//! The encoder: the canonical form the decoder accepts, so an unchanged packet
//! re-encodes to its received octets.

use super::decode::{check_topic_filter, check_topic_name};
use super::error::MqttError;
use super::packet::{Ack, Packet, Reasoned, SubAck, Version};
use super::props::{write_properties, Properties};
use super::varint::{write_varint, MAX_VARINT};

pub(crate) fn write_string(text: &str, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    if text.contains('\0') {
        return Err(MqttError::malformed(format!("{what} contains U+0000")));
    }
    write_binary(text.as_bytes(), what, out)
}

pub(crate) fn write_binary(data: &[u8], what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    let n = u16::try_from(data.len())
        .map_err(|_| MqttError::too_large(format!("{what} of {} octets exceeds 65535", data.len())))?;
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(data);
    Ok(())
}

fn props_if(props: &Properties, version: Version, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    match version {
        Version::V5 => write_properties(props, out),
        Version::V311 if props.is_empty() => Ok(()),
        Version::V311 => Err(MqttError::protocol(format!("{what} properties on MQTT 3.1.1"))),
    }
}

fn packet_id(id: u16, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    if id == 0 {
        return Err(MqttError::protocol(format!("{what} has packet identifier 0")));
    }
    out.extend_from_slice(&id.to_be_bytes());
    Ok(())
}

fn reasoned(reason: Option<u8>, props: &Option<Properties>, version: Version, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    match (version, reason, props) {
        (_, None, None) => Ok(()),
        (Version::V311, _, _) => Err(MqttError::protocol(format!("{what} reason code on MQTT 3.1.1"))),
        (Version::V5, None, Some(_)) => Err(MqttError::protocol(format!("{what} properties without a reason code"))),
        (Version::V5, Some(reason), props) => {
            out.push(reason);
            match props {
                Some(props) => write_properties(props, out),
                None => Ok(()),
            }
        }
    }
}

fn ack(a: &Ack, version: Version, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    packet_id(a.packet_id, what, out)?;
    reasoned(a.reason, &a.properties, version, what, out)
}

fn suback(a: &SubAck, version: Version, what: &str, out: &mut Vec<u8>) -> Result<(), MqttError> {
    packet_id(a.packet_id, what, out)?;
    props_if(&a.properties, version, what, out)?;
    out.extend_from_slice(&a.codes);
    Ok(())
}

fn body(packet: &Packet, version: Version, out: &mut Vec<u8>) -> Result<u8, MqttError> {
    let flags = match packet {
        Packet::Connect(c) => {
            write_string("MQTT", "protocol name", out)?;
            out.push(c.version.level());
            if c.version == Version::V311 && c.password.is_some() && c.username.is_none() {
                return Err(MqttError::protocol("password without user name (MQTT 3.1.1)"));
            }
            let mut flags = 0u8;
            if c.clean_start {
                flags |= 0x02;
            }
            if let Some(will) = &c.will {
                if will.qos > 2 {
                    return Err(MqttError::protocol(format!("will QoS {}", will.qos)));
                }
                flags |= 0x04 | (will.qos << 3) | if will.retain { 0x20 } else { 0 };
            }
            if c.password.is_some() {
                flags |= 0x40;
            }
            if c.username.is_some() {
                flags |= 0x80;
            }
            out.push(flags);
            out.extend_from_slice(&c.keep_alive.to_be_bytes());
            props_if(&c.properties, c.version, "CONNECT", out)?;
            write_string(&c.client_id, "client identifier", out)?;
            if let Some(will) = &c.will {
                props_if(&will.properties, c.version, "will", out)?;
                check_topic_name(&will.topic, false)?;
                write_string(&will.topic, "will topic", out)?;
                write_binary(&will.payload, "will payload", out)?;
            }
            if let Some(name) = &c.username {
                write_string(name, "user name", out)?;
            }
            if let Some(password) = &c.password {
                write_binary(password, "password", out)?;
            }
            0
        }
        Packet::ConnAck(c) => {
            out.push(u8::from(c.session_present));
            out.push(c.code);
            props_if(&c.properties, version, "CONNACK", out)?;
            0
        }
        Packet::Publish(p) => {
            if p.qos > 2 {
                return Err(MqttError::protocol(format!("PUBLISH QoS {}", p.qos)));
            }
            check_topic_name(&p.topic, version == Version::V5)?;
            write_string(&p.topic, "topic name", out)?;
            match (p.qos, p.packet_id) {
                (0, None) => {}
                (1 | 2, Some(id)) => packet_id(id, "PUBLISH", out)?,
                _ => return Err(MqttError::protocol("PUBLISH has a packet identifier exactly when its QoS is 1 or 2")),
            }
            props_if(&p.properties, version, "PUBLISH", out)?;
            out.extend_from_slice(&p.payload);
            (u8::from(p.dup) << 3) | (p.qos << 1) | u8::from(p.retain)
        }
        Packet::PubAck(a) => return ack(a, version, "PUBACK", out).map(|_| 0),
        Packet::PubRec(a) => return ack(a, version, "PUBREC", out).map(|_| 0),
        Packet::PubRel(a) => return ack(a, version, "PUBREL", out).map(|_| 2),
        Packet::PubComp(a) => return ack(a, version, "PUBCOMP", out).map(|_| 0),
        Packet::Subscribe(s) => {
            packet_id(s.packet_id, "SUBSCRIBE", out)?;
            props_if(&s.properties, version, "SUBSCRIBE", out)?;
            if s.filters.is_empty() {
                return Err(MqttError::protocol("SUBSCRIBE without a topic filter"));
            }
            for (filter, options) in &s.filters {
                check_topic_filter(filter)?;
                write_string(filter, "topic filter", out)?;
                out.push(*options);
            }
            2
        }
        Packet::SubAck(a) => return suback(a, version, "SUBACK", out).map(|_| 0),
        Packet::Unsubscribe(u) => {
            packet_id(u.packet_id, "UNSUBSCRIBE", out)?;
            props_if(&u.properties, version, "UNSUBSCRIBE", out)?;
            if u.filters.is_empty() {
                return Err(MqttError::protocol("UNSUBSCRIBE without a topic filter"));
            }
            for filter in &u.filters {
                check_topic_filter(filter)?;
                write_string(filter, "topic filter", out)?;
            }
            2
        }
        Packet::UnsubAck(a) => return suback(a, version, "UNSUBACK", out).map(|_| 0),
        Packet::PingReq | Packet::PingResp => 0,
        Packet::Disconnect(Reasoned { reason, properties }) => {
            reasoned(*reason, properties, version, "DISCONNECT", out)?;
            0
        }
        Packet::Auth(Reasoned { reason, properties }) => {
            if version == Version::V311 {
                return Err(MqttError::protocol("AUTH does not exist in MQTT 3.1.1"));
            }
            reasoned(*reason, properties, version, "AUTH", out)?;
            0
        }
    };
    Ok(flags)
}

/// Appends the encoded `packet` to `out` (a CONNECT uses its own version). On error
/// `out` is left as it was.
pub fn encode(packet: &Packet, version: Version, out: &mut Vec<u8>) -> Result<(), MqttError> {
    packet.check_properties()?;
    let mut content = Vec::with_capacity(64);
    let flags = body(packet, version, &mut content)?;
    let remaining = u32::try_from(content.len()).ok().filter(|n| *n <= MAX_VARINT).ok_or_else(|| {
        MqttError::too_large(format!("{} body of {} octets exceeds the MQTT maximum", packet.name(), content.len()))
    })?;
    out.push((packet.type_number() << 4) | flags);
    write_varint(remaining, out)?;
    out.extend_from_slice(&content);
    Ok(())
}

/// The encoded `packet` as a new vector.
pub fn encode_to_vec(packet: &Packet, version: Version) -> Result<Vec<u8>, MqttError> {
    let mut out = Vec::new();
    encode(packet, version, &mut out)?;
    Ok(out)
}
