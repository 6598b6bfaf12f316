//! The codec's Python face: `Frame`, `Oversized`, `FrameDecoder` and the encoders.
//!
//! `mqguard.sidecar.frames` re-exports them and registers, once at import, the Python
//! objects the codec hands out: its `FrameError` class (an `MqguardError`), the
//! `HEARTBEAT` sentinel and the default `FrameLimits`.

use std::borrow::Cow;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PySlice, PyString, PyTuple};

use super::decode::Decoder;
use super::encode::{encode_checked as encode_checked_into, encode_parts, HeaderText};
use super::frame::{FrameError, Item, RawFrame, Version, CLIENT_COMMANDS, SERVER_COMMANDS};
use super::limits::Limits;
use super::adapter::{encode_send as encode_send_into, parse_head, split_received};
use super::wire::without_header_line;

/// The Python objects registered by `init_codec`.
struct Registry {
    frame_error: Py<PyAny>,
    heartbeat: Py<PyAny>,
    default_limits: Py<PyAny>,
}

static REGISTRY: PyOnceLock<Registry> = PyOnceLock::new();
/// The commands as Python strings, made once: every decoded frame shares them.
static COMMANDS: PyOnceLock<Vec<(&'static str, Py<PyString>)>> = PyOnceLock::new();
static EMPTY_BYTES: PyOnceLock<Py<PyBytes>> = PyOnceLock::new();

const VERSIONS_TEXT: &str = "('1.0', '1.1', '1.2')";

fn registry(py: Python<'_>) -> PyResult<&Registry> {
    if REGISTRY.get(py).is_none() {
        // Importing the Python codec module registers its objects.
        py.import("mqguard.sidecar.frames")?;
    }
    REGISTRY
        .get(py)
        .ok_or_else(|| PyRuntimeError::new_err("mqguard_native.init_codec() was not called"))
}

/// Registers the Python objects the codec hands out (once; later calls are ignored).
#[pyfunction]
fn init_codec(
    py: Python<'_>,
    frame_error: Py<PyAny>,
    heartbeat: Py<PyAny>,
    default_limits: Py<PyAny>,
) {
    let _ = REGISTRY.set(py, Registry { frame_error, heartbeat, default_limits });
}

/// The Python `FrameError` for `error`, with `frames` (what was decoded before it).
fn py_error(py: Python<'_>, error: &FrameError, frames: Option<Bound<'_, PyList>>) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let class = registry(py)?.frame_error.bind(py);
        let kwargs = PyDict::new(py);
        kwargs.set_item("detail", &error.detail)?;
        let exc = class.call((error.reason,), Some(&kwargs))?;
        if let Some(frames) = frames {
            exc.setattr("frames", frames)?;
        }
        Ok(PyErr::from_value(exc))
    };
    make().unwrap_or_else(|err| err)
}

fn command_string(py: Python<'_>, command: &str) -> Py<PyString> {
    let known = COMMANDS.get_or_init(py, || {
        CLIENT_COMMANDS
            .iter()
            .chain(SERVER_COMMANDS.iter())
            .map(|&c| (c, PyString::intern(py, c).unbind()))
            .collect()
    });
    match known.iter().find(|(c, _)| *c == command) {
        Some((_, string)) => string.clone_ref(py),
        None => PyString::new(py, command).unbind(),
    }
}

fn empty_bytes(py: Python<'_>) -> Py<PyAny> {
    EMPTY_BYTES.get_or_init(py, || PyBytes::new(py, b"").unbind()).clone_ref(py).into_any()
}

fn parse_version(version: &Bound<'_, PyAny>) -> PyResult<Version> {
    if let Ok(text) = version.cast::<PyString>() {
        if let Some(parsed) = Version::parse(text.to_str()?) {
            return Ok(parsed);
        }
    }
    Err(PyValueError::new_err(format!(
        "unknown STOMP version {}; expected one of {VERSIONS_TEXT}",
        version.repr()?
    )))
}

