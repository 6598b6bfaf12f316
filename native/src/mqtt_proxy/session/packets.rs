//! Packets as the session changes them: acknowledgements, the message Python sees, topic
//! aliases resolved, a verdict's changes applied.

use super::*;

pub(super) fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: None,
        properties: None,
    }
}

pub(super) fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

pub(super) fn msg_of(p: &Publish) -> Msg {
    Msg {
        topic: p.topic.clone(),
        qos: p.qos,
        retain: p.retain,
        dup: p.dup,
        packet_id: p.packet_id.unwrap_or(0),
        user: p
            .properties
            .iter()
            .filter_map(|prop| match &prop.value {
                PropValue::Pair(k, v) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        expiry: int_property(&p.properties, MESSAGE_EXPIRY),
        payload: p.payload.clone(),
    }
}

/// Resolves a topic alias against `aliases` and removes it, so the other leg sees the
/// full topic (the sidecar may drop a packet that set an alias, which would leave the
/// other side without it).
pub(super) fn resolve_alias(
    p: &mut Publish,
    aliases: &mut HashMap<u16, String>,
) -> Result<(), String> {
    let Some(alias) = int_property(&p.properties, TOPIC_ALIAS) else {
        return Ok(());
    };
    let alias = alias as u16;
    if p.topic.is_empty() {
        p.topic = aliases
            .get(&alias)
            .cloned()
            .ok_or_else(|| format!("unknown topic alias {alias}"))?;
    } else {
        aliases.insert(alias, p.topic.clone());
    }
    p.properties.retain(|prop| prop.id != TOPIC_ALIAS);
    Ok(())
}

/// Apply a verdict's changes to a message about to be forwarded.
pub(super) fn stamp(p: &mut Publish, v: &Verdict, version: Version) {
    if let Some(topic) = &v.topic {
        p.topic = topic.clone();
    }
    if version != Version::V5 {
        return;
    }
    if let Some(expiry) = v.expiry {
        // 0 removes the interval: the guard carries the expiration itself (see
        // docs/sidecar-mqtt.md, "Expiry"), so the broker cannot drop the message unseen.
        p.properties.retain(|prop| prop.id != MESSAGE_EXPIRY);
        if expiry > 0 {
            p.properties.push(Property {
                id: MESSAGE_EXPIRY,
                value: PropValue::U32(expiry),
            });
        }
    }
    for (k, val) in &v.user {
        p.properties.push(Property {
            id: USER_PROPERTY,
            value: PropValue::Pair(k.clone(), val.clone()),
        });
    }
}
