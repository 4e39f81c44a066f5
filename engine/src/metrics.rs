//! Counters and latency histograms of one open engine, shared by its partitions; readable at
//! any time without a lock ([`crate::Engine::metrics`]) and exportable in the Prometheus text
//! format ([`MetricsSnapshot::prometheus`]).
//!
//! Updates are relaxed atomic adds: a snapshot taken while appends run may show a count and a
//! sum from slightly different instants, never a torn value. Latencies come from the engine's
//! injected clock ([`crate::Clock::monotonic_us`]), so the simulator's runs stay deterministic.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets of a histogram: bucket `i` counts values below `2^i` microseconds (and at least
/// `2^(i-1)`); the last one everything larger. 2^26 us is about 67 s.
pub const HISTOGRAM_BUCKETS: usize = 27;

/// A latency histogram in microseconds with power-of-two buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    count: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Histogram {
    pub fn record(&self, us: u64) {
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.buckets[bucket.min(HISTOGRAM_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's values at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative): values in `[2^(i-1), 2^i)` microseconds; bucket 0 holds 0.
    pub buckets: [u64; HISTOGRAM_BUCKETS],
    pub count: u64,
    pub sum_us: u64,
    /// The largest value recorded, exactly.
    pub max_us: u64,
}

impl HistogramSnapshot {
    /// The smallest bucket bound (microseconds) at or below which `quantile` of the values
    /// fall: an upper bound of that quantile, within a factor of two. `None` when empty.
    pub fn quantile_upper_us(&self, quantile: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        #[allow(clippy::cast_sign_loss)]
        let wanted = ((self.count as f64) * quantile.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                return Some(bucket_upper_us(i));
            }
        }
        Some(bucket_upper_us(HISTOGRAM_BUCKETS - 1))
    }
}

/// The exclusive upper bound of bucket `i`, in microseconds.
fn bucket_upper_us(i: usize) -> u64 {
    1_u64 << i
}

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// The engine's counters (and two histograms), updated as it works.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $help] pub $name: AtomicU64,)*
            /// Latency of `append` (and of a transaction's commit), from call to acknowledgement.
            pub append_latency: Histogram,
            /// Latency of each segment fdatasync.
            pub fsync_latency: Histogram,
            /// Latency of a stream-processor task's commit: its transaction, then its disk
            /// stores' flushes and merge slices (the chronik SDK).
            pub task_commit_latency: Histogram,
        }

        /// Every counter and histogram at one moment.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $(#[doc = $help] pub $name: u64,)*
            pub append_latency: HistogramSnapshot,
            pub fsync_latency: HistogramSnapshot,
            pub task_commit_latency: HistogramSnapshot,
        }

        impl Metrics {
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    append_latency: self.append_latency.snapshot(),
                    fsync_latency: self.fsync_latency.snapshot(),
                    task_commit_latency: self.task_commit_latency.snapshot(),
                }
            }
        }

        impl MetricsSnapshot {
            /// `(name, help, value)` of every counter, in declaration order.
            pub fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), $help, self.$name),)*]
            }
        }
    };
}

