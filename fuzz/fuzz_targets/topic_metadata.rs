//! A topic's metadata file replaced by arbitrary bytes: the body and its checks are `chronik_sim::fuzz::topic_metadata`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::topic_metadata(data));