/// The octets of a bytes-like object (copied unless it is `bytes`).
fn octets<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, [u8]>> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(Cow::Borrowed(bytes.as_bytes()));
    }
    if let Ok(array) = data.cast::<PyByteArray>() {
        return Ok(Cow::Owned(array.to_vec()));
    }
    let copied = data.py().get_type::<PyBytes>().call1((data,))?;
    Ok(Cow::Owned(copied.cast_into::<PyBytes>()?.as_bytes().to_vec()))
}

fn headers_list<'py>(py: Python<'py>, headers: Option<&Bound<'py, PyAny>>) -> PyResult<Py<PyList>> {
    match headers {
        None => Ok(PyList::empty(py).unbind()),
        Some(headers) if headers.is_none() => Ok(PyList::empty(py).unbind()),
        Some(headers) => match headers.cast::<PyList>() {
            Ok(list) => Ok(list.clone().unbind()),
            Err(_) => Ok(PyList::new(py, headers.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.unbind()),
        },
    }
}

/// One `(name, value)` item of a header list.
fn header_pair<'py>(item: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    if let Ok(tuple) = item.cast::<PyTuple>() {
        if tuple.len() == 2 {
            return Ok((tuple.get_item(0)?, tuple.get_item(1)?));
        }
    }
    item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()
}

fn str_of<'a>(value: &'a Bound<'_, PyAny>) -> PyResult<(Cow<'a, str>, bool)> {
    let text = value
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("a STOMP header must be str, got {}", value.get_type().name().map(|n| n.to_string()).unwrap_or_default())))?;
    Ok(match text.to_str() {
        Ok(text) => (Cow::Borrowed(text), false),
        Err(_) => (text.to_string_lossy(), true),
    })
}

/// Encodes Python headers: the shared path of every encoder.
fn encode_py(
    py: Python<'_>,
    command: &Bound<'_, PyAny>,
    headers: &Bound<'_, PyAny>,
    body: &[u8],
    version: Version,
    escaped: Option<bool>,
) -> PyResult<Py<PyBytes>> {
    let mut pairs = Vec::new();
    if let Ok(list) = headers.cast::<PyList>() {
        pairs.reserve(list.len());
        for item in list.iter() {
            pairs.push(header_pair(&item)?);
        }
    } else {
        for item in headers.try_iter()? {
            pairs.push(header_pair(&item?)?);
        }
    }
    encode_pairs(py, command, &pairs, body, version, escaped)
}

/// Encodes `(name, value)` pairs of Python objects.
fn encode_pairs(
    py: Python<'_>,
    command: &Bound<'_, PyAny>,
    pairs: &[(Bound<'_, PyAny>, Bound<'_, PyAny>)],
    body: &[u8],
    version: Version,
    escaped: Option<bool>,
) -> PyResult<Py<PyBytes>> {
    let (command, _) = str_of(command)?;
    let mut texts = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        texts.push((str_of(name)?, str_of(value)?));
    }
    let iter = texts.iter().map(|((name, name_lossy), (value, value_lossy))| {
        (
            HeaderText { text: name, lossy: *name_lossy },
            HeaderText { text: value, lossy: *value_lossy },
        )
    });
    let mut out = Vec::with_capacity(body.len() + 64 + 48 * texts.len());
    let result = match escaped {
        None => encode_parts(&command, iter, body, version, &mut out),
        Some(escaped) => encode_checked_into(&command, iter, body, version, escaped, &mut out),
    };
    match result {
        Ok(()) => Ok(PyBytes::new(py, &out).unbind()),
        Err(error) => Err(py_error(py, &error, None)),
    }
}

/// One STOMP frame. `headers` keeps wire order; a name may repeat (first one wins).
///
/// `wire`: the octets the frame was decoded from (command to NUL), kept by the decoder
/// for frames up to MAX_WIRE_KEPT, or None. `set` and `remove` drop it, so `wire_of`
/// never returns stale octets as long as the headers of a decoded frame are changed
/// through them (code that edits `headers` or `body` directly must set `wire` to None
/// itself). Not part of equality.
#[pyclass(module = "mqguard_native", name = "Frame")]
pub struct PyFrame {
    command: Py<PyString>,
    headers: Py<PyList>,
    body: Py<PyAny>,
    wire: Option<Py<PyAny>>,
}

