//! How Python values become bytes in records and stores, and back.
//!
//! `bytes`: bytes-like values as they are (a `str` as its UTF-8). `str`: UTF-8 text. `json`:
//! `None`, `bool`, 64-bit `int`, finite `float`, `str`, `list`/`tuple` and `dict` with `str`
//! keys, as compact JSON: the encoding Rust processors' typed stores use
//! (`chronik::processor::Typed`), so a store or topic written by one is read by the other.

use crate::InvalidArgumentError;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Nesting deeper than this is refused (a cycle would otherwise recurse forever).
const DEPTH_MAX: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    Bytes,
    Str,
    Json,
}

impl Codec {
    pub fn parse(name: &str) -> PyResult<Codec> {
        match name {
            "bytes" => Ok(Codec::Bytes),
            "str" => Ok(Codec::Str),
            "json" => Ok(Codec::Json),
            _ => Err(InvalidArgumentError::new_err(format!(
                "format {name:?}: one of \"bytes\", \"str\", \"json\""
            ))),
        }
    }

    pub fn encode(self, value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
        match self {
            Codec::Bytes => raw(value),
            Codec::Str => value
                .cast::<PyString>()
                .map_err(|_| PyTypeError::new_err("a str-format value must be a str"))
                .and_then(|s| Ok(s.to_cow()?.as_bytes().to_vec())),
            Codec::Json => {
                let mut out = Vec::with_capacity(16);
                to_json(value, &mut out, 0)?;
                Ok(out)
            }
        }
    }

    /// Whether `decode` takes `bytes`, without the GIL or any Python object: `Err` says why
    /// not. The runner checks input records with it before the handler sees them.
    pub fn check(self, bytes: &[u8]) -> Result<(), String> {
        match self {
            Codec::Bytes => Ok(()),
            Codec::Str => std::str::from_utf8(bytes)
                .map(drop)
                .map_err(|e| format!("not UTF-8 text (format \"str\"): {e}")),
            // Syntax only, without building the value (`decode` builds it after): what
            // passes decodes, but for numbers beyond a float's range and lone UTF-16
            // surrogates in escapes, which `decode` refuses as a ValueError.
            Codec::Json => std::str::from_utf8(bytes)
                .map_err(|e| e.to_string())
                .and_then(|_| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
                        .map_err(|e| e.to_string())
                })
                .map(drop)
                .map_err(|e| format!("not JSON (format \"json\"): {e}")),
        }
    }

    /// Whether this format can refuse anything (`bytes` takes all).
    pub fn can_refuse(self) -> bool {
        self != Codec::Bytes
    }

    pub fn decode<'py>(self, py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Codec::Bytes => Ok(PyBytes::new(py, bytes).into_any()),
            Codec::Str => {
                let text = std::str::from_utf8(bytes)
                    .map_err(|e| PyValueError::new_err(format!("not UTF-8 text: {e}")))?;
                Ok(PyString::new(py, text).into_any())
            }
            Codec::Json => {
                if let Some(fast) = decode_simple(py, bytes)? {
                    return Ok(fast);
                }
                let value: serde_json::Value = serde_json::from_slice(bytes)
                    .map_err(|e| PyValueError::new_err(format!("not JSON: {e}")))?;
                from_json(py, &value)
            }
        }
    }
}

/// A bytes-like value (bytes, bytearray, memoryview) or a `str` as UTF-8.
pub(crate) fn raw(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(text.to_cow()?.as_bytes().to_vec());
    }
    value.extract::<Vec<u8>>().map_err(|_| {
        InvalidArgumentError::new_err("keys, values and headers are bytes, bytearray or str")
    })
}

/// The common cases without building a `serde_json::Value`: a small integer, or a string
/// with no escapes. `None` for anything else.
fn decode_simple<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Option<Bound<'py, PyAny>>> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if !digits.is_empty()
        && digits.len() <= 18
        && digits.iter().all(u8::is_ascii_digit)
        && (digits.len() == 1 || digits[0] != b'0')
    {
        let magnitude = digits.iter().fold(0_i64, |n, d| n * 10 + i64::from(d - b'0'));
        let n = if digits.len() < bytes.len() { -magnitude } else { magnitude };
        return Ok(Some(n.into_pyobject(py)?.into_any()));
    }
    if let Some(inner) = bytes.strip_prefix(b"\"").and_then(|b| b.strip_suffix(b"\""))
        && inner.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
        && let Ok(text) = std::str::from_utf8(inner)
    {
        return Ok(Some(PyString::new(py, text).into_any()));
    }
    Ok(None)
}

fn to_json(value: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> PyResult<()> {
    if depth > DEPTH_MAX {
        return Err(PyValueError::new_err("JSON nesting deeper than 128 (a cycle?)"));
    }
    if value.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(flag) = value.cast::<PyBool>() {
        out.extend_from_slice(if flag.is_true() { b"true" } else { b"false" });
    } else if value.cast::<PyInt>().is_ok() {
        if let Ok(n) = value.extract::<i64>() {
            out.extend_from_slice(n.to_string().as_bytes());
        } else if let Ok(n) = value.extract::<u64>() {
            out.extend_from_slice(n.to_string().as_bytes());
        } else {
            return Err(PyOverflowError::new_err("JSON ints are at most 64 bits here"));
        }
    } else if let Ok(text) = value.cast::<PyString>() {
        let text = text.to_cow()?;
        if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        } else {
            write(out, &*text)?;
        }
    } else if let Ok(float) = value.cast::<PyFloat>() {
        let f = float.value();
        if !f.is_finite() {
            return Err(PyValueError::new_err("JSON has no NaN or infinity"));
        }
        write(out, &f)?;
    } else if let Ok(list) = value.cast::<PyList>() {
        sequence(list.iter(), out, depth)?;
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        sequence(tuple.iter(), out, depth)?;
    } else if let Ok(dict) = value.cast::<PyDict>() {
        out.push(b'{');
        for (i, (key, item)) in dict.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let key = key
                .cast::<PyString>()
                .map_err(|_| PyTypeError::new_err("JSON object keys must be str"))?;
            write(out, &*key.to_cow()?)?;
            out.push(b':');
            to_json(&item, out, depth + 1)?;
        }
        out.push(b'}');
    } else {
        let kind = value.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "a {kind} is not JSON: use None, bool, int, float, str, list, tuple or dict, or \
             encode it to bytes yourself (format \"bytes\")"
        )));
    }
    Ok(())
}

fn sequence<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    out: &mut Vec<u8>,
    depth: usize,
) -> PyResult<()> {
    out.push(b'[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        to_json(&item, out, depth + 1)?;
    }
    out.push(b']');
    Ok(())
}

fn write<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> PyResult<()> {
    serde_json::to_writer(out, value).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn from_json<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(text) => PyString::new(py, text).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(from_json(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, from_json(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
