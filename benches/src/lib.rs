//! Benchmarks for Chronik.
//!
//! Empty on purpose: the benchmark issue adds criterion micro-benchmarks and the end-to-end
//! `chronik-bench` binary that runs fio, Redis Streams and NATS JetStream beside Chronik.
