"""The Python SDK beside the Rust SDK and Redis Streams (redis-py), in one run.

    scripts/bench-python [--records N] [--clicks N] [--out DIR]

Two workloads, each done three ways on this machine:

1. **send_batch**: N records with 100 B values and 13 B keys, in batches of 10,000, to one
   partition; durability "os" (acknowledged once written to the OS, then one fsync at the
   end, which is timed). Rust SDK: the same records through `Chronik::append`
   (`chronik-sdk-work produce`). Redis: XADD of the same key and value, pipelined 10,000 per
   round trip, appendfsync everysec.
2. **stateful count**: N clicks (100 B values, keys `user-%08d` over 100,000 users, 4
   partitions) counted per user by a per-record handler, `counts[user] = counts.get(user, 0)
   + 1`, in a store backed by a compacted changelog, committing exactly once every 100 ms, on
   one thread. Rust SDK: the same handler through `ctx.typed::<String, u64>` (same JSON
   encoding). Redis: XREAD 10,000 entries at a time and HINCRBY per entry, pipelined per
   read (the count lives in Redis; no exactly-once).

Prints a table and writes `python-bench.json` to `--out` (default target/bench). Peers that
are missing (redis-server, the redis package) are reported as skipped, never faked.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import chronik

ROOT = Path(__file__).resolve().parents[2]
SDK_WORK = ROOT / "target" / "release" / "chronik-sdk-work"
VALUE = b"\x42" * 100
USERS = 100_000
BATCH = 10_000


def key_of(i):
    return f"user-{(i * 7919) % USERS:08d}"


def python_send_batch(directory, records):
    with chronik.open(str(directory), durability="os") as db:
        db.create_topic("py-sends")
        producer = db.producer("py-sends")
        batch = [(f"user-{i % USERS:08d}", VALUE) for i in range(BATCH)]
        started = time.perf_counter()
        sent = 0
        while sent < records:
            n = min(BATCH, records - sent)
            producer.send_batch(batch if n == BATCH else batch[:n], partition=0)
            sent += n
        db.flush()
        elapsed = time.perf_counter() - started
        assert db.high_watermark("py-sends", 0) == records
    return records, elapsed


def rust(*args):
    out = subprocess.run([str(SDK_WORK), *map(str, args)], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["records"], result["seconds"]


def make_clicks(directory, clicks):
    with chronik.open(str(directory), durability="os") as db:
        db.create_topic("clicks", partitions=4)
        producer = db.producer("clicks")
        for start in range(0, clicks, BATCH):
            producer.send_batch([(key_of(i), VALUE) for i in range(start, min(clicks, start + BATCH))])
        db.flush()


def python_count(directory, clicks):
    with chronik.open(str(directory), durability="os") as db:
        app = chronik.App(db, "py-count", input="clicks", stores=["counts"], key_format="str")

        @app.processor
        def count(record, ctx):
            counts = ctx.store("counts")
            counts[record.key] = counts.get(record.key, 0) + 1

        started = time.perf_counter()
        stats = app.run_until_caught_up()
        elapsed = time.perf_counter() - started
        assert stats["records"] == clicks, stats
        total = sum(app.store("counts", p) and sum(app.store("counts", p).values()) for p in range(4))
        assert total == clicks, total
    return clicks, elapsed


class Redis:
    """A redis-server of its own on a free port, append-only with appendfsync everysec."""

    def __init__(self, directory):
        import redis  # noqa: F401  (checked before the server starts)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(port=self.port)
        deadline = time.time() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.02)

    def close(self):
        self.process.terminate()
        self.process.wait(10)


def redis_xadd(redis_server, records):
    client = redis_server.client
    keys = [f"user-{i % USERS:08d}" for i in range(BATCH)]
    started = time.perf_counter()
    sent = 0
    while sent < records:
        n = min(BATCH, records - sent)
        pipe = client.pipeline(transaction=False)
        for key in keys[:n]:
            pipe.xadd("sends", {key: VALUE})
        pipe.execute()
        sent += n
    elapsed = time.perf_counter() - started
    assert client.xlen("sends") == records
    return records, elapsed


def redis_count(redis_server, clicks):
    client = redis_server.client
    for start in range(0, clicks, BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(clicks, start + BATCH)):
            pipe.xadd("clicks", {"user": key_of(i), "v": VALUE})
        pipe.execute()
    started = time.perf_counter()
    last = "0-0"
    counted = 0
    while counted < clicks:
        reply = client.xread({"clicks": last}, count=BATCH)
        if not reply:
            break
        entries = reply[0][1]
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in entries:
            pipe.hincrby("counts", fields[b"user"], 1)
        pipe.execute()
        last = entries[-1][0]
        counted += len(entries)
    elapsed = time.perf_counter() - started
    assert counted == clicks and sum(int(v) for v in client.hvals("counts")) == clicks
    return clicks, elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="records for send_batch")
    parser.add_argument("--clicks", type=int, default=1_000_000, help="clicks for the count")
    parser.add_argument("--out", default=str(ROOT / "target" / "bench"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="chronik-pybench-", dir=os.environ.get("CHRONIK_BENCH_DIR")))
    results = {}

    def measure(workload, system, run):
        try:
            records, seconds = run()
            results.setdefault(workload, {})[system] = records / seconds
        except Exception as e:  # a missing peer is reported, never faked
            results.setdefault(workload, {})[system] = None
            print(f"{workload} / {system}: skipped: {e}", file=sys.stderr)

    try:
        measure("send_batch 100 B", "python", lambda: python_send_batch(base / "py-send", args.records))
        measure("send_batch 100 B", "rust", lambda: rust("produce", base / "rust-send", "--records",
                                                          args.records, "--users", USERS))
        make_clicks(base / "clicks", args.clicks)
        measure("stateful count", "python", lambda: python_count(base / "clicks", args.clicks))
        measure("stateful count", "rust", lambda: rust("count", base / "clicks", "--application",
                                                        "rust-count", "--records", args.clicks))
        redis_server = None
        try:
            if shutil.which("redis-server") is None:
                raise RuntimeError("redis-server is not installed")
            (base / "redis").mkdir()
            redis_server = Redis(base / "redis")
        except Exception as e:
            print(f"redis: skipped: {e}", file=sys.stderr)
        if redis_server is not None:
            try:
                measure("send_batch 100 B", "redis", lambda: redis_xadd(redis_server, args.records))
                measure("stateful count", "redis", lambda: redis_count(redis_server, args.clicks))
            finally:
                redis_server.close()
        else:
            results["send_batch 100 B"]["redis"] = None
            results["stateful count"]["redis"] = None
    finally:
        shutil.rmtree(base, ignore_errors=True)

    targets = {"send_batch 100 B": 1_000_000, "stateful count": 300_000}
    print(f"{'workload':<18} {'python rec/s':>13} {'rust rec/s':>13} {'redis rec/s':>13} "
          f"{'py/rust':>8} {'py/redis':>9} {'target':>10}")
    rows = []
    for workload, by_system in results.items():
        py, rs, rd = (by_system.get(s) for s in ("python", "rust", "redis"))
        fmt = lambda v: f"{v:,.0f}" if v else "skipped"  # noqa: E731
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
        met = "met" if py and py >= targets[workload] else "MISSED"
        print(f"{workload:<18} {fmt(py):>13} {fmt(rs):>13} {fmt(rd):>13} {ratio(py, rs):>8} "
              f"{ratio(py, rd):>9} {targets[workload]:>9,} {met}")
        rows.append({"workload": workload, "python": py, "rust": rs, "redis": rd,
                     "target": targets[workload]})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "python-bench.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