impl PyFrame {
    fn from_raw(py: Python<'_>, frame: RawFrame) -> PyResult<PyFrame> {
        let headers = PyList::empty(py);
        for (name, value) in &frame.headers {
            let pair = PyTuple::new(py, [PyString::new(py, name), PyString::new(py, value)])?;
            headers.append(pair)?;
        }
        let body = if frame.body.is_empty() {
            empty_bytes(py)
        } else {
            PyBytes::new(py, &frame.body).into_any().unbind()
        };
        Ok(PyFrame {
            command: command_string(py, &frame.command),
            headers: headers.unbind(),
            body,
            wire: frame.wire.map(|wire| PyBytes::new(py, &wire).into_any().unbind()),
        })
    }

        /// Replaces the header list's items in place (callers may hold the list).
    fn replace_headers(&self, py: Python<'_>, kept: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let kept = PyList::new(py, kept)?;
        self.headers.bind(py).as_any().set_item(PySlice::full(py), kept)?;
        Ok(())
    }

    fn encode_with(&self, py: Python<'_>, version: Version) -> PyResult<Py<PyBytes>> {
        let body = self.body.bind(py);
        let body = octets(body)?;
        encode_py(py, self.command.bind(py).as_any(), self.headers.bind(py).as_any(), &body, version, None)
    }
}

#[pymethods]
impl PyFrame {
    #[new]
    #[pyo3(signature = (command, headers = None, body = None, wire = None))]
    fn new(
        py: Python<'_>,
        command: Bound<'_, PyString>,
        headers: Option<&Bound<'_, PyAny>>,
        body: Option<Py<PyAny>>,
        wire: Option<Py<PyAny>>,
    ) -> PyResult<PyFrame> {
        Ok(PyFrame {
            command: command.unbind(),
            headers: headers_list(py, headers)?,
            body: body.unwrap_or_else(|| empty_bytes(py)),
            wire: wire.filter(|w| !w.is_none(py)),
        })
    }

    #[getter]
    fn command(&self, py: Python<'_>) -> Py<PyString> {
        self.command.clone_ref(py)
    }

    #[setter]
    fn set_command(&mut self, command: Bound<'_, PyString>) {
        self.command = command.unbind();
    }

    #[getter]
    fn headers(&self, py: Python<'_>) -> Py<PyList> {
        self.headers.clone_ref(py)
    }

    #[setter]
    fn set_headers(&mut self, py: Python<'_>, headers: Bound<'_, PyAny>) -> PyResult<()> {
        self.headers = headers_list(py, Some(&headers))?;
        Ok(())
    }

    #[getter]
    fn body(&self, py: Python<'_>) -> Py<PyAny> {
        self.body.clone_ref(py)
    }

    #[setter]
    fn set_body(&mut self, body: Py<PyAny>) {
        self.body = body;
    }

    #[getter]
    fn wire(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.wire.as_ref().map(|w| w.clone_ref(py))
    }

    #[setter]
    fn set_wire(&mut self, py: Python<'_>, wire: Option<Py<PyAny>>) {
        self.wire = wire.filter(|w| !w.is_none(py));
    }

    /// Value of the first header called `name` (the spec's rule for repeats).
    #[pyo3(signature = (name, default = None))]
    fn get(&self, py: Python<'_>, name: &Bound<'_, PyAny>, default: Option<Py<PyAny>>) -> PyResult<Option<Py<PyAny>>> {
        let wanted = name.cast::<PyString>().ok().and_then(|s| s.to_str().ok());
        for item in self.headers.bind(py).iter() {
            let (key, value) = header_pair(&item)?;
            let hit = match (wanted, key.cast::<PyString>()) {
                (Some(wanted), Ok(key)) => key.to_str().map(|k| k == wanted).unwrap_or(false),
                _ => key.eq(name)?,
            };
            if hit {
                return Ok(Some(value.unbind()));
            }
        }
        Ok(default)
    }

