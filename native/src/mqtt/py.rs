//! The codec's Python face: `MqttDecoder`, `MqttPacket`, `MqttError` and builders.
//!
//! Packets cross into Python as `MqttPacket` objects wrapping the Rust packet: fields
//! are read through properties (absent ones read as `None`), `encode()` gives the wire
//! octets, and `repr()` never shows a credential.

use pyo3::create_exception;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::decode::{Decoder, Limits};
use super::encode::encode_to_vec;
use super::error::MqttError;
use super::packet::{Ack, Connect, Packet, Publish, Reasoned, Subscribe, Version, Will};
use super::props::{int_property, prop_id, prop_name, typed_value, user_properties, Given, PropValue, Properties, MESSAGE_EXPIRY};

create_exception!(mqguard_native, MqttCodecError, PyValueError, "A malformed, over-limit or unsupported MQTT packet.");

fn py_error(py: Python<'_>, error: &MqttError) -> PyErr {
    let err = MqttCodecError::new_err(error.to_string());
    let value = err.value(py);
    let _ = value.setattr("kind", error.kind);
    let _ = value.setattr("detail", &error.detail);
    let _ = value.setattr("reason_code", error.reason_code());
    err
}

fn parse_version(version: &str) -> PyResult<Version> {
    match version {
        "3.1.1" | "4" => Ok(Version::V311),
        "5" | "5.0" => Ok(Version::V5),
        other => Err(PyValueError::new_err(format!("unknown MQTT version {other:?}; expected '3.1.1' or '5'"))),
    }
}

fn value_to_py(py: Python<'_>, value: &PropValue) -> PyResult<Py<PyAny>> {
    Ok(match value {
        PropValue::Byte(v) => v.into_pyobject(py)?.into_any().unbind(),
        PropValue::U16(v) => v.into_pyobject(py)?.into_any().unbind(),
        PropValue::U32(v) | PropValue::VarInt(v) => v.into_pyobject(py)?.into_any().unbind(),
        PropValue::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        PropValue::Bin(b) => PyBytes::new(py, b).into_any().unbind(),
        PropValue::Pair(k, v) => PyTuple::new(py, [k, v])?.into_any().unbind(),
    })
}

fn props_to_py(py: Python<'_>, props: &[super::props::Property]) -> PyResult<Py<PyList>> {
    let list = PyList::empty(py);
    for prop in props {
        let name = prop_name(prop.id).unwrap_or("unknown");
        list.append((name, value_to_py(py, &prop.value)?))?;
    }
    Ok(list.unbind())
}

