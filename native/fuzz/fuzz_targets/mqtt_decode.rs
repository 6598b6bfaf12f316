//! The MQTT decoder fed arbitrary bytes: it must never panic, must give the same
//! packets and the same error however the input is split, must keep to its limits, and
//! every packet it decodes must encode again to the very octets it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqguard_native::mqtt::{encode_to_vec, Decoder, Limits, MqttError, Packet, Version};

fn outcome(limits: Limits, version: Option<Version>, data: &[u8], cuts: &[usize]) -> (Vec<Packet>, Option<MqttError>) {
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

fuzz_target!(|input: &[u8]| {
    // The first octets choose the setting: version, limits, where to split.
    let [flags, step, data @ ..] = input else { return };
    let version = [None, Some(Version::V311), Some(Version::V5)][usize::from(flags % 3)];
    let limits = if flags & 4 != 0 {
        Limits { max_packet_bytes: 64, max_properties: 3, max_property_bytes: 24, max_filters: 2 }
    } else {
        Limits::default()
    };
    let step = usize::from(*step).max(1);
    let cuts: Vec<usize> = (step..data.len()).step_by(step).collect();
    let (whole, whole_error) = outcome(limits, version, data, &[]);
    let (split, split_error) = outcome(limits, version, data, &cuts);
    assert_eq!(whole, split);
    assert_eq!(whole_error, split_error);
    let mut current = version;
    let mut offset = 0;
    for packet in &whole {
        if let Packet::Connect(connect) = packet {
            current = Some(connect.version);
        }
        let encoded = encode_to_vec(packet, current.expect("a version is known")).expect("a decoded packet encodes");
        assert!(encoded.len() <= limits.max_packet_bytes);
        assert_eq!(&data[offset..offset + encoded.len()], &encoded[..], "re-encoding is byte-exact");
        offset += encoded.len();
    }
});