    /// Replace the first `name` in place and drop its repeats; append if absent.
    fn set(&mut self, py: Python<'_>, name: Bound<'_, PyAny>, value: Bound<'_, PyAny>) -> PyResult<()> {
        let mut kept = Vec::new();
        let mut found = false;
        for item in self.headers.bind(py).iter() {
            let (key, _) = header_pair(&item)?;
            if !key.eq(&name)? {
                kept.push(item);
            } else if !found {
                kept.push(PyTuple::new(py, [&name, &value])?.into_any());
                found = true;
            }
        }
        if !found {
            kept.push(PyTuple::new(py, [&name, &value])?.into_any());
        }
        self.replace_headers(py, kept)?;
        self.wire = None;
        Ok(())
    }

    /// Remove every header called `name` (from `wire` too, when that is simple).
    fn remove(&mut self, py: Python<'_>, name: Bound<'_, PyAny>) -> PyResult<()> {
        let headers = self.headers.bind(py);
        let total = headers.len();
        let mut kept = Vec::with_capacity(total);
        let mut value = None;
        for item in headers.iter() {
            let (key, val) = header_pair(&item)?;
            if key.eq(&name)? {
                value = Some(val);
            } else {
                kept.push(item);
            }
        }
        let removed = total - kept.len();
        if removed == 0 {
            return Ok(());
        }
        if let Some(wire) = self.wire.take() {
            let wire_bytes = octets(wire.bind(py))?;
            let name_text = name.cast::<PyString>().ok().and_then(|s| s.to_str().ok());
            let value_text = if removed == 1 {
                value.as_ref().and_then(|v| v.cast::<PyString>().ok().and_then(|s| s.to_str().ok().map(str::to_owned)))
            } else {
                None
            };
            let body_len = self.body.bind(py).len()?;
            self.wire = name_text
                .and_then(|name| without_header_line(&wire_bytes, name, value_text.as_deref(), body_len))
                .map(|cut| PyBytes::new(py, &cut).into_any().unbind());
        }
        self.replace_headers(py, kept)?;
        Ok(())
    }

    /// Headers as a dict, first occurrence of each name winning, wire order kept.
    fn header_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for item in self.headers.bind(py).iter() {
            let (key, value) = header_pair(&item)?;
            if !dict.contains(&key)? {
                dict.set_item(key, value)?;
            }
        }
        Ok(dict)
    }

    fn __richcmp__(&self, py: Python<'_>, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<PyFrame>() else {
            return Ok(py.NotImplemented());
        };
        let equal = {
            let other = other.borrow();
            self.command.bind(py).as_any().eq(other.command.bind(py))?
                && self.headers.bind(py).as_any().eq(other.headers.bind(py))?
                && self.body.bind(py).eq(other.body.bind(py))?
        };
        Ok(match op {
            CompareOp::Eq => equal.into_pyobject(py)?.to_owned().into_any().unbind(),
            CompareOp::Ne => (!equal).into_pyobject(py)?.to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        })
    }

    /// Copies and pickles as `Frame(command, headers, body, wire)`.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.borrow();
        let wire = this.wire.as_ref().map_or_else(|| py.None(), |w| w.clone_ref(py));
        let args = PyTuple::new(
            py,
            [
                this.command.clone_ref(py).into_any(),
                this.headers.clone_ref(py).into_any(),
                this.body.clone_ref(py),
                wire,
            ],
        )?;
        PyTuple::new(py, [slf.get_type().into_any(), args.into_any()])
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Frame(command={}, headers={}, body={})",
            self.command.bind(py).repr()?,
            self.headers.bind(py).repr()?,
            self.body.bind(py).repr()?
        ))
    }
}

/// A frame over the limits, from a decoder made with `oversized=True`: `frame` has its
/// command and headers, its body too when `body_kept` (too many headers or a header
/// line too long: the whole frame was within max_frame_bytes), else the body was
/// skipped. `reason` is a constant text, `detail` says more.
#[pyclass(module = "mqguard_native", name = "Oversized")]
pub struct PyOversized {
    #[pyo3(get, set)]
    frame: Py<PyFrame>,
    #[pyo3(get, set)]
    reason: String,
    #[pyo3(get, set)]
    detail: String,
    #[pyo3(get, set)]
    body_kept: bool,
}

#[pymethods]
impl PyOversized {
    #[new]
    fn new(frame: Py<PyFrame>, reason: String, detail: String, body_kept: bool) -> Self {
        PyOversized { frame, reason, detail, body_kept }
    }

