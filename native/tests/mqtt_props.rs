//! Properties of the MQTT codec: every packet it encodes decodes to itself (and
//! re-encodes to the same octets), arbitrary octets never panic, any split of a stream
//! gives the same packets, and the limits hold.

use mqguard_native::mqtt::{
    encode_to_vec, prop_allowed, Ack, ConnAck, Connect, Decoder, Limits, MqttError, Packet, PropValue, Property, Publish, Reasoned,
    SubAck, Subscribe, Unsubscribe, Version, Will, WILL,
};
use proptest::prelude::*;

/// Bounded so the whole file runs in a few seconds.
const CASES: u32 = 400;

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9é€😀 ]{0,12}"
}

fn topic() -> impl Strategy<Value = String> {
    "[a-z0-9é]{1,6}(/[a-z0-9é]{1,6}){0,3}"
}

fn filter() -> impl Strategy<Value = String> {
    prop_oneof![topic(), Just("#".to_owned()), Just("a/+/b".to_owned()), Just("+/#".to_owned())]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..40)
}

fn property() -> impl Strategy<Value = Property> {
    prop_oneof![
        (text(), text()).prop_map(|(k, v)| Property { id: 0x26, value: PropValue::Pair(k, v) }),
        any::<u32>().prop_map(|v| Property { id: 0x02, value: PropValue::U32(v) }),
        text().prop_map(|v| Property { id: 0x03, value: PropValue::Str(v) }),
        bytes().prop_map(|v| Property { id: 0x09, value: PropValue::Bin(v) }),
        (1u32..268_435_455).prop_map(|v| Property { id: 0x0B, value: PropValue::VarInt(v) }),
        any::<u16>().prop_map(|v| Property { id: 0x23, value: PropValue::U16(v) }),
        (0u8..2).prop_map(|v| Property { id: 0x01, value: PropValue::Byte(v) }),
        text().prop_map(|v| Property { id: 0x1F, value: PropValue::Str(v) }),
        any::<u32>().prop_map(|v| Property { id: 0x11, value: PropValue::U32(v) }),
        any::<u16>().prop_map(|v| Property { id: 0x21, value: PropValue::U16(v) }),
        any::<u32>().prop_map(|v| Property { id: 0x18, value: PropValue::U32(v) }),
    ]
}

/// Properties with no repeats except user properties and subscription identifiers.
fn props(version: Version, packet_type: u8) -> BoxedStrategy<Vec<Property>> {
    if version == Version::V311 {
        return Just(Vec::new()).boxed();
    }
    proptest::collection::vec(property(), 0..8)
        .prop_map(move |mut list| {
            let mut seen = Vec::new();
            list.retain(|p| {
                let keep = prop_allowed(p.id, packet_type)
                    && (p.id == 0x26 || p.id == 0x0B || !seen.contains(&p.id));
                seen.push(p.id);
                keep
            });
            list
        })
        .boxed()
}

fn ack(version: Version, packet_type: u8) -> BoxedStrategy<Ack> {
    let id = 1u16..;
    match version {
        Version::V311 => id.prop_map(|packet_id| Ack { packet_id, reason: None, properties: None }).boxed(),
        Version::V5 => (id, proptest::option::of((any::<u8>(), proptest::option::of(props(version, packet_type)))))
            .prop_map(|(packet_id, r)| match r {
                None => Ack { packet_id, reason: None, properties: None },
                Some((reason, properties)) => Ack { packet_id, reason: Some(reason), properties },
            })
            .boxed(),
    }
}

fn reasoned(version: Version, packet_type: u8) -> BoxedStrategy<Reasoned> {
    match version {
        Version::V311 => Just(Reasoned { reason: None, properties: None }).boxed(),
        Version::V5 => proptest::option::of((any::<u8>(), proptest::option::of(props(version, packet_type))))
            .prop_map(|r| match r {
                None => Reasoned { reason: None, properties: None },
                Some((reason, properties)) => Reasoned { reason: Some(reason), properties },
            })
            .boxed(),
    }
}

