//! Batch decoding on arbitrary bytes: must never panic, and a batch that parses must iterate
//! to exactly its record count.
#![no_main]

use chronik_engine::format::parse_batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = parse_batch(data) {
        let count = batch.records().map(|record| record.headers().count()).count();
        assert_eq!(count, batch.record_count() as usize);
    }
});
