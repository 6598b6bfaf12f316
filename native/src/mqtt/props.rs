//! MQTT 5 properties: identifier, typed value, wire order kept.

use std::fmt;

use super::error::MqttError;
use super::varint::{read_varint, varint_len, write_varint};
use super::decode::{Cursor, Limits};

/// One property value, typed as the spec's property table says.
#[derive(Clone, PartialEq, Eq)]
pub enum PropValue {
    Byte(u8),
    U16(u16),
    U32(u32),
    VarInt(u32),
    Str(String),
    Bin(Vec<u8>),
    Pair(String, String),
}

#[derive(Clone, PartialEq, Eq)]
pub struct Property {
    pub id: u8,
    pub value: PropValue,
}

/// A packet's properties in wire order.
pub type Properties = Vec<Property>;

pub const PAYLOAD_FORMAT: u8 = 0x01;
pub const MESSAGE_EXPIRY: u8 = 0x02;
pub const SUBSCRIPTION_ID: u8 = 0x0B;
pub const AUTH_DATA: u8 = 0x16;
pub const USER_PROPERTY: u8 = 0x26;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Byte,
    U16,
    U32,
    VarInt,
    Str,
    Bin,
    Pair,
}

/// Name and type of every property of MQTT 5.0 table 2-4.
const TABLE: [(u8, &str, Kind); 27] = [
    (0x01, "payload_format_indicator", Kind::Byte),
    (0x02, "message_expiry_interval", Kind::U32),
    (0x03, "content_type", Kind::Str),
    (0x08, "response_topic", Kind::Str),
    (0x09, "correlation_data", Kind::Bin),
    (0x0B, "subscription_identifier", Kind::VarInt),
    (0x11, "session_expiry_interval", Kind::U32),
    (0x12, "assigned_client_identifier", Kind::Str),
    (0x13, "server_keep_alive", Kind::U16),
    (0x15, "authentication_method", Kind::Str),
    (0x16, "authentication_data", Kind::Bin),
    (0x17, "request_problem_information", Kind::Byte),
    (0x18, "will_delay_interval", Kind::U32),
    (0x19, "request_response_information", Kind::Byte),
    (0x1A, "response_information", Kind::Str),
    (0x1C, "server_reference", Kind::Str),
    (0x1F, "reason_string", Kind::Str),
    (0x21, "receive_maximum", Kind::U16),
    (0x22, "topic_alias_maximum", Kind::U16),
    (0x23, "topic_alias", Kind::U16),
    (0x24, "maximum_qos", Kind::Byte),
    (0x25, "retain_available", Kind::Byte),
    (0x26, "user_property", Kind::Pair),
    (0x27, "maximum_packet_size", Kind::U32),
    (0x28, "wildcard_subscription_available", Kind::Byte),
    (0x29, "subscription_identifier_available", Kind::Byte),
    (0x2A, "shared_subscription_available", Kind::Byte),
];

fn lookup(id: u8) -> Option<(&'static str, Kind)> {
    TABLE.iter().find(|(i, _, _)| *i == id).map(|&(_, name, kind)| (name, kind))
}

/// The spec's name of property `id` (snake case), if it is one.
pub fn prop_name(id: u8) -> Option<&'static str> {
    lookup(id).map(|(name, _)| name)
}

/// The identifier of the property named `name`.
pub fn prop_id(name: &str) -> Option<u8> {
    TABLE.iter().find(|(_, n, _)| *n == name).map(|&(id, _, _)| id)
}

fn kind_of(value: &PropValue) -> Kind {
    match value {
        PropValue::Byte(_) => Kind::Byte,
        PropValue::U16(_) => Kind::U16,
        PropValue::U32(_) => Kind::U32,
        PropValue::VarInt(_) => Kind::VarInt,
        PropValue::Str(_) => Kind::Str,
        PropValue::Bin(_) => Kind::Bin,
        PropValue::Pair(_, _) => Kind::Pair,
    }
}

impl fmt::Debug for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = prop_name(self.id).unwrap_or("unknown");
        match &self.value {
            // Authentication data is a credential: only its length is shown.
            PropValue::Bin(data) if self.id == AUTH_DATA => write!(f, "{name}=<{} octets redacted>", data.len()),
            PropValue::Byte(v) => write!(f, "{name}={v}"),
            PropValue::U16(v) => write!(f, "{name}={v}"),
            PropValue::U32(v) | PropValue::VarInt(v) => write!(f, "{name}={v}"),
            PropValue::Str(v) => write!(f, "{name}={v:?}"),
            PropValue::Bin(v) => write!(f, "{name}=<{} octets>", v.len()),
            PropValue::Pair(k, v) => write!(f, "{name}=({k:?}, {v:?})"),
        }
    }
}

