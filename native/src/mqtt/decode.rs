//! The streaming decoder: octets in, packets out, limits checked as data arrives.

use super::error::MqttError;
use super::packet::{Ack, ConnAck, Connect, Packet, Publish, Reasoned, SubAck, Subscribe, Unsubscribe, Version, Will};
use super::props::{read_properties, Properties};
use super::varint::read_varint;

/// Bounds on what a peer may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The whole packet, fixed header included (the MQTT 5 Maximum Packet Size sense).
    pub max_packet_bytes: usize,
    /// Properties in one property section.
    pub max_properties: usize,
    /// Octets of one property section.
    pub max_property_bytes: usize,
    /// Topic filters in one SUBSCRIBE or UNSUBSCRIBE.
    pub max_filters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_packet_bytes: 16 * 1024 * 1024, max_properties: 256, max_property_bytes: 64 * 1024, max_filters: 256 }
    }
}

/// A read position inside one packet's body.
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.data
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn skip(&mut self, n: usize) {
        self.data = &self.data[n.min(self.data.len())..];
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], MqttError> {
        if self.data.len() < n {
            return Err(MqttError::malformed(format!("{what} runs past the end of the packet")));
        }
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Ok(head)
    }

    pub(crate) fn sub(&mut self, n: usize, what: &str) -> Result<Cursor<'a>, MqttError> {
        Ok(Cursor::new(self.take(n, what)?))
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, MqttError> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, MqttError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, MqttError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn binary(&mut self, what: &str) -> Result<Vec<u8>, MqttError> {
        let n = usize::from(self.u16(what)?);
        Ok(self.take(n, what)?.to_vec())
    }

    /// A UTF-8 string as the specs define it: well-formed, no U+0000.
    pub(crate) fn string(&mut self, what: &str) -> Result<String, MqttError> {
        let n = usize::from(self.u16(what)?);
        let octets = self.take(n, what)?;
        let text = std::str::from_utf8(octets)
            .map_err(|_| MqttError::malformed(format!("{what} is not well-formed UTF-8")))?;
        if text.contains('\0') {
            return Err(MqttError::malformed(format!("{what} contains U+0000")));
        }
        Ok(text.to_owned())
    }

    fn packet_id(&mut self, what: &str) -> Result<u16, MqttError> {
        let id = self.u16("packet identifier")?;
        if id == 0 {
            return Err(MqttError::protocol(format!("{what} has packet identifier 0")));
        }
        Ok(id)
    }

    fn end(&self, what: &str) -> Result<(), MqttError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(MqttError::malformed(format!("{} unexpected octets at the end of {what}", self.data.len())))
        }
    }
}

/// Checks a topic name (PUBLISH, will): no wildcards.
pub(crate) fn check_topic_name(topic: &str, allow_empty: bool) -> Result<(), MqttError> {
    if topic.is_empty() && !allow_empty {
        return Err(MqttError::protocol("topic name is empty"));
    }
    if topic.contains(['+', '#']) {
        return Err(MqttError::protocol(format!("topic name {topic:?} contains a wildcard")));
    }
    Ok(())
}

/// Checks a topic filter: `+` fills a whole level, `#` is the whole last level.
pub(crate) fn check_topic_filter(filter: &str) -> Result<(), MqttError> {
    if filter.is_empty() {
        return Err(MqttError::protocol("topic filter is empty"));
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        let misplaced = (level.contains('+') && *level != "+")
            || (level.contains('#') && (*level != "#" || i + 1 != levels.len()));
        if misplaced {
            return Err(MqttError::protocol(format!("topic filter {filter:?} misplaces a wildcard")));
        }
    }
    Ok(())
}

