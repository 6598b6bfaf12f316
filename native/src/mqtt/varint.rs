//! Variable-byte integers: 7 bits an octet, low group first, at most four octets.

use super::error::MqttError;

/// The largest value four octets hold.
pub const MAX_VARINT: u32 = 268_435_455;

/// Reads a variable-byte integer at the start of `data`: `Ok(None)` while incomplete,
/// else the value and its length. A non-minimal encoding is malformed (the specs require
/// the fewest octets), which keeps re-encoding byte-exact.
pub fn read_varint(data: &[u8]) -> Result<Option<(u32, usize)>, MqttError> {
    let mut value: u32 = 0;
    for (i, &byte) in data.iter().enumerate().take(4) {
        value |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(MqttError::malformed("variable-byte integer not in its shortest form"));
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if data.len() >= 4 {
        return Err(MqttError::malformed("variable-byte integer longer than four octets"));
    }
    Ok(None)
}

/// Appends `value` (at most [`MAX_VARINT`]) in its shortest form.
pub fn write_varint(mut value: u32, out: &mut Vec<u8>) -> Result<(), MqttError> {
    if value > MAX_VARINT {
        return Err(MqttError::too_large(format!("{value} exceeds the variable-byte integer maximum {MAX_VARINT}")));
    }
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return Ok(());
        }
        out.push(byte | 0x80);
    }
}

/// The number of octets `value` takes.
pub fn varint_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_table_boundaries() {
        // MQTT 5.0 table 1-1 / 3.1.1 table 2.4.
        let cases: [(u32, &[u8]); 8] = [
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (16_383, &[0xff, 0x7f]),
            (16_384, &[0x80, 0x80, 0x01]),
            (2_097_151, &[0xff, 0xff, 0x7f]),
            (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
            (268_435_455, &[0xff, 0xff, 0xff, 0x7f]),
        ];
        for (value, octets) in cases {
            let mut out = Vec::new();
            write_varint(value, &mut out).unwrap();
            assert_eq!(out, octets);
            assert_eq!(varint_len(value), octets.len());
            assert_eq!(read_varint(octets).unwrap(), Some((value, octets.len())));
        }
    }

    #[test]
    fn rejects_long_and_padded_forms() {
        assert_eq!(read_varint(&[0x80, 0x80]).unwrap(), None);
        assert!(read_varint(&[0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
        assert!(read_varint(&[0x80, 0x00]).is_err());
        assert!(write_varint(MAX_VARINT + 1, &mut Vec::new()).is_err());
    }
}
