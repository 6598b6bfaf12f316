//! What went wrong in a packet, with the MQTT 5 reason code a server answers with.

use std::fmt;

/// A decoding or encoding error. `kind` is one of `malformed`, `protocol`,
/// `too-large`, `unsupported-version`; `detail` names the field and never holds a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqttError {
    pub kind: &'static str,
    pub detail: String,
}

impl MqttError {
    pub fn malformed(detail: impl Into<String>) -> MqttError {
        MqttError { kind: "malformed", detail: detail.into() }
    }

    pub fn protocol(detail: impl Into<String>) -> MqttError {
        MqttError { kind: "protocol", detail: detail.into() }
    }

    pub fn too_large(detail: impl Into<String>) -> MqttError {
        MqttError { kind: "too-large", detail: detail.into() }
    }

    pub fn version(detail: impl Into<String>) -> MqttError {
        MqttError { kind: "unsupported-version", detail: detail.into() }
    }

    /// The MQTT 5 reason code for a CONNACK or DISCONNECT answering this error.
    pub fn reason_code(&self) -> u8 {
        match self.kind {
            "malformed" => 0x81,
            "too-large" => 0x95,
            "unsupported-version" => 0x84,
            _ => 0x82,
        }
    }
}

impl fmt::Display for MqttError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} packet: {}", self.kind, self.detail)
    }
}

impl std::error::Error for MqttError {}