/// The flags a packet type must carry in the fixed header (PUBLISH: any but QoS 3).
fn check_first_byte(first: u8, version: Option<Version>) -> Result<(), MqttError> {
    let kind = first >> 4;
    let flags = first & 0x0f;
    let expected = match kind {
        0 => return Err(MqttError::malformed("packet type 0 is reserved")),
        3 if (flags >> 1) & 3 == 3 => return Err(MqttError::malformed("PUBLISH with QoS 3")),
        3 => return Ok(()),
        15 if version == Some(Version::V311) => {
            return Err(MqttError::malformed("packet type 15 (AUTH) does not exist in MQTT 3.1.1"))
        }
        6 | 8 | 10 => 0b0010,
        _ => 0,
    };
    if flags != expected {
        return Err(MqttError::malformed(format!("packet type {kind} with reserved flags 0x{flags:x}")));
    }
    Ok(())
}

fn props_if(cur: &mut Cursor<'_>, version: Version, limits: &Limits) -> Result<Properties, MqttError> {
    match version {
        Version::V5 => read_properties(cur, limits),
        Version::V311 => Ok(Vec::new()),
    }
}

fn decode_connect(cur: &mut Cursor<'_>, limits: &Limits) -> Result<Connect, MqttError> {
    let name = cur.string("protocol name")?;
    let level = cur.u8("protocol level")?;
    if name != "MQTT" {
        return Err(MqttError::version(format!("protocol name {name:?} (level {level}); only MQTT 3.1.1 and 5 are spoken")));
    }
    let version = Version::from_level(level)
        .ok_or_else(|| MqttError::version(format!("protocol level {level}; only 4 (3.1.1) and 5 are spoken")))?;
    let flags = cur.u8("connect flags")?;
    if flags & 1 != 0 {
        return Err(MqttError::malformed("reserved connect flag is set"));
    }
    let has_will = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 3;
    let will_retain = flags & 0x20 != 0;
    let has_password = flags & 0x40 != 0;
    let has_username = flags & 0x80 != 0;
    if will_qos == 3 {
        return Err(MqttError::malformed("will QoS 3"));
    }
    if !has_will && (will_qos != 0 || will_retain) {
        return Err(MqttError::malformed("will QoS or retain set without a will"));
    }
    if version == Version::V311 && has_password && !has_username {
        return Err(MqttError::malformed("password flag without user name flag (MQTT 3.1.1)"));
    }
    let keep_alive = cur.u16("keep alive")?;
    let properties = props_if(cur, version, limits)?;
    let client_id = cur.string("client identifier")?;
    let will = if has_will {
        let properties = props_if(cur, version, limits)?;
        let topic = cur.string("will topic")?;
        check_topic_name(&topic, false)?;
        let payload = cur.binary("will payload")?;
        Some(Will { qos: will_qos, retain: will_retain, properties, topic, payload })
    } else {
        None
    };
    let username = if has_username { Some(cur.string("user name")?) } else { None };
    // The password is binary data; its contents never enter an error message.
    let password = if has_password { Some(cur.binary("password")?) } else { None };
    cur.end("CONNECT")?;
    Ok(Connect { version, clean_start: flags & 0x02 != 0, keep_alive, properties, client_id, will, username, password })
}

fn decode_ack(cur: &mut Cursor<'_>, version: Version, limits: &Limits, what: &str) -> Result<Ack, MqttError> {
    let packet_id = cur.packet_id(what)?;
    let (mut reason, mut properties) = (None, None);
    if version == Version::V5 && !cur.is_empty() {
        reason = Some(cur.u8("reason code")?);
        if !cur.is_empty() {
            properties = Some(read_properties(cur, limits)?);
        }
    }
    cur.end(what)?;
    Ok(Ack { packet_id, reason, properties })
}

fn decode_reasoned(cur: &mut Cursor<'_>, version: Version, limits: &Limits, what: &str) -> Result<Reasoned, MqttError> {
    let (mut reason, mut properties) = (None, None);
    if version == Version::V5 && !cur.is_empty() {
        reason = Some(cur.u8("reason code")?);
        if !cur.is_empty() {
            properties = Some(read_properties(cur, limits)?);
        }
    }
    cur.end(what)?;
    Ok(Reasoned { reason, properties })
}

