//! Byte vectors from the MQTT 3.1.1 and 5.0 specifications' examples.

use super::*;

fn decode_all(data: &[u8], version: Option<Version>) -> Result<Vec<Packet>, MqttError> {
    let mut decoder = Decoder::new(Limits::default(), version);
    let mut out = Vec::new();
    decoder.feed(data, &mut out)?;
    assert_eq!(decoder.buffered(), 0, "a whole packet was left over");
    Ok(out)
}

/// Decodes one packet and checks that it re-encodes byte-exact.
fn one(data: &[u8], version: Option<Version>) -> Packet {
    let packets = decode_all(data, version).unwrap();
    assert_eq!(packets.len(), 1);
    let v = version.unwrap_or_else(|| match &packets[0] {
        Packet::Connect(c) => c.version,
        _ => Version::V5,
    });
    assert_eq!(encode_to_vec(&packets[0], v).unwrap(), data);
    packets.into_iter().next().unwrap()
}

fn with_header(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    write_varint(body.len() as u32, &mut out).unwrap();
    out.extend_from_slice(body);
    out
}

#[test]
fn connect_311_spec_flags_example() {
    // 3.1.1 figure 3.6: "MQTT", level 4, flags 0xCE (user name, password, will QoS 1,
    // will, clean session), keep alive 10; then the payload in the spec's order.
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0xCE, 0, 10];
    body.extend_from_slice(&[0, 2, b'i', b'd', 0, 3, b'a', b'/', b'w', 0, 2, b'b', b'y', 0, 4, b'u', b's', b'e', b'r']);
    body.extend_from_slice(&[0, 6, b's', b'3', b'c', b'r', b'e', b't']);
    let Packet::Connect(c) = one(&with_header(0x10, &body), None) else { panic!() };
    assert_eq!(c.version, Version::V311);
    assert!(c.clean_start);
    assert_eq!(c.keep_alive, 10);
    assert_eq!(c.client_id, "id");
    let will = c.will.as_ref().unwrap();
    assert_eq!((will.qos, will.retain, will.topic.as_str(), will.payload.as_slice()), (1, false, "a/w", &b"by"[..]));
    assert_eq!(c.username.as_deref(), Some("user"));
    assert_eq!(c.password.as_deref(), Some(&b"s3cret"[..]));
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret") && !shown.contains("\"user\""), "{shown}");
}

#[test]
fn connect_5_spec_example_with_session_expiry() {
    // 5.0 figure 3-6 / 3.1.2.12: flags 0xC2, keep alive 10, properties: session expiry 10.
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0xC2, 0, 10, 5, 0x11, 0, 0, 0, 10];
    body.extend_from_slice(&[0, 1, b'c', 0, 1, b'u', 0, 1, b'p']);
    let Packet::Connect(c) = one(&with_header(0x10, &body), None) else { panic!() };
    assert_eq!(c.version, Version::V5);
    assert_eq!(c.properties, vec![Property { id: 0x11, value: PropValue::U32(10) }]);
    assert!(!format!("{c:?}").contains("\"p\""));
}

#[test]
fn publish_311_spec_example() {
    // 3.1.1 figure 3.11: topic "a/b", packet identifier 10; QoS 1, payload "hi".
    let body = [0, 3, b'a', b'/', b'b', 0, 10, b'h', b'i'];
    let Packet::Publish(p) = one(&with_header(0x32, &body), Some(Version::V311)) else { panic!() };
    assert_eq!((p.topic.as_str(), p.qos, p.packet_id, p.payload.as_slice()), ("a/b", 1, Some(10), &b"hi"[..]));
}

#[test]
fn publish_5_user_properties_keep_order_and_expiry() {
    let mut body = vec![0, 3, b'a', b'/', b'b', 0, 7];
    let props = [
        0x02, 0, 0, 0, 60, // message expiry interval 60
        0x26, 0, 2, b'k', b'2', 0, 1, b'x', 0x26, 0, 2, b'k', b'1', 0, 1, b'y', 0x26, 0, 2, b'k', b'2', 0, 1, b'z',
    ];
    body.push(props.len() as u8);
    body.extend_from_slice(&props);
    body.extend_from_slice(b"payload");
    let Packet::Publish(p) = one(&with_header(0x3B, &body), Some(Version::V5)) else { panic!() };
    assert!(p.dup && p.retain && p.qos == 1);
    assert_eq!(props::user_properties(&p.properties), vec![("k2", "x"), ("k1", "y"), ("k2", "z")]);
    assert_eq!(props::int_property(&p.properties, props::MESSAGE_EXPIRY), Some(60));
}

