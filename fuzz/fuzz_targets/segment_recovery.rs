//! Recovery of a data directory whose segment log holds arbitrary bytes: the body and its checks are `chronik_sim::fuzz::segment_recovery`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| chronik_sim::fuzz::segment_recovery(data));
