//! Arbitrary operation sequences (appends, reads, reopens, crashes, ticks) against a model: the body and its checks are `chronik_sim::fuzz::engine_model`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::engine_model(data));
