//! Properties of the STOMP codec: round trips per version, arbitrary input (only errors,
//! never a panic, limits respected) and split points (the outcome never depends on how
//! the input arrives). Bounded so that `cargo test --release` stays quick.

use mqguard_native::stomp::{
    encode, Decoder, FrameError, Item, Limits, RawFrame, Version, CLIENT_COMMANDS,
    SERVER_COMMANDS, UNESCAPED_COMMANDS,
};
use proptest::prelude::*;

fn all_commands() -> Vec<&'static str> {
    CLIENT_COMMANDS.iter().chain(SERVER_COMMANDS.iter()).copied().collect()
}

fn decoder(limits: Limits, version: Version) -> Decoder {
    Decoder::with_commands(limits, &all_commands(), 32, version).unwrap()
}

/// Header text with every character STOMP treats specially, and some it does not.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just(":".to_owned()),
            Just("\n".to_owned()),
            Just("\r".to_owned()),
            Just("\\".to_owned()),
            Just("\\c".to_owned()),
            Just(" ".to_owned()),
            Just("\u{e9}".to_owned()),
            Just("\u{1f600}".to_owned()),
            Just("content-length".to_owned()),
            "[a-z0-9-]{0,6}",
            any::<String>().prop_map(|s| s.replace('\0', "")),
        ],
        0..5,
    )
    .prop_map(|parts| parts.concat())
}

/// Makes (name, value) carriable by `version` (what encode requires).
fn representable(command: &str, version: Version, name: String, value: String) -> (String, String) {
    let mut name = if name.is_empty() { "n".to_owned() } else { name };
    let mut value = value;
    if name == "content-length" {
        name = "content_length".to_owned();
    }
    if version == Version::V10 || UNESCAPED_COMMANDS.contains(&command) {
        name = name.replace([':', '\n'], "_");
        value = value.replace('\n', "_");
    }
    if value.ends_with('\r') && (version != Version::V12 || UNESCAPED_COMMANDS.contains(&command)) {
        value.push('.');
    }
    (name, value)
}

fn frame(version: Version) -> impl Strategy<Value = RawFrame> {
    (
        prop::sample::select(all_commands()),
        prop::collection::vec((text(), text()), 0..6),
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            Just(b"a\0b".to_vec()),
            Just(b"\n\n\0\n".to_vec()),
        ],
    )
        .prop_map(move |(command, headers, body)| {
            let headers = headers
                .into_iter()
                .map(|(n, v)| representable(command, version, n, v))
                .collect();
            RawFrame::new(command, headers, body)
        })
}

/// What decoding `encode(frame)` gives: content-length added for a body holding a NUL.
fn decoded_form(frame: &RawFrame) -> RawFrame {
    let mut frame = frame.clone();
    if frame.body.contains(&0) && frame.get("content-length").is_none() {
        frame.headers.push(("content-length".to_owned(), frame.body.len().to_string()));
    }
    frame.wire = None;
    frame
}

fn without_wire(items: Vec<Item>) -> Vec<Item> {
    items
        .into_iter()
        .map(|item| match item {
            Item::Frame(mut frame) => {
                frame.wire = None;
                Item::Frame(frame)
            }
            other => other,
        })
        .collect()
}

/// Everything decoded before the first error, and the error, feeding `data` in pieces
/// cut at `cuts`.
fn outcome(mut decoder: Decoder, data: &[u8], cuts: &[usize]) -> (Vec<Item>, Option<FrameError>) {
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
    cuts.sort_unstable();
    cuts.push(data.len());
    let mut out = Vec::new();
    let mut last = 0;
    for cut in cuts {
        if let Err(error) = decoder.feed(&data[last..cut], &mut out) {
            let again = decoder.feed(b"SEND\n\n\0", &mut Vec::new());
            assert_eq!(again.unwrap_err().reason, error.reason, "poisoned");
            return (out, Some(error));
        }
        last = cut;
    }
    (out, None)
}

fn versions() -> impl Strategy<Value = Version> {
    prop::sample::select(Version::ALL.to_vec())
}

