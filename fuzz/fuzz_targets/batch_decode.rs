//! Batch decoding on arbitrary bytes: the body and its checks are `chronik_sim::fuzz::batch_decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::batch_decode(data));
