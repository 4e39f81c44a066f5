//! Benchmarks for Chronik: what the benchmark binaries share.

/// A field of `/proc/self/status` in KiB, such as `VmHWM` (peak RSS); 0 where there is none.
pub fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