    fn __richcmp__(&self, py: Python<'_>, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<PyOversized>() else {
            return Ok(py.NotImplemented());
        };
        let equal = {
            let other = other.borrow();
            self.reason == other.reason
                && self.detail == other.detail
                && self.body_kept == other.body_kept
                && self.frame.bind(py).eq(other.frame.bind(py))?
        };
        Ok(match op {
            CompareOp::Eq => equal.into_pyobject(py)?.to_owned().into_any().unbind(),
            CompareOp::Ne => (!equal).into_pyobject(py)?.to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        })
    }

    /// Copies and pickles as `Oversized(frame, reason, detail, body_kept)`.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.borrow();
        let args = (this.frame.clone_ref(py), this.reason.clone(), this.detail.clone(), this.body_kept)
            .into_pyobject(py)?;
        PyTuple::new(py, [slf.get_type().into_any(), args.into_any()])
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Oversized(frame={}, reason={}, detail={}, body_kept={})",
            self.frame.bind(py).repr()?,
            PyString::new(py, &self.reason).repr()?,
            PyString::new(py, &self.detail).repr()?,
            if self.body_kept { "True" } else { "False" }
        ))
    }
}

/// The Python object of a decoded item: `HEARTBEAT`, a `Frame` or an `Oversized`,
/// exactly what the Python-facing decoder returns.
pub fn item_into_py(py: Python<'_>, item: Item) -> PyResult<Py<PyAny>> {
    match item {
        Item::Heartbeat => Ok(registry(py)?.heartbeat.clone_ref(py)),
        Item::Frame(frame) => Ok(Py::new(py, PyFrame::from_raw(py, frame)?)?.into_any()),
        Item::Oversized(item) => {
            let frame = Py::new(py, PyFrame::from_raw(py, item.frame)?)?;
            let oversized = PyOversized {
                frame,
                reason: item.reason.to_owned(),
                detail: item.detail,
                body_kept: item.body_kept,
            };
            Ok(Py::new(py, oversized)?.into_any())
        }
    }
}

fn items_into_list<'py>(py: Python<'py>, items: Vec<Item>) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    let heartbeat = registry(py)?.heartbeat.bind(py);
    for item in items {
        match item {
            Item::Heartbeat => list.append(heartbeat)?,
            item => list.append(item_into_py(py, item)?)?,
        }
    }
    Ok(list)
}

/// Incremental decoder for one direction of one connection.
///
/// `feed` returns the frames (and HEARTBEAT sentinels) completed by the data, in order,
/// and buffers the rest. `version` governs header unescaping and may be changed at any
/// time; it applies to frames completed by later feeds. After a FrameError the decoder
/// is poisoned. With `keep_wire=False` decoded frames carry no received octets. With
/// `oversized=True` a frame over the limits whose header block fits is handed on as
/// Oversized (its body skipped when over max_frame_bytes), and decoding goes on.
#[pyclass(module = "mqguard_native", name = "FrameDecoder")]
pub struct PyFrameDecoder {
    decoder: Decoder,
    limits: Py<PyAny>,
}

fn limit(limits: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    limits.getattr(name)?.extract::<usize>()
}