fn decode_subscribe(cur: &mut Cursor<'_>, version: Version, limits: &Limits) -> Result<Subscribe, MqttError> {
    let packet_id = cur.packet_id("SUBSCRIBE")?;
    let properties = props_if(cur, version, limits)?;
    let mut filters = Vec::new();
    while !cur.is_empty() {
        if filters.len() >= limits.max_filters {
            return Err(MqttError::too_large(format!("more than {} topic filters", limits.max_filters)));
        }
        let filter = cur.string("topic filter")?;
        check_topic_filter(&filter)?;
        let options = cur.u8("subscription options")?;
        let reserved = match version {
            Version::V311 => 0xfc,
            Version::V5 => 0xc0,
        };
        if options & reserved != 0 || options & 3 == 3 || (options >> 4) & 3 == 3 {
            return Err(MqttError::malformed(format!("subscription options 0x{options:02x} for {filter:?}")));
        }
        filters.push((filter, options));
    }
    if filters.is_empty() {
        return Err(MqttError::protocol("SUBSCRIBE without a topic filter"));
    }
    Ok(Subscribe { packet_id, properties, filters })
}

fn decode_unsubscribe(cur: &mut Cursor<'_>, version: Version, limits: &Limits) -> Result<Unsubscribe, MqttError> {
    let packet_id = cur.packet_id("UNSUBSCRIBE")?;
    let properties = props_if(cur, version, limits)?;
    let mut filters = Vec::new();
    while !cur.is_empty() {
        if filters.len() >= limits.max_filters {
            return Err(MqttError::too_large(format!("more than {} topic filters", limits.max_filters)));
        }
        let filter = cur.string("topic filter")?;
        check_topic_filter(&filter)?;
        filters.push(filter);
    }
    if filters.is_empty() {
        return Err(MqttError::protocol("UNSUBSCRIBE without a topic filter"));
    }
    Ok(Unsubscribe { packet_id, properties, filters })
}

fn decode_suback(cur: &mut Cursor<'_>, version: Version, limits: &Limits, what: &str) -> Result<SubAck, MqttError> {
    let packet_id = cur.packet_id(what)?;
    let properties = props_if(cur, version, limits)?;
    let codes = cur.rest().to_vec();
    cur.skip(codes.len());
    if what == "UNSUBACK" && version == Version::V311 && !codes.is_empty() {
        return Err(MqttError::malformed("MQTT 3.1.1 UNSUBACK with a payload"));
    }
    if what == "SUBACK" && codes.is_empty() {
        return Err(MqttError::protocol("SUBACK without a return code"));
    }
    if what == "SUBACK" && version == Version::V311 {
        if let Some(bad) = codes.iter().find(|c| !matches!(c, 0 | 1 | 2 | 0x80)) {
            return Err(MqttError::malformed(format!("SUBACK return code 0x{bad:02x}")));
        }
    }
    Ok(SubAck { packet_id, properties, codes })
}

