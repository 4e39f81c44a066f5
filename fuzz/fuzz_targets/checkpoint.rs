//! A partition's sync checkpoint replaced by arbitrary bytes: the body and its checks are `chronik_sim::fuzz::checkpoint`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::checkpoint(data));
