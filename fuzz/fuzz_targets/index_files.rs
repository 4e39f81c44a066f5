//! A sealed segment's offset and time indexes replaced by arbitrary bytes: the body and its checks are `chronik_sim::fuzz::index_files`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::index_files(data));