/// Properties from `(name, value)` pairs; a user property's value is a `(name, value)` pair.
fn props_from_py(items: Option<&Bound<'_, PyAny>>) -> PyResult<Properties> {
    let mut props = Vec::new();
    let Some(items) = items else { return Ok(props) };
    if items.is_none() {
        return Ok(props);
    }
    for item in items.try_iter()? {
        let (name, value): (String, Bound<'_, PyAny>) = item?.extract()?;
        let id = prop_id(&name).ok_or_else(|| PyValueError::new_err(format!("unknown MQTT 5 property {name:?}")))?;
        let given = if let Ok(v) = value.extract::<u64>() {
            Given::Int(v)
        } else if let Ok(s) = value.extract::<String>() {
            Given::Str(s)
        } else if let Ok(b) = value.cast::<PyBytes>() {
            Given::Bin(b.as_bytes().to_vec())
        } else if let Ok((k, v)) = value.extract::<(String, String)>() {
            Given::Pair(k, v)
        } else {
            return Err(PyTypeError::new_err(format!("property {name}: unsupported value type")));
        };
        props.push(super::props::Property { id, value: typed_value(id, given).map_err(PyValueError::new_err)? });
    }
    Ok(props)
}

/// One decoded or built MQTT control packet.
#[pyclass(module = "mqguard_native", name = "MqttPacket", frozen)]
pub struct PyMqttPacket {
    packet: Packet,
    version: Version,
}

impl PyMqttPacket {
    fn properties_ref(&self) -> Option<&Properties> {
        match &self.packet {
            Packet::Connect(c) => Some(&c.properties),
            Packet::ConnAck(c) => Some(&c.properties),
            Packet::Publish(p) => Some(&p.properties),
            Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => a.properties.as_ref(),
            Packet::Subscribe(s) => Some(&s.properties),
            Packet::SubAck(a) | Packet::UnsubAck(a) => Some(&a.properties),
            Packet::Unsubscribe(u) => Some(&u.properties),
            Packet::Disconnect(r) | Packet::Auth(r) => r.properties.as_ref(),
            Packet::PingReq | Packet::PingResp => None,
        }
    }

    fn connect(&self) -> Option<&Connect> {
        match &self.packet {
            Packet::Connect(c) => Some(c),
            _ => None,
        }
    }

    fn publish(&self) -> Option<&Publish> {
        match &self.packet {
            Packet::Publish(p) => Some(p),
            _ => None,
        }
    }

    fn will(&self) -> Option<&Will> {
        self.connect().and_then(|c| c.will.as_ref())
    }
}

#[pymethods]
impl PyMqttPacket {
    /// The control packet type: "CONNECT", "PUBLISH", ...
    #[getter(r#type)]
    fn kind(&self) -> &'static str {
        self.packet.name()
    }

    #[getter]
    fn version(&self) -> &'static str {
        self.version.name()
    }

    #[getter]
    fn packet_id(&self) -> Option<u16> {
        match &self.packet {
            Packet::Publish(p) => p.packet_id,
            Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => Some(a.packet_id),
            Packet::Subscribe(s) => Some(s.packet_id),
            Packet::SubAck(a) | Packet::UnsubAck(a) => Some(a.packet_id),
            Packet::Unsubscribe(u) => Some(u.packet_id),
            _ => None,
        }
    }

    #[getter]
    fn qos(&self) -> Option<u8> {
        self.publish().map(|p| p.qos)
    }

    #[getter]
    fn dup(&self) -> Option<bool> {
        self.publish().map(|p| p.dup)
    }

    #[getter]
    fn retain(&self) -> Option<bool> {
        self.publish().map(|p| p.retain)
    }

    #[getter]
    fn topic(&self) -> Option<&str> {
        self.publish().map(|p| p.topic.as_str())
    }

    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.publish().map(|p| PyBytes::new(py, &p.payload))
    }

    /// `(name, value)` pairs in wire order; `None` where the packet has no property section.
    #[getter]
    fn properties(&self, py: Python<'_>) -> PyResult<Option<Py<PyList>>> {
        self.properties_ref().map(|p| props_to_py(py, p)).transpose()
    }

    #[getter]
    fn user_properties(&self) -> Vec<(String, String)> {
        let props = self.properties_ref().map(|p| user_properties(p)).unwrap_or_default();
        props.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }

    #[getter]
    fn message_expiry_interval(&self) -> Option<u32> {
        self.properties_ref().and_then(|p| int_property(p, MESSAGE_EXPIRY))
    }

    /// The reason code (MQTT 5) or CONNACK return code; `None` where it was left out.
    #[getter]
    fn reason_code(&self) -> Option<u8> {
        match &self.packet {
            Packet::ConnAck(c) => Some(c.code),
            Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => a.reason,
            Packet::Disconnect(r) | Packet::Auth(r) => r.reason,
            _ => None,
        }
    }

    #[getter]
    fn session_present(&self) -> Option<bool> {
        match &self.packet {
            Packet::ConnAck(c) => Some(c.session_present),
            _ => None,
        }
    }

    #[getter]
    fn client_id(&self) -> Option<&str> {
        self.connect().map(|c| c.client_id.as_str())
    }

    #[getter]
    fn clean_start(&self) -> Option<bool> {
        self.connect().map(|c| c.clean_start)
    }

    #[getter]
    fn keep_alive(&self) -> Option<u16> {
        self.connect().map(|c| c.keep_alive)
    }

    #[getter]
    fn username(&self) -> Option<&str> {
        self.connect().and_then(|c| c.username.as_deref())
    }

    #[getter]
    fn password<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.connect().and_then(|c| c.password.as_deref()).map(|p| PyBytes::new(py, p))
    }

    #[getter]
    fn will_topic(&self) -> Option<&str> {
        self.will().map(|w| w.topic.as_str())
    }

    #[getter]
    fn will_payload<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.will().map(|w| PyBytes::new(py, &w.payload))
    }

    #[getter]
    fn will_qos(&self) -> Option<u8> {
        self.will().map(|w| w.qos)
    }

    #[getter]
    fn will_retain(&self) -> Option<bool> {
        self.will().map(|w| w.retain)
    }

    /// SUBSCRIBE: `(filter, options)`; UNSUBSCRIBE: `(filter, 0)`.
    #[getter]
    fn filters(&self) -> Option<Vec<(String, u8)>> {
        match &self.packet {
            Packet::Subscribe(s) => Some(s.filters.clone()),
            Packet::Unsubscribe(u) => Some(u.filters.iter().map(|f| (f.clone(), 0)).collect()),
            _ => None,
        }
    }

    /// SUBACK / UNSUBACK return or reason codes.
    #[getter]
    fn codes(&self) -> Option<Vec<u8>> {
        match &self.packet {
            Packet::SubAck(a) | Packet::UnsubAck(a) => Some(a.codes.clone()),
            _ => None,
        }
    }

    fn encode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let octets = encode_to_vec(&self.packet, self.version).map_err(|e| py_error(py, &e))?;
        Ok(PyBytes::new(py, &octets))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyMqttPacket>() {
            Ok(other) => {
                let other = other.get();
                other.packet == self.packet && other.version == self.version
            }
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> String {
        format!("MqttPacket(version={:?}, {:?})", self.version.name(), self.packet)
    }
}

