//! The peers, run in the same process run as Chronik's scenarios: fio (the disk's limits),
//! Redis Streams, NATS JetStream and the `commitlog` crate. Each server is started on 127.0.0.1
//! with its data in the run's temporary directory and stopped afterwards. A peer that is not
//! installed or fails is pushed as skipped, with the reason.

use super::{Measure, Server, Sizes, empty_directory, free_port, report, settle, wait_for_port};
use anyhow::{Context as _, anyhow, bail};
use async_nats::jetstream::{self, stream};
use commitlog::message::MessageBuf;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Records per pipelined request or per commitlog append.
const PIPELINE: u64 = 1000;
/// JetStream publishes in flight before the oldest ack is awaited.
const ACKS_IN_FLIGHT: usize = 1024;

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn push(out: &mut Vec<Measure>, scenario: &str, system: &str, result: anyhow::Result<Measure>) {
    let measure = result.unwrap_or_else(|error| {
        let full = format!("{error:#}");
        let mut why: String = full.chars().take(200).collect();
        if why.len() < full.len() {
            why.push_str("...");
        }
        Measure::skipped(scenario, system, why)
    });
    out.push(report(measure));
}

/// fio: sequential write bandwidth (Chronik's write size and sync cadence, the final fsync
/// included) and the rate of 4 KiB writes each followed by its own fdatasync.
pub fn fio(base: &Path, sizes: Sizes, out: &mut Vec<Measure>) {
    const WRITE: &str = "sequential write, 64 KiB blocks, fdatasync per 256 MiB";
    const SYNC: &str = "write 4 KiB + fdatasync";
    if !installed("fio") {
        for scenario in [WRITE, SYNC] {
            out.push(report(Measure::skipped(
                scenario,
                "fio",
                "fio is not installed (scripts/install-bench-peers)",
            )));
        }
        return;
    }
    let size = format!("--size={}", sizes.fio_bytes);
    let runtime = format!("--runtime={}s", sizes.sync_seconds);
    let write = run_fio(
        base,
        // The write size of Chronik's 1 KiB scenario (a batch of 64 records), an fdatasync
        // every 256 MiB as its segments roll (each sealed segment is fdatasynced) and one at
        // the end, and no preallocation (Chronik does not preallocate): the same pattern on the
        // same disk. Measured here, fio's 1 MiB blocks or its default fallocate are 2-3x slower.
        &[
            "--name=seqwrite",
            "--rw=write",
            "--bs=64k",
            &size,
            "--ioengine=psync",
            "--fdatasync=4096",
            "--end_fsync=1",
            "--fallocate=none",
        ],
    )
    .map(|(bytes, seconds, _)| {
        Measure::new(WRITE, "fio", 0, bytes, Duration::from_secs_f64(seconds))
    });
    push(out, WRITE, "fio", write);
    let sync = run_fio(
        base,
        &[
            "--name=fdatasync",
            "--rw=write",
            "--bs=4k",
            "--size=64M",
            "--ioengine=psync",
            "--fdatasync=1",
            "--time_based",
            &runtime,
        ],
    )
    .map(|(bytes, seconds, ios)| {
        Measure::new(SYNC, "fio", ios, bytes, Duration::from_secs_f64(seconds))
    });
    push(out, SYNC, "fio", sync);
}

/// Run one fio job in `base`; returns bytes written, the seconds they took (fio's own job
/// runtime, which includes `end_fsync`), and the number of writes.
fn run_fio(base: &Path, args: &[&str]) -> anyhow::Result<(u64, f64, u64)> {
    settle();
    let directory = base.join("fio");
    std::fs::create_dir_all(&directory)?;
    let output = Command::new("fio")
        .args(args)
        .arg(format!("--directory={}", directory.display()))
        .arg("--output-format=json")
        .output()
        .context("cannot run fio")?;
    std::fs::remove_dir_all(&directory)?;
    if !output.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).context("fio's JSON")?;
    let job = &json["jobs"][0];
    let bytes = job["write"]["io_bytes"].as_u64().context("fio: write.io_bytes")?;
    let ios = job["write"]["total_ios"].as_u64().context("fio: write.total_ios")?;
    let milliseconds = job["job_runtime"].as_u64().context("fio: job_runtime")?;
    Ok((bytes, milliseconds.max(1) as f64 / 1000.0, ios))
}

/// Redis Streams: pipelined `XADD` of 100 B values, with the append-only file fsynced every
/// second and on every write.
pub fn redis(base: &Path, sizes: Sizes, out: &mut Vec<Measure>) {
    for mode in ["everysec", "always"] {
        let scenario = format!("append 100 B, pipelined, appendfsync {mode}");
        if !installed("redis-server") {
            out.push(report(Measure::skipped(
                &scenario,
                "redis streams",
                "redis-server is not installed",
            )));
            continue;
        }
        let result = run_redis(base, mode, sizes.peer_records, &scenario);
        push(out, &scenario, "redis streams", result);
    }
}

