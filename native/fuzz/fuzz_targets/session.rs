//! A native session fed arbitrary client bytes, a scripted broker and guard around it
//! (`mqguard_native::session::script`): it must never panic nor hang, must always end
//! with an ERROR as its client's last frame or cleanly, and must write only well-formed
//! frames to either peer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqguard_native::session::script::{run, Answer, Script};
use mqguard_native::stomp::Version;

const CONNECT: &[u8] = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0";

fuzz_target!(|input: &[u8]| {
    // The first octets choose the setting; the rest is the client's bytes, and after the
    // last 0xFF (when flagged) what the broker writes on its own once connected.
    let [flags, step, stop, fails, data @ ..] = input else { return };
    let (client, noise) = match data.iter().rposition(|&octet| octet == 0xFF) {
        Some(at) if flags & 0x40 != 0 => (&data[..at], &data[at + 1..]),
        _ => (data, &[][..]),
    };
    let mut bytes = if flags & 0x80 != 0 { CONNECT.to_vec() } else { Vec::new() };
    bytes.extend_from_slice(client);
    let script = Script {
        client: bytes,
        step: usize::from(*step).max(1),
        tight: flags & 1 != 0,
        stop_after: (*stop != 0).then_some(usize::from(*stop)),
        client_eof: flags & 2 != 0,
        answer: match (flags >> 2) & 3 {
            0 => Answer::Refuse,
            1 => Answer::Connected(Version::V10),
            2 => Answer::Connected(Version::V11),
            _ => Answer::Connected(Version::V12),
        },
        broker_noise: noise.to_vec(),
        oversized: flags & 0x10 != 0,
        guard_fails_at: (flags & 0x20 != 0 && *fails != 0).then_some(usize::from(*fails)),
        // The fail counter's high bits: what the guard lets the session do alone.
        bypass: u64::from(*fails >> 5),
    };
    if let Err(broken) = run(&script) {
        panic!("{broken}\n{script:?}");
    }
});