fn wrap(py: Python<'_>, packet: Packet, version: Version) -> PyResult<Py<PyMqttPacket>> {
    Py::new(py, PyMqttPacket { packet, version })
}

/// A streaming decoder for one direction of one connection.
#[pyclass(module = "mqguard_native", name = "MqttDecoder")]
pub struct PyMqttDecoder {
    decoder: Decoder,
}

#[pymethods]
impl PyMqttDecoder {
    #[new]
    #[pyo3(signature = (version = None, *, max_packet_bytes = None, max_properties = None, max_property_bytes = None, max_filters = None))]
    fn new(
        version: Option<&str>,
        max_packet_bytes: Option<usize>,
        max_properties: Option<usize>,
        max_property_bytes: Option<usize>,
        max_filters: Option<usize>,
    ) -> PyResult<Self> {
        let d = Limits::default();
        let limits = Limits {
            max_packet_bytes: max_packet_bytes.unwrap_or(d.max_packet_bytes),
            max_properties: max_properties.unwrap_or(d.max_properties),
            max_property_bytes: max_property_bytes.unwrap_or(d.max_property_bytes),
            max_filters: max_filters.unwrap_or(d.max_filters),
        };
        let version = version.map(parse_version).transpose()?;
        Ok(PyMqttDecoder { decoder: Decoder::new(limits, version) })
    }

    /// The protocol version: given, or learnt from a decoded CONNECT.
    #[getter]
    fn get_version(&self) -> Option<&'static str> {
        self.decoder.version().map(Version::name)
    }

    #[setter]
    fn set_version(&mut self, version: Option<&str>) -> PyResult<()> {
        self.decoder.set_version(version.map(parse_version).transpose()?);
        Ok(())
    }

    #[getter]
    fn buffered(&self) -> usize {
        self.decoder.buffered()
    }

    /// Decodes what `data` completes. On error the packets decoded before it are in
    /// the exception's `packets`.
    fn feed(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Vec<Py<PyMqttPacket>>> {
        let mut out = Vec::new();
        let result = self.decoder.feed(data, &mut out);
        let mut packets = Vec::with_capacity(out.len());
        let mut version = self.decoder.version();
        for packet in out {
            if let Packet::Connect(c) = &packet {
                version = Some(c.version);
            }
            packets.push(wrap(py, packet, version.unwrap_or(Version::V5))?);
        }
        match result {
            Ok(()) => Ok(packets),
            Err(error) => {
                let err = py_error(py, &error);
                err.value(py).setattr("packets", packets)?;
                Err(err)
            }
        }
    }
}

fn ack_type(kind: &str, ack: Ack) -> PyResult<Packet> {
    Ok(match kind {
        "PUBACK" => Packet::PubAck(ack),
        "PUBREC" => Packet::PubRec(ack),
        "PUBREL" => Packet::PubRel(ack),
        "PUBCOMP" => Packet::PubComp(ack),
        other => return Err(PyValueError::new_err(format!("{other:?} is not PUBACK, PUBREC, PUBREL or PUBCOMP"))),
    })
}

/// Builds a PUBLISH.
#[pyfunction]
#[pyo3(signature = (topic, payload, *, qos = 0, packet_id = None, dup = false, retain = false, properties = None, version = "5"))]
#[allow(clippy::too_many_arguments)]
fn mqtt_publish(
    py: Python<'_>,
    topic: String,
    payload: Vec<u8>,
    qos: u8,
    packet_id: Option<u16>,
    dup: bool,
    retain: bool,
    properties: Option<&Bound<'_, PyAny>>,
    version: &str,
) -> PyResult<Py<PyMqttPacket>> {
    let properties = props_from_py(properties)?;
    let packet = Packet::Publish(Publish { dup, qos, retain, topic, packet_id, properties, payload });
    wrap(py, packet, parse_version(version)?)
}