/// Reads a property section (its length, then the properties) at the cursor.
pub(crate) fn read_properties(cur: &mut Cursor<'_>, limits: &Limits) -> Result<Properties, MqttError> {
    let (length, used) = read_varint(cur.rest())?
        .ok_or_else(|| MqttError::malformed("property length runs past the packet"))?;
    cur.skip(used);
    let length = length as usize;
    if length > limits.max_property_bytes {
        return Err(MqttError::too_large(format!(
            "property section of {length} octets exceeds the limit of {}",
            limits.max_property_bytes
        )));
    }
    let mut section = cur.sub(length, "property section")?;
    let mut props: Properties = Vec::new();
    while !section.is_empty() {
        if props.len() >= limits.max_properties {
            return Err(MqttError::too_large(format!("more than {} properties", limits.max_properties)));
        }
        let id = section.u8("property identifier")?;
        let (name, kind) = lookup(id)
            .ok_or_else(|| MqttError::malformed(format!("unknown property identifier 0x{id:02x}")))?;
        let value = match kind {
            Kind::Byte => PropValue::Byte(section.u8(name)?),
            Kind::U16 => PropValue::U16(section.u16(name)?),
            Kind::U32 => PropValue::U32(section.u32(name)?),
            Kind::VarInt => {
                let (v, used) = read_varint(section.rest())?
                    .ok_or_else(|| MqttError::malformed(format!("{name} runs past the property section")))?;
                section.skip(used);
                PropValue::VarInt(v)
            }
            Kind::Str => PropValue::Str(section.string(name)?),
            Kind::Bin => PropValue::Bin(section.binary(name)?),
            Kind::Pair => PropValue::Pair(section.string("user property name")?, section.string("user property value")?),
        };
        if id != USER_PROPERTY && id != SUBSCRIPTION_ID && props.iter().any(|p| p.id == id) {
            return Err(MqttError::protocol(format!("property {name} appears twice")));
        }
        props.push(Property { id, value });
    }
    Ok(props)
}

fn value_len(value: &PropValue) -> usize {
    match value {
        PropValue::Byte(_) => 1,
        PropValue::U16(_) => 2,
        PropValue::U32(_) => 4,
        PropValue::VarInt(v) => varint_len(*v),
        PropValue::Str(s) => 2 + s.len(),
        PropValue::Bin(b) => 2 + b.len(),
        PropValue::Pair(k, v) => 4 + k.len() + v.len(),
    }
}

/// The octets of the property section's content (without its length).
pub(crate) fn properties_len(props: &[Property]) -> usize {
    props.iter().map(|p| 1 + value_len(&p.value)).sum()
}

/// Writes a property section: its length, then the properties.
pub(crate) fn write_properties(props: &[Property], out: &mut Vec<u8>) -> Result<(), MqttError> {
    let length = properties_len(props);
    write_varint(u32::try_from(length).unwrap_or(u32::MAX), out)?;
    for prop in props {
        let (name, kind) = lookup(prop.id)
            .ok_or_else(|| MqttError::malformed(format!("unknown property identifier 0x{:02x}", prop.id)))?;
        if kind != kind_of(&prop.value) {
            return Err(MqttError::malformed(format!("property {name} has a value of the wrong type")));
        }
        out.push(prop.id);
        match &prop.value {
            PropValue::Byte(v) => out.push(*v),
            PropValue::U16(v) => out.extend_from_slice(&v.to_be_bytes()),
            PropValue::U32(v) => out.extend_from_slice(&v.to_be_bytes()),
            PropValue::VarInt(v) => write_varint(*v, out)?,
            PropValue::Str(s) => super::encode::write_string(s, name, out)?,
            PropValue::Bin(b) => super::encode::write_binary(b, name, out)?,
            PropValue::Pair(k, v) => {
                super::encode::write_string(k, "user property name", out)?;
                super::encode::write_string(v, "user property value", out)?;
            }
        }
    }
    Ok(())
}

/// `(name, value)` of every user property, in order.
pub fn user_properties(props: &[Property]) -> Vec<(&str, &str)> {
    props
        .iter()
        .filter_map(|p| match &p.value {
            PropValue::Pair(k, v) => Some((k.as_str(), v.as_str())),
            _ => None,
        })
        .collect()
}