fn run_redis(base: &Path, mode: &str, records: u64, scenario: &str) -> anyhow::Result<Measure> {
    settle();
    let directory = empty_directory(&base.join(format!("redis-{mode}")))?;
    let port = free_port()?;
    let port_text = port.to_string();
    let dir_text = directory.display().to_string();
    let _server = Server::start(
        "redis-server",
        &[
            "--port",
            &port_text,
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir_text,
            "--appendonly",
            "yes",
            "--appendfsync",
            mode,
            "--save",
            "",
            "--daemonize",
            "no",
        ],
    )?;
    wait_for_port(port)?;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut connection = client.get_connection()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis::cmd("PING").query::<String>(&mut connection).is_err() {
        if Instant::now() > deadline {
            bail!("redis-server did not answer PING within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let value = vec![b'x'; 100];
    let start = Instant::now();
    let mut sent = 0;
    while sent < records {
        let mut pipe = redis::pipe();
        for _ in 0..PIPELINE {
            pipe.cmd("XADD").arg("bench").arg("*").arg("v").arg(&value).ignore();
        }
        pipe.query::<()>(&mut connection)?;
        sent += PIPELINE;
    }
    let elapsed = start.elapsed();
    let length: u64 = redis::cmd("XLEN").arg("bench").query(&mut connection)?;
    if length != sent {
        bail!("the stream holds {length} entries of {sent}");
    }
    Ok(Measure::new(scenario, "redis streams", sent, sent * 100, elapsed))
}

/// NATS JetStream: a file-storage stream, 100 B messages published asynchronously with up to
/// [`ACKS_IN_FLIGHT`] acknowledgements outstanding (the server's default sync policy).
pub fn nats(base: &Path, sizes: Sizes, out: &mut Vec<Measure>) {
    let scenario = "append 100 B, async publish, file storage";
    if !installed("nats-server") {
        out.push(report(Measure::skipped(
            scenario,
            "nats jetstream",
            "nats-server is not installed",
        )));
        return;
    }
    let result = run_nats(base, sizes.peer_records, scenario);
    push(out, scenario, "nats jetstream", result);
}

fn run_nats(base: &Path, records: u64, scenario: &str) -> anyhow::Result<Measure> {
    settle();
    let directory = empty_directory(&base.join("nats"))?;
    let port = free_port()?;
    let port_text = port.to_string();
    let dir_text = directory.display().to_string();
    let _server = Server::start(
        "nats-server",
        &["-js", "-a", "127.0.0.1", "-p", &port_text, "-sd", &dir_text],
    )?;
    wait_for_port(port)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = async_nats::connect(format!("127.0.0.1:{port}")).await?;
        let context = jetstream::new(client);
        let config = stream::Config {
            name: "BENCH".to_owned(),
            subjects: vec!["bench".to_owned()],
            storage: stream::StorageType::File,
            ..stream::Config::default()
        };
        context.create_stream(config).await.map_err(|e| anyhow!("create stream: {e}"))?;
        let value = bytes::Bytes::from(vec![b'x'; 100]);
        let mut in_flight = std::collections::VecDeque::with_capacity(ACKS_IN_FLIGHT);
        let start = Instant::now();
        for _ in 0..records {
            let ack = context
                .publish("bench", value.clone())
                .await
                .map_err(|e| anyhow!("publish: {e}"))?;
            in_flight.push_back(ack);
            if in_flight.len() >= ACKS_IN_FLIGHT
                && let Some(oldest) = in_flight.pop_front()
            {
                oldest.await.map_err(|e| anyhow!("ack: {e}"))?;
            }
        }
        while let Some(ack) = in_flight.pop_front() {
            ack.await.map_err(|e| anyhow!("ack: {e}"))?;
        }
        let elapsed = start.elapsed();
        Ok(Measure::new(scenario, "nats jetstream", records, records * 100, elapsed))
    })
}

/// The `commitlog` crate: 100 B messages appended in buffers of [`PIPELINE`], then a flush.
/// Its flush does not fsync the segment (it flushes a `File`, a no-op, and msyncs the index),
/// so this is its page-cache speed, as Chronik's `os` mode without the final fsync.
pub fn commitlog(base: &Path, sizes: Sizes, out: &mut Vec<Measure>) {
    let scenario = "append 100 B, batch 1000, no fsync";
    let result = run_commitlog(base, sizes.small_records, scenario);
    push(out, scenario, "commitlog crate", result);
}

fn run_commitlog(base: &Path, records: u64, scenario: &str) -> anyhow::Result<Measure> {
    settle();
    let directory = empty_directory(&base.join("commitlog"))?;
    let mut log = commitlog::CommitLog::new(commitlog::LogOptions::new(&directory))?;
    let value = vec![b'x'; 100];
    let start = Instant::now();
    let mut written = 0;
    while written < records {
        let mut buffer = MessageBuf::default();
        for _ in 0..PIPELINE {
            buffer.push(&value).map_err(|e| anyhow!("commitlog push: {e:?}"))?;
        }
        log.append(&mut buffer).map_err(|e| anyhow!("commitlog append: {e:?}"))?;
        written += PIPELINE;
    }
    log.flush()?;
    let elapsed = start.elapsed();
    drop(log);
    std::fs::remove_dir_all(&directory)?;
    Ok(Measure::new(scenario, "commitlog crate", written, written * 100, elapsed))
}
