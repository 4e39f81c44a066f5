//! What a processor's own code returns when it cannot go on ([`ProcessError`]), and the JSON
//! codec of typed stores and `Context::emit_json`, whose failures are such errors. Invariant:
//! this file names nothing else of the crate, so the stores (`store::Typed`) may use it while
//! the processor modules use the stores, without an import cycle.

/// What a processor returns when it cannot go on; the run stops with it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProcessError(pub String);

impl ProcessError {
    pub fn new(message: impl Into<String>) -> ProcessError {
        ProcessError(message.into())
    }
}

/// Encode `value` as JSON.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ProcessError> {
    serde_json::to_vec(value).map_err(|e| ProcessError(format!("cannot encode: {e}")))
}

/// Decode JSON bytes (a record's key or value, say) into `T`.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ProcessError> {
    serde_json::from_slice(bytes).map_err(|e| ProcessError(format!("cannot decode: {e}")))
}
