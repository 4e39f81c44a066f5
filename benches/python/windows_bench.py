"""Tumbling-window counts per user: Chronik's topology from Python and from Rust beside
Bytewax 0.21, over the same events, in one run.

    scripts/bench-windows [--events N] [--users U] [--out DIR]

The events are `window_events.events(N, U)`: one every 5 ms of event time, every 97th up to
2 s out of order (within the 5 s grace). Each system counts events per user in one-minute
tumbling windows aligned to the epoch and emits one result per window and user; every
system's results must equal the oracle's (`window_events.expected`), compared by digest,
or the run fails.

- **Bytewax 0.21** (`bytewax_window.py`, its own process): one worker, recovery off (nothing
  persisted), events from an in-memory list. Timed: `run_main(flow)`.
- **Chronik, Python, no function per event**: the events are appended to a data directory
  first (timed apart, "produce"); then `Topology.stream("events").group_by_key()
  .window(Windows.tumbling(60_000, grace_ms=5_000), emit="final").count().to(...)` runs to
  the end of the input, exactly once with durability "sync": the counts' changelog, the
  results and the input positions committed in transactions every 100 ms, each fdatasynced.
  Timed: `run_until_caught_up()`.
- **Chronik, Python, a key function per event**: `group_by(lambda e: e.key)` instead of
  `group_by_key()`: a Python call per event (the GIL taken once per batch) and a second stage
  reading an internal repartition topic.
- **Chronik, Rust** (`chronik-window-work`, its own process): the first topology from Rust,
  on the same directory.

A closing event far ahead of the last (one per partition, its own key) closes every window,
so Chronik emits the final result of each, as Bytewax does at the end of its input; its own
window is left out. Prints a table of records/s and ratios, and writes `windows-bench.json`
to `--out` (default target/bench).
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import chronik

from window_events import GRACE_MS, WINDOW_MS, digest, events, expected

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "target" / "release" / "chronik-window-work"
BATCH = 10_000
CLOSING_KEY = "~closing"


def produce(db, n, users, partitions):
    """Append the events (and the closing ones) to topic `events`; the seconds it took."""
    db.create_topic("events", partitions=partitions)
    producers = [db.producer("events") for _ in range(partitions)]
    began = time.perf_counter()
    batches = [[] for _ in range(partitions)]
    last = 0
    for key, value, ts in events(n, users):
        partition = chronik.partition_for_key(key.encode(), partitions)
        batches[partition].append((key, value, None, ts))
        last = max(last, ts)
        if len(batches[partition]) == BATCH:
            producers[partition].send_batch(batches[partition], partition=partition)
            batches[partition] = []
    closing = last + WINDOW_MS + GRACE_MS + 1
    for partition in range(partitions):
        batches[partition].append((f"{CLOSING_KEY}-{partition}", b"", None, closing))
        producers[partition].send_batch(batches[partition], partition=partition)
    db.flush()
    return time.perf_counter() - began


def results(db, topic, partitions):
    """(key, window start, count) of every result in `topic` but the closing events'."""
    out = []
    for partition in range(partitions):
        for record in db.consumer(topic, partition=partition):
            key = bytes(record.key).decode()
            if key.startswith(CLOSING_KEY):
                continue
            start = int(dict((bytes(k), bytes(v)) for k, v in record.headers)[b"window.start"])
            out.append((key, start, int(bytes(record.value))))
    return out


def chronik_python(db, name, output, key_function, partitions):
    db.create_topic(output, partitions=partitions)
    topology = chronik.Topology(db, name, key_format="str", value_format="bytes")
    clicks = topology.stream("events")
    grouped = clicks.group_by(lambda e: e.key) if key_function else clicks.group_by_key()
    windows = chronik.Windows.tumbling(WINDOW_MS, grace_ms=GRACE_MS)
    grouped.window(windows, emit="final").count().to(output)
    gc.collect()
    began = time.perf_counter()
    stats = topology.run_until_caught_up()
    return time.perf_counter() - began, stats


def run_process(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "target" / "bench"))
    args = parser.parse_args(argv)
    n, users, partitions = args.events, args.users, args.partitions
    want = digest(expected(n, users))
    rows = []

    bytewax = run_process([
        sys.executable, str(Path(__file__).with_name("bytewax_window.py")),
        "--events", str(n), "--users", str(users),
    ])
    rows.append(("Bytewax " + bytewax["version"] + ", no persistence", bytewax["seconds"], bytewax["digest"]))

    with tempfile.TemporaryDirectory(prefix="windows-bench-") as directory:
        with chronik.open(directory, durability="sync") as db:
            produce_seconds = produce(db, n, users, partitions)
            for label, name, key_function in [
                ("Chronik from Python, exactly once", "py-per-minute", False),
                ("Chronik from Python, a Python key function per event", "py-keyed", True),
            ]:
                seconds, stats = chronik_python(db, name, name + "-counts", key_function, partitions)
                rows.append((label, seconds, digest(results(db, name + "-counts", partitions))))
            db.create_topic("rust-counts", partitions=partitions)
        rust = run_process([str(WORK), directory, "--application", "rust-per-minute", "--output", "rust-counts"])
        with chronik.open(directory, durability="sync") as db:
            rows.append(("Chronik from Rust, exactly once", rust["seconds"], digest(results(db, "rust-counts", partitions))))

    base = rows[0][1]
    print(f"tumbling one-minute windows, count per user: {n:,} events over {users:,} users, "
          f"{partitions} partition(s); appending them to Chronik took {produce_seconds:.2f} s")
    print(f"{'system':58} {'seconds':>8} {'records/s':>12} {'vs Bytewax':>10}")
    report = {"events": n, "users": users, "partitions": partitions,
              "produce_seconds": round(produce_seconds, 3), "oracle_digest": want, "systems": []}
    wrong = []
    for label, seconds, got in rows:
        ratio = base / seconds
        print(f"{label:58} {seconds:8.2f} {n / seconds:12,.0f} {ratio:9.2f}x")
        report["systems"].append({"system": label, "seconds": round(seconds, 3),
                                  "records_per_s": round(n / seconds), "vs_bytewax": round(ratio, 2),
                                  "digest": got})
        if got != want:
            wrong.append(label)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "windows-bench.json").write_text(json.dumps(report, indent=2) + "\n")
    if wrong:
        print(f"WRONG RESULTS (digest differs from the oracle's): {', '.join(wrong)}", file=sys.stderr)
        return 1
    print("every system's results equal the oracle's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