/// Decodes one packet from its first octet and its body (the octets after the
/// remaining length). `version` is the connection's protocol version; a CONNECT
/// carries its own.
pub fn decode_packet(first: u8, body: &[u8], version: Option<Version>, limits: &Limits) -> Result<Packet, MqttError> {
    check_first_byte(first, version)?;
    let kind = first >> 4;
    let mut cur = Cursor::new(body);
    if kind == 1 {
        let packet = Packet::Connect(decode_connect(&mut cur, limits)?);
        packet.check_properties()?;
        return Ok(packet);
    }
    let version = version.ok_or_else(|| {
        MqttError::protocol(format!("packet type {kind} before CONNECT (the protocol version is not known)"))
    })?;
    let cur = &mut cur;
    let packet = match kind {
        2 => {
            let flags = cur.u8("connect acknowledge flags")?;
            if flags & 0xfe != 0 {
                return Err(MqttError::malformed("reserved CONNACK flags are set"));
            }
            let code = cur.u8("connect reason code")?;
            let properties = props_if(cur, version, limits)?;
            cur.end("CONNACK")?;
            Packet::ConnAck(ConnAck { session_present: flags & 1 != 0, code, properties })
        }
        3 => {
            let qos = (first >> 1) & 3;
            let topic = cur.string("topic name")?;
            // MQTT 5 allows an empty topic when a topic alias stands for it.
            check_topic_name(&topic, version == Version::V5)?;
            let packet_id = if qos > 0 { Some(cur.packet_id("PUBLISH")?) } else { None };
            let properties = props_if(cur, version, limits)?;
            let payload = cur.rest().to_vec();
            cur.skip(payload.len());
            Packet::Publish(Publish {
                dup: first & 0x08 != 0,
                qos,
                retain: first & 1 != 0,
                topic,
                packet_id,
                properties,
                payload,
            })
        }
        4 => Packet::PubAck(decode_ack(cur, version, limits, "PUBACK")?),
        5 => Packet::PubRec(decode_ack(cur, version, limits, "PUBREC")?),
        6 => Packet::PubRel(decode_ack(cur, version, limits, "PUBREL")?),
        7 => Packet::PubComp(decode_ack(cur, version, limits, "PUBCOMP")?),
        8 => Packet::Subscribe(decode_subscribe(cur, version, limits)?),
        9 => Packet::SubAck(decode_suback(cur, version, limits, "SUBACK")?),
        10 => Packet::Unsubscribe(decode_unsubscribe(cur, version, limits)?),
        11 => Packet::UnsubAck(decode_suback(cur, version, limits, "UNSUBACK")?),
        12 | 13 => {
            cur.end(if kind == 12 { "PINGREQ" } else { "PINGRESP" })?;
            if kind == 12 {
                Packet::PingReq
            } else {
                Packet::PingResp
            }
        }
        14 => Packet::Disconnect(decode_reasoned(cur, version, limits, "DISCONNECT")?),
        _ => Packet::Auth(decode_reasoned(cur, version, limits, "AUTH")?),
    };
    packet.check_properties()?;
    Ok(packet)
}

/// A per-direction streaming decoder. It learns the protocol version from a CONNECT it
/// decodes; the decoder of the server's direction is told it ([`Decoder::set_version`]).
/// After an error it stays failed: MQTT has no way to resynchronise a stream.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    version: Option<Version>,
    buffer: Vec<u8>,
    failed: Option<MqttError>,
}

impl Decoder {
    pub fn new(limits: Limits, version: Option<Version>) -> Decoder {
        Decoder { limits, version, buffer: Vec::new(), failed: None }
    }

    pub fn version(&self) -> Option<Version> {
        self.version
    }

    pub fn set_version(&mut self, version: Option<Version>) {
        self.version = version;
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Octets received but not yet part of a whole packet.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Feeds octets; appends each whole packet to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Packet>) -> Result<(), MqttError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.buffer.extend_from_slice(data);
        let result = self.drain(out);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.buffer = Vec::new();
        }
        result
    }

    fn drain(&mut self, out: &mut Vec<Packet>) -> Result<(), MqttError> {
        let mut start = 0;
        let result = loop {
            let rest = &self.buffer[start..];
            let Some(&first) = rest.first() else { break Ok(()) };
            if let Err(error) = check_first_byte(first, self.version) {
                break Err(error);
            }
            let (remaining, used) = match read_varint(&rest[1..]) {
                Ok(Some(header)) => header,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            };
            let total = 1 + used + remaining as usize;
            if total > self.limits.max_packet_bytes {
                break Err(MqttError::too_large(format!(
                    "packet of {total} octets exceeds the maximum packet size {}",
                    self.limits.max_packet_bytes
                )));
            }
            if rest.len() < total {
                break Ok(());
            }
            match decode_packet(first, &rest[1 + used..total], self.version, &self.limits) {
                Ok(packet) => {
                    if let Packet::Connect(connect) = &packet {
                        self.version = Some(connect.version);
                    }
                    out.push(packet);
                    start += total;
                }
                Err(error) => break Err(error),
            }
        };
        self.buffer.drain(..start);
        result
    }
}