#[test]
fn subscribe_suback_unsubscribe_311_spec_examples() {
    let sub = [0x82, 0x0e, 0, 10, 0, 3, b'a', b'/', b'b', 1, 0, 3, b'c', b'/', b'd', 2];
    let Packet::Subscribe(s) = one(&sub, Some(Version::V311)) else { panic!() };
    assert_eq!(s.filters, vec![("a/b".to_owned(), 1), ("c/d".to_owned(), 2)]);
    let Packet::SubAck(a) = one(&[0x90, 5, 0, 10, 0, 2, 0x80], Some(Version::V311)) else { panic!() };
    assert_eq!(a.codes, vec![0, 2, 0x80]);
    let unsub = [0xA2, 0x0c, 0, 10, 0, 3, b'a', b'/', b'b', 0, 3, b'c', b'/', b'd'];
    let Packet::Unsubscribe(u) = one(&unsub, Some(Version::V311)) else { panic!() };
    assert_eq!(u.filters, vec!["a/b", "c/d"]);
    one(&[0xB0, 2, 0, 10], Some(Version::V311));
}

#[test]
fn fixed_size_packets() {
    assert_eq!(one(&[0xC0, 0], Some(Version::V311)), Packet::PingReq);
    assert_eq!(one(&[0xD0, 0], Some(Version::V311)), Packet::PingResp);
    one(&[0xE0, 0], Some(Version::V311));
    one(&[0x20, 2, 1, 0], Some(Version::V311));
    one(&[0x20, 3, 0, 0, 0], Some(Version::V5));
    for first in [0x40, 0x50, 0x62, 0x70] {
        one(&[first, 2, 0, 5], Some(Version::V311));
        // MQTT 5: reason code and properties may each be left out, and stay so.
        one(&[first, 2, 0, 5], Some(Version::V5));
        one(&[first, 3, 0, 5, 0x10], Some(Version::V5));
        one(&[first, 4, 0, 5, 0x10, 0], Some(Version::V5));
    }
    one(&[0xE0, 1, 0x04], Some(Version::V5));
    one(&[0xF0, 2, 0x18, 0], Some(Version::V5));
}

fn error_of(data: &[u8], version: Option<Version>, limits: Limits) -> MqttError {
    let mut out = Vec::new();
    Decoder::new(limits, version).feed(data, &mut out).unwrap_err()
}

#[test]
fn errors_name_the_problem() {
    let v = Some(Version::V311);
    let d = Limits::default();
    assert!(error_of(&[0x00, 0], v, d).detail.contains("type 0"));
    assert!(error_of(&[0x36, 0], v, d).detail.contains("QoS 3"));
    assert!(error_of(&[0x60, 2, 0, 1], v, d).detail.contains("reserved flags"));
    assert!(error_of(&[0xF0, 0], v, d).detail.contains("AUTH"));
    assert!(error_of(&[0x30, 0x80, 0x80, 0x80, 0x80, 0x01], v, d).detail.contains("four octets"));
    assert!(error_of(&[0x30, 5, 0, 3, b'a', 0, b'b'], v, d).detail.contains("U+0000"));
    assert!(error_of(&[0x30, 5, 0, 3, b'a', 0xff, b'b'], v, d).detail.contains("UTF-8"));
    assert!(error_of(&[0x30, 5, 0, 3, b'a', b'+', b'b'], v, d).detail.contains("wildcard"));
    assert!(error_of(&[0x32, 5, 0, 1, b'a', 0, 0], v, d).detail.contains("identifier 0"));
    assert!(error_of(&[0x82, 6, 0, 1, 0, 1, b'#', 4], v, d).detail.contains("options"));
    assert!(error_of(&[0x82, 7, 0, 1, 0, 2, b'#', b'a', 0], v, d).detail.contains("wildcard"));
    assert!(error_of(&[0x40, 3, 0, 1, 0], v, d).detail.contains("unexpected octets"));
    assert_eq!(error_of(&[0x30, 0], None, d).kind, "protocol");
    let level3 = with_header(0x10, &[0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 2, 0, 10, 0, 0]);
    assert_eq!(error_of(&level3, None, d).kind, "unsupported-version");
    let twice = [0x40, 12, 0, 1, 0, 8, 0x1F, 0, 1, b'a', 0x1F, 0, 1, b'b'];
    assert!(error_of(&twice, Some(Version::V5), d).detail.contains("twice"));
    assert!(error_of(&[0x40, 5, 0, 1, 0, 1, 0x7f], Some(Version::V5), d).detail.contains("unknown property"));
}