const CASES: u32 = 1000;

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(
        (version, frame) in versions().prop_flat_map(|v| (Just(v), frame(v)))
    ) {
        let data = encode(&frame, version).unwrap();
        let mut out = Vec::new();
        decoder(Limits::default(), version).feed(&data, &mut out).unwrap();
        prop_assert_eq!(out.len(), 1);
        let Item::Frame(decoded) = out.pop().unwrap() else { panic!("not a frame") };
        prop_assert_eq!(decoded.wire.as_deref(), Some(&data[..]));
        prop_assert_eq!(RawFrame { wire: None, ..decoded }, decoded_form(&frame));
    }

    #[test]
    fn split_points_do_not_matter(
        (version, items, cuts) in versions().prop_flat_map(|v| (
            Just(v),
            prop::collection::vec(prop_oneof![
                frame(v).prop_map(Some),
                Just(None),
            ], 0..5),
            prop::collection::vec(0usize..2000, 0..10),
        ))
    ) {
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for item in &items {
            match item {
                Some(frame) => {
                    stream.extend(encode(frame, version).unwrap());
                    expected.push(Item::Frame(decoded_form(frame)));
                }
                None => {
                    stream.extend_from_slice(b"\r\n");
                    expected.push(Item::Heartbeat);
                }
            }
        }
        let (whole, error) = outcome(decoder(Limits::default(), version), &stream, &[]);
        prop_assert!(error.is_none());
        prop_assert_eq!(&without_wire(whole.clone()), &expected);
        let (split, error) = outcome(decoder(Limits::default(), version), &stream, &cuts);
        prop_assert!(error.is_none());
        prop_assert_eq!(split, whole);
    }

    #[test]
    fn arbitrary_bytes_only_fail_and_respect_the_limits(
        data in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(prop::sample::select(vec![
                &b"SEND"[..], b"MESSAGE", b"CONNECT", b"\n", b"\r\n", b"\r", b":", b"\\",
                b"\\c", b"\\t", b"\0", b"a", b"\xff", b"\xc3", b"content-length:", b"3",
                b"-", b" ", b"send",
            ]), 0..40).prop_map(|parts| parts.concat()),
        ],
        cuts in prop::collection::vec(0usize..300, 0..8),
        version in versions(),
        oversized in any::<bool>(),
    ) {
        let limits = Limits { max_frame_bytes: 120, max_header_count: 4, max_header_line_bytes: 20 };
        let make = || {
            let mut d = Decoder::with_commands(limits, &all_commands(), 8, version).unwrap();
            d.set_oversized(oversized);
            d
        };
        let (whole, whole_error) = outcome(make(), &data, &[]);
        let (split, split_error) = outcome(make(), &data, &cuts);
        // The same frames, and an error or not, however the input is split.
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(whole_error.is_some(), split_error.is_some());
        for item in &whole {
            if let Item::Frame(frame) = item {
                prop_assert!(frame.headers.len() <= limits.max_header_count);
                prop_assert!(frame.body.len() < limits.max_frame_bytes);
                if let Some(wire) = &frame.wire {
                    prop_assert!(wire.len() <= limits.max_frame_bytes);
                }
            }
        }
        // Nothing buffered beyond what a frame may hold.
        let mut d = make();
        let mut out = Vec::new();
        for chunk in data.chunks(7) {
            if d.feed(chunk, &mut out).is_err() {
                break;
            }
            prop_assert!(d.buffered() < limits.max_frame_bytes + 7);
        }
    }
}

#[test]
fn heartbeats_and_frames() {
    let mut out = Vec::new();
    let mut d = decoder(Limits::default(), Version::V12);
    d.feed(b"\n\r\n\nSEND\n\n1\0\nACK\nid:1\n\n\0", &mut out).unwrap();
    assert_eq!(out.len(), 6);
    assert_eq!(out[0], Item::Heartbeat);
    let Item::Frame(ack) = &out[5] else { panic!() };
    assert_eq!(ack.get("id"), Some("1"));
    assert_eq!(ack.wire.as_deref(), Some(&b"ACK\nid:1\n\n\0"[..]));
}

#[test]
fn server_and_client_decoders() {
    let mut out = Vec::new();
    let mut server = Decoder::new(Limits::default(), true, Version::V12);
    server.feed(b"MESSAGE\nmessage-id:ID\\c1\n\nhi\0", &mut out).unwrap();
    let Item::Frame(message) = &out[0] else { panic!() };
    assert_eq!(message.get("message-id"), Some("ID:1"));
    let error = server.feed(b"SEND\n\n\0", &mut out).unwrap_err();
    assert_eq!(error.reason, "unknown command");
    let mut client = Decoder::new(Limits::default(), false, Version::V10);
    let error = client.feed(b"MESSAGE\n\n\0", &mut out).unwrap_err();
    assert_eq!(error.reason, "unknown command");
}

#[test]
fn oversized_mode_hands_frames_on() {
    let limits = Limits { max_frame_bytes: 200, max_header_count: 4, max_header_line_bytes: 40 };
    let mut d = Decoder::new(limits, true, Version::V12);
    d.set_oversized(true);
    let mut data = b"MESSAGE\nack:big\ncontent-length:1000\n\n".to_vec();
    data.extend(vec![b'b'; 1000]);
    data.extend(b"\0\nMESSAGE\nack:after\n\nnext\0");
    let mut out = Vec::new();
    for chunk in data.chunks(7) {
        d.feed(chunk, &mut out).unwrap();
    }
    assert_eq!(d.buffered(), 0);
    let Item::Oversized(big) = &out[0] else { panic!("{out:?}") };
    assert_eq!((big.reason, big.body_kept, big.frame.get("ack")), ("frame too large", false, Some("big")));
    let Item::Frame(after) = out.last().unwrap() else { panic!() };
    assert_eq!(after.body, b"next");
}

#[test]
fn encode_refuses_what_a_version_cannot_carry() {
    let frame = RawFrame::new("SEND", vec![("k".into(), "a\nb".into())], Vec::new());
    assert_eq!(encode(&frame, Version::V10).unwrap_err().reason, "header not representable");
    assert_eq!(encode(&frame, Version::V12).unwrap(), b"SEND\nk:a\\nb\n\n\0");
    let bad = RawFrame::new("send", Vec::new(), Vec::new());
    assert_eq!(encode(&bad, Version::V12).unwrap_err().reason, "bad command");
}