/// The first value of property `id` as an integer, if it has one.
pub fn int_property(props: &[Property], id: u8) -> Option<u32> {
    props.iter().find(|p| p.id == id).and_then(|p| match p.value {
        PropValue::Byte(v) => Some(u32::from(v)),
        PropValue::U16(v) => Some(u32::from(v)),
        PropValue::U32(v) | PropValue::VarInt(v) => Some(v),
        _ => None,
    })
}

/// What Python passes as a property value, before its type is checked.
pub(crate) enum Given {
    Int(u64),
    Str(String),
    Bin(Vec<u8>),
    Pair(String, String),
}

/// The value of property `id` from `given`, checked against the property's type.
pub(crate) fn typed_value(id: u8, given: Given) -> Result<PropValue, String> {
    let (name, kind) = lookup(id).ok_or_else(|| format!("unknown property identifier 0x{id:02x}"))?;
    let too_big = || format!("property {name} is out of range");
    Ok(match (kind, given) {
        (Kind::Byte, Given::Int(v)) => PropValue::Byte(u8::try_from(v).map_err(|_| too_big())?),
        (Kind::U16, Given::Int(v)) => PropValue::U16(u16::try_from(v).map_err(|_| too_big())?),
        (Kind::U32, Given::Int(v)) => PropValue::U32(u32::try_from(v).map_err(|_| too_big())?),
        (Kind::VarInt, Given::Int(v)) => {
            PropValue::VarInt(u32::try_from(v).ok().filter(|v| *v <= super::varint::MAX_VARINT).ok_or_else(too_big)?)
        }
        (Kind::Str, Given::Str(s)) => PropValue::Str(s),
        (Kind::Bin, Given::Bin(b)) => PropValue::Bin(b),
        (Kind::Pair, Given::Pair(k, v)) => PropValue::Pair(k, v),
        (kind, _) => {
            let wanted = match kind {
                Kind::Byte | Kind::U16 | Kind::U32 | Kind::VarInt => "an int",
                Kind::Str => "a str",
                Kind::Bin => "bytes",
                Kind::Pair => "a (str, str) pair",
            };
            return Err(format!("property {name} takes {wanted}"));
        }
    })
}

/// Bit of the will's properties in [`allowed_mask`]; packet types use bit `type`.
pub const WILL: u8 = 0;

/// The packets a property may appear in (MQTT 5.0 table 2-4), as bits by packet type.
fn allowed_mask(id: u8) -> u16 {
    const fn bits(types: &[u8]) -> u16 {
        let mut mask = 0;
        let mut i = 0;
        while i < types.len() {
            mask |= 1 << types[i];
            i += 1;
        }
        mask
    }
    match id {
        0x01 | 0x02 | 0x03 | 0x08 | 0x09 => bits(&[3, WILL]),
        0x0B => bits(&[3, 8]),
        0x11 => bits(&[1, 2, 14]),
        0x12 | 0x13 | 0x1A | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => bits(&[2]),
        0x15 | 0x16 => bits(&[1, 2, 15]),
        0x17 | 0x19 => bits(&[1]),
        0x18 => bits(&[WILL]),
        0x1C => bits(&[2, 14]),
        0x1F => bits(&[2, 4, 5, 6, 7, 9, 11, 14, 15]),
        0x21 | 0x22 | 0x27 => bits(&[1, 2]),
        0x23 => bits(&[3]),
        0x26 => 0xffff,
        _ => 0,
    }
}

/// Whether property `id` may appear in packets of `packet_type` ([`WILL`] for a will).
pub fn prop_allowed(id: u8, packet_type: u8) -> bool {
    packet_type < 16 && allowed_mask(id) & (1 << packet_type) != 0
}

/// Checks that each property belongs in `packet_type` (`what` names it in the error).
pub(crate) fn check_allowed(props: &[Property], packet_type: u8, what: &str) -> Result<(), MqttError> {
    for prop in props {
        let name = prop_name(prop.id).unwrap_or("unknown");
        if !prop_allowed(prop.id, packet_type) {
            return Err(MqttError::protocol(format!("property {name} is not allowed in {what}")));
        }
        if prop.value == PropValue::VarInt(0) && prop.id == SUBSCRIPTION_ID {
            return Err(MqttError::protocol("subscription identifier 0"));
        }
    }
    Ok(())
}