#[pymethods]
impl PyFrameDecoder {
    #[new]
    #[pyo3(signature = (*, limits = None, commands = None, version = None, keep_wire = true, oversized = false))]
    fn new(
        py: Python<'_>,
        limits: Option<Py<PyAny>>,
        commands: Option<&Bound<'_, PyAny>>,
        version: Option<&Bound<'_, PyAny>>,
        keep_wire: bool,
        oversized: bool,
    ) -> PyResult<Self> {
        let limits = match limits {
            Some(limits) => limits,
            None => registry(py)?.default_limits.clone_ref(py),
        };
        let bound = limits.bind(py);
        let rust_limits = Limits {
            max_frame_bytes: limit(bound, "max_frame_bytes")?,
            max_header_count: limit(bound, "max_header_count")?,
            max_header_line_bytes: limit(bound, "max_header_line_bytes")?,
        };
        let max_command = limit(bound, "max_command_bytes")?;
        let mut names: Vec<String> = Vec::new();
        match commands {
            None => names.extend(CLIENT_COMMANDS.iter().chain(SERVER_COMMANDS.iter()).map(|c| c.to_string())),
            Some(commands) => {
                let bad = PyList::empty(py);
                for command in commands.try_iter()? {
                    let command = command?;
                    let name = command
                        .cast::<PyString>()
                        .ok()
                        .and_then(|s| s.to_str().ok().map(str::to_owned))
                        .filter(|s| super::frame::is_command_name(s.as_bytes()));
                    match name {
                        Some(name) => names.push(name),
                        None => bad.append(command)?,
                    }
                }
                if !bad.is_empty() {
                    bad.sort()?;
                    return Err(PyValueError::new_err(format!(
                        "commands must be ASCII uppercase words, got {}",
                        bad.repr()?
                    )));
                }
            }
        }
        let version = match version {
            Some(version) => parse_version(version)?,
            None => Version::V12,
        };
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut decoder = Decoder::with_commands(rust_limits, &refs, max_command, version)
            .map_err(PyValueError::new_err)?;
        decoder.set_keep_wire(keep_wire);
        decoder.set_oversized(oversized);
        Ok(PyFrameDecoder { decoder, limits })
    }

    /// Frames and HEARTBEATs completed by `data`, in order; the rest stays buffered.
    fn feed<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let data = octets(data)?;
        let mut items = Vec::new();
        match self.decoder.feed(&data, &mut items) {
            Ok(()) => items_into_list(py, items),
            Err(error) => {
                let frames = items_into_list(py, items)?;
                Err(py_error(py, &error, Some(frames)))
            }
        }
    }

    #[getter]
    fn version(&self) -> &'static str {
        self.decoder.version().as_str()
    }

    #[setter]
    fn set_version(&mut self, version: &Bound<'_, PyAny>) -> PyResult<()> {
        self.decoder.set_version(parse_version(version)?);
        Ok(())
    }

    #[getter]
    fn limits(&self, py: Python<'_>) -> Py<PyAny> {
        self.limits.clone_ref(py)
    }

    /// Whether frames over the limits are handed on as Oversized.
    #[getter]
    fn oversized(&self) -> bool {
        self.decoder.oversized()
    }

    #[setter]
    fn set_oversized(&mut self, on: bool) {
        self.decoder.set_oversized(on);
    }

    /// Octets held of an incomplete frame.
    #[getter]
    fn buffered(&self) -> usize {
        self.decoder.buffered()
    }
}

