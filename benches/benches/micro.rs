//! Criterion micro-benchmarks of the hot paths: batch encode, batch decode with its checksum,
//! and an offset index lookup. `cargo bench -p chronik-benches --bench micro`.

use chronik::Record;
use chronik_engine::Offset;
use chronik_engine::internals::format::{encode_batch, parse_batch};
use chronik_engine::internals::index::SegmentIndex;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn batch_of(records: usize, value_bytes: usize) -> (Vec<u8>, usize) {
    let value = vec![7_u8; value_bytes];
    let records: Vec<Record<'_>> = (0..records).map(|_| Record::new(None, &value)).collect();
    let mut out = Vec::new();
    encode_batch(&mut out, Offset::ZERO, &records, 1_700_000_000_000, Offset::ZERO)
        .expect("a valid batch");
    (out, records.len())
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_encode");
    for (records, value_bytes) in [(100, 100), (1000, 100), (64, 1024)] {
        let value = vec![7_u8; value_bytes];
        let batch: Vec<Record<'_>> = (0..records).map(|_| Record::new(None, &value)).collect();
        group.throughput(Throughput::Elements(records as u64));
        let id = BenchmarkId::from_parameter(format!("{records}x{value_bytes}B"));
        let mut out = Vec::with_capacity(records * (value_bytes + 64) + 64);
        group.bench_function(id, |b| {
            b.iter(|| {
                out.clear();
                encode_batch(&mut out, Offset::ZERO, black_box(&batch), 0, Offset::ZERO)
                    .expect("encodes")
            });
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_decode_and_checksum");
    for (records, value_bytes) in [(100, 100), (1000, 100), (64, 1024)] {
        let (bytes, count) = batch_of(records, value_bytes);
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        let id = BenchmarkId::from_parameter(format!("{records}x{value_bytes}B"));
        group.bench_function(id, |b| {
            b.iter(|| {
                let batch = parse_batch(black_box(&bytes)).expect("valid");
                let mut sum = 0;
                for record in batch.records() {
                    sum += record.value().len();
                }
                assert_eq!(sum, count * value_bytes);
                sum
            });
        });
    }
    group.finish();
}

fn index_lookup(c: &mut Criterion) {
    // A 1 GiB segment of 1 KiB batches indexed every 4 KiB: 262,144 entries.
    let mut index = SegmentIndex::new(Offset::ZERO, 4096);
    for i in 0..(1_u32 << 20) {
        index.on_batch(i * 1024, Offset::new(u64::from(i) * 10), 0, 1024);
    }
    let mut offset = 0_u64;
    c.bench_function("index_lookup", |b| {
        b.iter(|| {
            offset = (offset + 7_919) % 10_000_000;
            index.entry_for_offset(black_box(Offset::new(offset)))
        });
    });
}

criterion_group!(benches, encode, decode, index_lookup);
criterion_main!(benches);