/// Builds a CONNECT.
#[pyfunction]
#[pyo3(signature = (client_id, *, version = "5", clean_start = true, keep_alive = 60, username = None, password = None, will = None, properties = None))]
#[allow(clippy::too_many_arguments)]
fn mqtt_connect(
    py: Python<'_>,
    client_id: String,
    version: &str,
    clean_start: bool,
    keep_alive: u16,
    username: Option<String>,
    password: Option<Vec<u8>>,
    will: Option<&Bound<'_, PyDict>>,
    properties: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyMqttPacket>> {
    let version = parse_version(version)?;
    let will = match will {
        None => None,
        Some(w) => {
            let get = |key: &str| w.get_item(key);
            let topic: String = get("topic")?.ok_or_else(|| PyValueError::new_err("will needs a 'topic'"))?.extract()?;
            let payload: Vec<u8> = get("payload")?.map(|v| v.extract()).transpose()?.unwrap_or_default();
            let qos: u8 = get("qos")?.map(|v| v.extract()).transpose()?.unwrap_or(0);
            let retain: bool = get("retain")?.map(|v| v.extract()).transpose()?.unwrap_or(false);
            let properties = props_from_py(get("properties")?.as_ref())?;
            Some(Will { qos, retain, properties, topic, payload })
        }
    };
    let properties = props_from_py(properties)?;
    let connect = Connect { version, clean_start, keep_alive, properties, client_id, will, username, password };
    wrap(py, Packet::Connect(connect), version)
}

/// Builds a PUBACK, PUBREC, PUBREL or PUBCOMP.
#[pyfunction]
#[pyo3(signature = (kind, packet_id, *, reason_code = None, properties = None, version = "5"))]
fn mqtt_ack(
    py: Python<'_>,
    kind: &str,
    packet_id: u16,
    reason_code: Option<u8>,
    properties: Option<&Bound<'_, PyAny>>,
    version: &str,
) -> PyResult<Py<PyMqttPacket>> {
    let properties = match properties {
        Some(p) if !p.is_none() => Some(props_from_py(Some(p))?),
        _ => None,
    };
    let packet = ack_type(kind, Ack { packet_id, reason: reason_code, properties })?;
    wrap(py, packet, parse_version(version)?)
}

/// Builds a SUBSCRIBE from `(filter, options)` pairs.
#[pyfunction]
#[pyo3(signature = (packet_id, filters, *, properties = None, version = "5"))]
fn mqtt_subscribe(
    py: Python<'_>,
    packet_id: u16,
    filters: Vec<(String, u8)>,
    properties: Option<&Bound<'_, PyAny>>,
    version: &str,
) -> PyResult<Py<PyMqttPacket>> {
    let properties = props_from_py(properties)?;
    wrap(py, Packet::Subscribe(Subscribe { packet_id, properties, filters }), parse_version(version)?)
}

/// Builds a PINGREQ, PINGRESP or a DISCONNECT without reason code.
#[pyfunction]
#[pyo3(signature = (kind, *, version = "5"))]
fn mqtt_simple(py: Python<'_>, kind: &str, version: &str) -> PyResult<Py<PyMqttPacket>> {
    let packet = match kind {
        "PINGREQ" => Packet::PingReq,
        "PINGRESP" => Packet::PingResp,
        "DISCONNECT" => Packet::Disconnect(Reasoned { reason: None, properties: None }),
        other => return Err(PyValueError::new_err(format!("{other:?} is not PINGREQ, PINGRESP or DISCONNECT"))),
    };
    wrap(py, packet, parse_version(version)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMqttPacket>()?;
    m.add_class::<PyMqttDecoder>()?;
    m.add("MqttCodecError", m.py().get_type::<MqttCodecError>())?;
    m.add_function(wrap_pyfunction!(mqtt_publish, m)?)?;
    m.add_function(wrap_pyfunction!(mqtt_connect, m)?)?;
    m.add_function(wrap_pyfunction!(mqtt_ack, m)?)?;
    m.add_function(wrap_pyfunction!(mqtt_subscribe, m)?)?;
    m.add_function(wrap_pyfunction!(mqtt_simple, m)?)?;
    Ok(())
}