/// The wire form of `frame` for a connection speaking STOMP `version`.
#[pyfunction]
#[pyo3(signature = (frame, version = None))]
fn encode(py: Python<'_>, frame: PyRef<'_, PyFrame>, version: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyBytes>> {
    let version = match version {
        Some(version) => parse_version(version)?,
        None => Version::V12,
    };
    frame.encode_with(py, version)
}

/// The octets to relay `frame` with: as received when unchanged, else `encode`.
#[pyfunction]
fn wire_of(py: Python<'_>, frame: PyRef<'_, PyFrame>, version: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    if let Some(wire) = &frame.wire {
        return Ok(wire.clone_ref(py));
    }
    Ok(frame.encode_with(py, parse_version(version)?)?.into_any())
}

/// `encode(Frame(command, headers), version)`, without making the frame.
#[pyfunction]
fn encode_bodiless(py: Python<'_>, command: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>, version: &Bound<'_, PyAny>) -> PyResult<Py<PyBytes>> {
    encode_py(py, command, headers, b"", parse_version(version)?, None)
}

/// `encode_bodiless(command, [(name, value)], version)`.
#[pyfunction]
fn encode_one_header(py: Python<'_>, command: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>, version: &Bound<'_, PyAny>) -> PyResult<Py<PyBytes>> {
    let pairs = [(name.clone(), value.clone())];
    encode_pairs(py, command, &pairs, b"", parse_version(version)?, None)
}

/// Header by header encoding with the escaping given: what `encode` does once it
/// checked the command and chose the escaping.
#[pyfunction]
fn encode_checked(py: Python<'_>, command: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>, body: &Bound<'_, PyAny>, version: &Bound<'_, PyAny>, escaped: bool) -> PyResult<Py<PyBytes>> {
    let body = octets(body)?;
    encode_py(py, command, headers, &body, parse_version(version)?, Some(escaped))
}

/// The encoded frame `data` with `name:value` as its first header.
#[pyfunction]
fn with_plain_header(py: Python<'_>, data: &Bound<'_, PyAny>, name: &str, value: &str) -> PyResult<Py<PyBytes>> {
    if !name.is_ascii() || !value.is_ascii() {
        return Err(PyValueError::new_err(format!("a plain header is ASCII, got {name:?}:{value:?}")));
    }
    let data = octets(data)?;
    match super::encode::with_plain_header(&data, name, value) {
        Some(out) => Ok(PyBytes::new(py, &out).unbind()),
        None => Err(PyValueError::new_err("not an encoded frame: no LF after its command")),
    }
}

/// A SEND frame as the STOMP adapter writes it (see `adapter::encode_send`).
#[pyfunction]
fn encode_send(py: Python<'_>, destination: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>, body: &Bound<'_, PyAny>) -> PyResult<Py<PyBytes>> {
    let body = octets(body)?;
    let mut pairs: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = Vec::new();
    if let Ok(dict) = headers.cast::<PyDict>() {
        pairs.reserve(dict.len());
        pairs.extend(dict.iter());
    } else {
        for item in headers.call_method0("items")?.try_iter()? {
            pairs.push(header_pair(&item?)?);
        }
    }
    let (destination, destination_lossy) = str_of(destination)?;
    let mut texts = Vec::with_capacity(pairs.len());
    for (name, value) in &pairs {
        texts.push((str_of(name)?, str_of(value)?));
    }
    let iter = texts.iter().map(|((name, name_lossy), (value, value_lossy))| {
        (HeaderText { text: name, lossy: *name_lossy }, HeaderText { text: value, lossy: *value_lossy })
    });
    let destination = HeaderText { text: &destination, lossy: destination_lossy };
    let mut out = Vec::with_capacity(body.len() + 64 + 48 * texts.len());
    match encode_send_into(destination, iter, &body, &mut out) {
        Ok(()) => Ok(PyBytes::new(py, &out).unbind()),
        Err(error) => Err(py_error(py, &error, None)),
    }
}

/// A received frame (one, without its NUL) read as `stomp.utils.parse_frame` reads it:
/// `(command, headers, body)`, or None for a head of empty lines only. Lenient as
/// stomp.py is (see `received`): an unknown escape is kept, a line without `:` skipped,
/// invalid UTF-8 replaced; the first occurrence of a name wins.
#[pyfunction]
fn parse_received<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let data = octets(data)?;
    let (head, body) = split_received(&data);
    let head = String::from_utf8_lossy(head);
    let Some((command, headers)) = parse_head(&head) else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    for (name, value) in &headers {
        dict.set_item(PyString::new(py, name), PyString::new(py, value))?;
    }
    let body = if body.is_empty() { empty_bytes(py) } else { PyBytes::new(py, body).into_any().unbind() };
    let command = command_string(py, command).into_any();
    Ok(Some(PyTuple::new(py, [command, dict.into_any().unbind(), body])?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFrame>()?;
    m.add_class::<PyOversized>()?;
    m.add_class::<PyFrameDecoder>()?;
    m.add_function(wrap_pyfunction!(init_codec, m)?)?;
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(wire_of, m)?)?;
    m.add_function(wrap_pyfunction!(encode_bodiless, m)?)?;
    m.add_function(wrap_pyfunction!(encode_one_header, m)?)?;
    m.add_function(wrap_pyfunction!(encode_checked, m)?)?;
    m.add_function(wrap_pyfunction!(with_plain_header, m)?)?;
    m.add_function(wrap_pyfunction!(encode_send, m)?)?;
    m.add_function(wrap_pyfunction!(parse_received, m)?)?;
    m.add("MAX_WIRE_KEPT", super::frame::MAX_WIRE_KEPT)?;
    Ok(())
}