counters! {
    appends: "Batches appended (one per append call and partition), transactions included.",
    records_appended: "Records appended.",
    bytes_written: "Bytes of batches written to segments.",
    append_errors: "Appends that failed (after their records were encoded).",
    fetches: "Reads served.",
    bytes_read: "Bytes of batches returned by reads.",
    fsyncs: "Segment fdatasyncs run (acknowledgements, rolls, transactions).",
    fsync_errors: "Segment fdatasyncs that failed (each poisons the engine).",
    segments_rolled: "Active segments sealed and replaced by a new one.",
    compaction_passes: "Compaction passes that rewrote segments.",
    compaction_bytes_in: "Bytes of segments read by compaction passes.",
    compaction_bytes_out: "Bytes of segments written by compaction passes.",
    compaction_records_in: "Records read by compaction passes.",
    compaction_records_kept: "Records kept by compaction passes.",
    restore_records: "Changelog records applied by processor restores (the chronik SDK).",
    restores_done: "Processor task restores finished (the chronik SDK).",
    store_merges: "Disk-store merges installed (the chronik SDK's disk stores).",
    store_unnamed_removed: "Disk-store files no manifest named, removed when the store opened (runs and merge outputs a crash left half built).",
    store_stalls: "Disk-store flushes that waited for a merge to finish, a level having fallen behind (backpressure).",
    late_records: "Events windowed operators found too late for their windows (the chronik SDK's topologies; counted when seen, so a run that fails and reruns counts them again).",
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl MetricsSnapshot {
    /// The Prometheus text exposition format (version 0.0.4): every counter as
    /// `chronik_<name>_total`, the histograms as `chronik_<name>_seconds` with cumulative
    /// `le` buckets.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (name, help, value) in self.counters() {
            let _ = writeln!(out, "# HELP chronik_{name}_total {help}");
            let _ = writeln!(out, "# TYPE chronik_{name}_total counter");
            let _ = writeln!(out, "chronik_{name}_total {value}");
        }
        let histograms = [
            ("append_latency", "Append latency, call to acknowledgement.", &self.append_latency),
            ("fsync_latency", "Segment fdatasync latency.", &self.fsync_latency),
            (
                "task_commit_latency",
                "Stream-processor task commit latency: transaction and disk-store flushes.",
                &self.task_commit_latency,
            ),
        ];
        for (name, help, h) in histograms {
            let _ = writeln!(out, "# HELP chronik_{name}_seconds {help}");
            let _ = writeln!(out, "# TYPE chronik_{name}_seconds histogram");
            let mut cumulative = 0;
            for (i, &n) in h.buckets.iter().enumerate().take(HISTOGRAM_BUCKETS - 1) {
                cumulative += n;
                let le = seconds(bucket_upper_us(i));
                let _ = writeln!(out, "chronik_{name}_seconds_bucket{{le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "chronik_{name}_seconds_bucket{{le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "chronik_{name}_seconds_sum {}", seconds(h.sum_us));
            let _ = writeln!(out, "chronik_{name}_seconds_count {}", h.count);
        }
        out
    }
}

/// Microseconds as decimal seconds, exactly (no float rounding).
fn seconds(us: u64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_powers_of_two_and_quantiles_bound_the_values() {
        let h = Histogram::default();
        for us in [0, 1, 2, 3, 900, 1000, 1025, u64::MAX] {
            h.record(us);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 8);
        assert_eq!(s.buckets[0], 1); // 0
        assert_eq!(s.buckets[1], 1); // 1
        assert_eq!(s.buckets[2], 2); // 2, 3
        assert_eq!(s.buckets[10], 2); // 900, 1000 < 1024
        assert_eq!(s.buckets[11], 1); // 1025 < 2048
        assert_eq!(s.buckets[HISTOGRAM_BUCKETS - 1], 1); // the rest
        assert_eq!(s.quantile_upper_us(0.5), Some(4));
        assert_eq!(s.quantile_upper_us(0.75), Some(1024));
        assert_eq!(HistogramSnapshot::default().quantile_upper_us(0.5), None);
        assert_eq!(s.max_us, u64::MAX, "the largest value, exactly");
    }

    #[test]
    fn prometheus_text_has_every_counter_and_cumulative_buckets() {
        let metrics = Metrics::default();
        Metrics::add(&metrics.appends, 3);
        metrics.fsync_latency.record(1500);
        metrics.fsync_latency.record(3);
        let text = metrics.snapshot().prometheus();
        assert!(text.contains("# TYPE chronik_appends_total counter\nchronik_appends_total 3\n"));
        assert!(text.contains("chronik_fsync_latency_seconds_bucket{le=\"0.000004\"} 1\n"));
        assert!(text.contains("chronik_fsync_latency_seconds_bucket{le=\"0.002048\"} 2\n"));
        assert!(text.contains("chronik_fsync_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("chronik_fsync_latency_seconds_sum 0.001503\n"));
        assert!(text.contains("chronik_append_latency_seconds_count 0\n"));
        let lines = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(lines, 20 + 3 * (HISTOGRAM_BUCKETS + 2));
    }
}
