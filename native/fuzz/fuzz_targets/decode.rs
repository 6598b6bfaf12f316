//! The STOMP decoder fed arbitrary bytes: it must never panic, must give the same
//! frames (and fail or not) however the input is split, must keep to its limits, and
//! every frame it decodes that encodes again must decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqguard_native::stomp::{encode, Decoder, FrameError, Item, Limits, Version};

fn outcome(mut decoder: Decoder, data: &[u8], cuts: &[usize]) -> (Vec<Item>, Option<FrameError>) {
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
    // The first octets choose the setting: version, mode, limits, where to split.
    let [flags, step, data @ ..] = input else { return };
    let version = Version::ALL[usize::from(flags % 3)];
    let oversized = flags & 4 != 0;
    let limits = if flags & 8 != 0 {
        Limits { max_frame_bytes: 120, max_header_count: 4, max_header_line_bytes: 20 }
    } else {
        Limits::default()
    };
    let commands = ["CONNECT", "STOMP", "SEND", "SUBSCRIBE", "ACK", "NACK", "MESSAGE",
                    "RECEIPT", "ERROR", "CONNECTED", "DISCONNECT"];
    let make = || {
        let mut decoder = Decoder::with_commands(limits, &commands, 12, version).unwrap();
        decoder.set_oversized(oversized);
        decoder
    };
    let step = usize::from(*step).max(1);
    let cuts: Vec<usize> = (step..data.len()).step_by(step).collect();
    let (whole, whole_error) = outcome(make(), data, &[]);
    let (split, split_error) = outcome(make(), data, &cuts);
    assert_eq!(whole, split);
    assert_eq!(whole_error.is_some(), split_error.is_some());
    for item in &whole {
        let Item::Frame(frame) = item else { continue };
        assert!(frame.headers.len() <= limits.max_header_count);
        assert!(frame.body.len() < limits.max_frame_bytes);
        let Ok(encoded) = encode(frame, version) else { continue };
        let mut again = Vec::new();
        Decoder::with_commands(Limits::default(), &commands, 12, version)
            .unwrap()
            .feed(&encoded, &mut again)
            .expect("an encoded frame decodes");
        let [Item::Frame(decoded)] = &again[..] else { panic!("one frame: {again:?}") };
        let mut expected = frame.headers.clone();
        let mut seen_length = false;
        expected.retain(|(name, _)| {
            let repeat = name == "content-length" && seen_length;
            seen_length |= name == "content-length";
            !repeat
        });
        assert_eq!((&decoded.command, &decoded.body), (&frame.command, &frame.body));
        assert_eq!(decoded.headers, expected);
    }
});
