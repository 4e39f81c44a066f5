//! Python bindings for Chronik.
//!
//! Empty on purpose: the Python SDK issue turns this crate into a pyo3 extension module built
//! with maturin. It already depends on the `chronik` crate so the workspace checks that the
//! Rust SDK stays usable from here.