fn packet(version: Version) -> BoxedStrategy<Packet> {
    let will = (0u8..3, any::<bool>(), props(version, WILL), topic(), bytes())
        .prop_map(|(qos, retain, properties, topic, payload)| Will { qos, retain, properties, topic, payload });
    let connect = (any::<bool>(), any::<u16>(), props(version, 1), text(), proptest::option::of(will), proptest::option::of(text()), proptest::option::of(bytes()))
        .prop_map(move |(clean_start, keep_alive, properties, client_id, will, username, password)| {
            // MQTT 3.1.1 has no password without a user name.
            let password = if version == Version::V311 && username.is_none() { None } else { password };
            Packet::Connect(Connect { version, clean_start, keep_alive, properties, client_id, will, username, password })
        });
    let publish = (any::<bool>(), 0u8..3, any::<bool>(), topic(), 1u16.., props(version, 3), bytes())
        .prop_map(|(dup, qos, retain, topic, id, properties, payload)| {
            let packet_id = (qos > 0).then_some(id);
            Packet::Publish(Publish { dup, qos, retain, topic, packet_id, properties, payload })
        });
    let subscribe_options: BoxedStrategy<u8> = match version {
        Version::V311 => (0u8..3).boxed(),
        Version::V5 => (0u8..3, 0u8..4, 0u8..3).prop_map(|(q, flags, rh)| q | (flags << 2) | (rh << 4)).boxed(),
    };
    let subscribe = (1u16.., props(version, 8), proptest::collection::vec((filter(), subscribe_options), 1..4))
        .prop_map(|(packet_id, properties, filters)| Packet::Subscribe(Subscribe { packet_id, properties, filters }));
    let suback_codes = proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0x80)], 1..4);
    let suback = (1u16.., props(version, 9), suback_codes)
        .prop_map(|(packet_id, properties, codes)| Packet::SubAck(SubAck { packet_id, properties, codes }));
    let unsubscribe = (1u16.., props(version, 10), proptest::collection::vec(filter(), 1..4))
        .prop_map(|(packet_id, properties, filters)| Packet::Unsubscribe(Unsubscribe { packet_id, properties, filters }));
    let unsuback_codes = match version {
        Version::V311 => Just(Vec::new()).boxed(),
        Version::V5 => proptest::collection::vec(any::<u8>(), 0..4).boxed(),
    };
    let unsuback = (1u16.., props(version, 11), unsuback_codes)
        .prop_map(|(packet_id, properties, codes)| Packet::UnsubAck(SubAck { packet_id, properties, codes }));
    let connack = (any::<bool>(), any::<u8>(), props(version, 2))
        .prop_map(|(session_present, code, properties)| Packet::ConnAck(ConnAck { session_present, code, properties }));
    let mut choices = vec![
        connect.boxed(),
        connack.boxed(),
        publish.boxed(),
        ack(version, 4).prop_map(Packet::PubAck).boxed(),
        ack(version, 5).prop_map(Packet::PubRec).boxed(),
        ack(version, 6).prop_map(Packet::PubRel).boxed(),
        ack(version, 7).prop_map(Packet::PubComp).boxed(),
        subscribe.boxed(),
        suback.boxed(),
        unsubscribe.boxed(),
        unsuback.boxed(),
        Just(Packet::PingReq).boxed(),
        Just(Packet::PingResp).boxed(),
        reasoned(version, 14).prop_map(Packet::Disconnect).boxed(),
    ];
    if version == Version::V5 {
        choices.push(reasoned(version, 15).prop_map(Packet::Auth).boxed());
    }
    proptest::strategy::Union::new(choices).boxed()
}

fn version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::V311), Just(Version::V5)]
}

fn packets() -> impl Strategy<Value = (Version, Vec<Packet>)> {
    version().prop_flat_map(|v| (Just(v), proptest::collection::vec(packet(v), 1..6)))
}

fn decode_split(data: &[u8], cuts: &[usize], version: Option<Version>, limits: Limits) -> (Vec<Packet>, Option<MqttError>) {
    let mut decoder = Decoder::new(limits, version);
    let mut out = Vec::new();
    let mut last = 0;
    for &cut in cuts.iter().chain(std::iter::once(&data.len())) {
        let cut = cut.clamp(last, data.len());
        if let Err(error) = decoder.feed(&data[last..cut], &mut out) {
            return (out, Some(error));
        }
        last = cut;
    }
    (out, None)
}

fn stream_of(version: Version, packets: &[Packet]) -> Vec<u8> {
    let mut data = Vec::new();
    for packet in packets {
        // A CONNECT in the stream speaks its own version; keep them all alike.
        if let Packet::Connect(c) = packet {
            assert_eq!(c.version, version);
        }
        data.extend(encode_to_vec(packet, version).unwrap());
    }
    data
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn encoded_packets_decode_to_themselves((version, packets) in packets(), cuts in proptest::collection::vec(0usize..600, 0..8)) {
        let data = stream_of(version, &packets);
        let mut cuts = cuts;
        cuts.sort_unstable();
        let (decoded, error) = decode_split(&data, &cuts, Some(version), Limits::default());
        prop_assert!(error.is_none(), "{error:?}");
        prop_assert_eq!(&decoded, &packets);
        for packet in &decoded {
            let again = encode_to_vec(packet, version).unwrap();
            let mut one = Decoder::new(Limits::default(), Some(version));
            let mut out = Vec::new();
            one.feed(&again, &mut out).unwrap();
            prop_assert_eq!(&out[..], std::slice::from_ref(packet));
        }
    }

    #[test]
    fn arbitrary_octets_never_panic_and_split_alike(data in proptest::collection::vec(any::<u8>(), 0..300), step in 1usize..20, v in proptest::option::of(version())) {
        let cuts: Vec<usize> = (step..data.len()).step_by(step).collect();
        let limits = Limits { max_packet_bytes: 200, max_properties: 4, max_property_bytes: 64, max_filters: 3 };
        let (whole, whole_error) = decode_split(&data, &[], v, limits);
        let (split, split_error) = decode_split(&data, &cuts, v, limits);
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(&whole_error, &split_error);
        // Whatever decodes re-encodes to the octets it came from.
        let mut expected = Vec::new();
        let mut version = v;
        for packet in &whole {
            if let Packet::Connect(c) = packet { version = Some(c.version); }
            expected.extend(encode_to_vec(packet, version.unwrap()).unwrap());
        }
        prop_assert_eq!(&expected[..], &data[..expected.len()]);
    }

    #[test]
    fn limits_hold((version, packets) in packets(), max in 2usize..200) {
        let limits = Limits { max_packet_bytes: max, ..Limits::default() };
        let data = stream_of(version, &packets);
        let (decoded, error) = decode_split(&data, &[], Some(version), limits);
        for packet in &decoded {
            prop_assert!(encode_to_vec(packet, version).unwrap().len() <= max);
        }
        let first_too_big = packets.iter().position(|p| encode_to_vec(p, version).unwrap().len() > max);
        match first_too_big {
            Some(index) => {
                prop_assert_eq!(decoded.len(), index);
                prop_assert_eq!(error.map(|e| e.kind), Some("too-large"));
            }
            None => prop_assert!(error.is_none()),
        }
    }
}