#[test]
fn packet_size_is_checked_from_the_fixed_header() {
    let limits = Limits { max_packet_bytes: 1000, ..Limits::default() };
    // Only the fixed header of a 2 MB PUBLISH has arrived: refused already.
    let error = error_of(&[0x30, 0x80, 0x80, 0x80, 0x01], Some(Version::V311), limits);
    assert_eq!((error.kind, error.reason_code()), ("too-large", 0x95));
    let mut decoder = Decoder::new(limits, Some(Version::V311));
    let mut out = Vec::new();
    decoder.feed(&[0x30, 0xe5, 0x07], &mut out).unwrap();
    assert!(out.is_empty());
    // One octet more is refused, and the decoder stays failed after an error.
    let mut decoder = Decoder::new(limits, Some(Version::V311));
    assert_eq!(decoder.feed(&[0x30, 0xe6, 0x07], &mut out).unwrap_err().kind, "too-large");
    assert!(decoder.feed(&[0xC0, 0], &mut out).is_err());
}

#[test]
fn property_limits() {
    let limits = Limits { max_properties: 1, ..Limits::default() };
    let two = [0x40, 12, 0, 1, 0, 8, 0x1F, 0, 0, 0x26, 0, 0, 0, 0];
    assert_eq!(error_of(&two, Some(Version::V5), limits).kind, "too-large");
    assert!(decode_all(&two, Some(Version::V5)).is_ok());
    let limits = Limits { max_property_bytes: 4, ..Limits::default() };
    let big = [0x40, 9, 0, 1, 0, 5, 0x1F, 0, 2, b'a', b'b'];
    assert_eq!(error_of(&big, Some(Version::V5), limits).kind, "too-large");
}

#[test]
fn connect_error_never_shows_the_password() {
    // A CONNECT whose password runs past the packet: the error names the field only.
    let body = [0, 4, b'M', b'Q', b'T', b'T', 4, 0xC0, 0, 10, 0, 0, 0, 1, b'u', 0, 9, b'h', b'u', b'n', b't', b'e', b'r'];
    let error = error_of(&with_header(0x10, &body), None, Limits::default());
    assert!(error.detail.contains("password"));
    assert!(!error.to_string().contains("hunter") && !format!("{error:?}").contains("hunter"));
}

#[test]
fn encoder_refuses_what_the_decoder_would() {
    let p = Packet::Publish(Publish { dup: false, qos: 1, retain: false, topic: "a".into(), packet_id: None, properties: vec![], payload: vec![] });
    assert!(encode_to_vec(&p, Version::V311).is_err());
    let a = Packet::PubAck(Ack { packet_id: 1, reason: Some(0x10), properties: None });
    assert!(encode_to_vec(&a, Version::V311).is_err());
    assert_eq!(encode_to_vec(&a, Version::V5).unwrap(), [0x40, 3, 0, 1, 0x10]);
}

#[test]
fn properties_only_where_the_spec_allows_them() {
    // Topic alias (0x23) in a PUBACK: a protocol error; reason string (0x1F) is fine there.
    let alias = [0x40, 7, 0, 1, 0, 3, 0x23, 0, 1];
    assert!(error_of(&alias, Some(Version::V5), Limits::default()).detail.contains("not allowed in PUBACK"));
    one(&[0x40, 7, 0, 1, 0, 3, 0x1F, 0, 0], Some(Version::V5));
    // Subscription identifier 0 is a protocol error.
    let zero = [0x82, 9, 0, 1, 2, 0x0B, 0, 0, 1, b'a', 0];
    assert!(error_of(&zero, Some(Version::V5), Limits::default()).detail.contains("identifier 0"));
    assert!(prop_allowed(0x18, WILL) && !prop_allowed(0x18, 3));
}
