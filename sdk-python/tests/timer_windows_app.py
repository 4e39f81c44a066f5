"""Clicks per user in tumbling one-minute windows (event time), exactly once, written by hand
with stream-time timers: the test program of the timers, on a data directory and on a
Kafka-protocol cluster (for topologies there, see `examples/clicks_windows.py`).

    python timer_windows_app.py DATA_DIR [--clicks N]
    python timer_windows_app.py kafka://HOST:PORT [--clicks N]

Produces N synthetic clicks (deterministic: user = click mod 97, one click every 50 ms of
event time) to `clicks` (2 partitions, keyed by user), unless an earlier run did. The
application `windows` counts each user's clicks in the current window in its store `open`;
when stream time (the largest click timestamp seen) reaches the end of a window, the timer
emits one record per user to `clicks-per-minute` (key: user, value: {"window_start",
"clicks"}) and clears the store. Then the example reads `clicks-per-minute` back and checks
that the windows add up to the clicks produced, and prints a digest of every window's counts
(the same on a data directory and on a cluster).
"""

import argparse
import hashlib
import json
import sys

import chronik

WINDOW_MS = 60_000
START_MS = 1_700_000_000_000
USERS = 97


class WindowCounter(chronik.Processor):
    """Counts per user until the window closes; state only in the store."""

    def process(self, record, ctx):
        window = ctx.store("open")
        window[record.key] = window.get(record.key, 0) + 1

    def punctuate(self, kind, time, ctx):
        if kind != "stream":
            return
        window = ctx.store("open")
        for user, clicks in window.items():
            ctx.emit_json("clicks-per-minute", user, {"window_start": time - WINDOW_MS, "clicks": clicks})
        for user in window.keys():
            del window[user]

    def close(self, ctx):
        # The last window is still open at a clean stop: it stays in the store and is
        # emitted by a later run once stream time passes its end.
        pass


SETTINGS = {"key_format": "str", "stores": ["open"], "punctuate_stream_ms": WINDOW_MS}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("--clicks", type=int, default=200_000)
    args = parser.parse_args(argv)
    with chronik.connect(args.data_dir, durability="interval:100") as db:
        if "clicks" not in db.list_topics():
            db.create_topic("clicks", partitions=2)
            db.create_topic("clicks-per-minute", partitions=2)
            producer = db.producer("clicks")
            batch = []
            for i in range(args.clicks):
                batch.append((f"user-{i % USERS}", f"/page/{i % 7}", None, START_MS + 50 * i))
                if len(batch) == 10_000 or i == args.clicks - 1:
                    producer.send_batch(batch)
                    batch = []
            db.flush()
        app = chronik.App(db, "windows", input="clicks", **SETTINGS)
        app.processor(WindowCounter)
        stats = app.run_until_caught_up()
        print(f"processed {stats['records']} clicks in {stats['commits']} commits")
        counts = {}  # (window start, user) -> clicks
        for partition in range(2):
            for record in db.consumer("clicks-per-minute", partition=partition):
                window = json.loads(bytes(record.value))
                counts[(window["window_start"], bytes(record.key).decode())] = window["clicks"]
        closed = sum(counts.values())
        windows = {start for start, _ in counts}
        open_now = app.store("open")
        still_open = sum(open_now.values())
        print(f"{len(windows)} windows closed with {closed} clicks; {still_open} clicks in open windows")
        digest = hashlib.sha256(json.dumps([sorted(counts.items()), sorted(open_now.items())]).encode())
        print(f"final state: {len(counts)} user windows, digest {digest.hexdigest()[:16]}")
        produced = sum(db.high_watermark("clicks", p) for p in range(2))
        assert closed + still_open == produced, (closed, still_open, produced)
        print("every click is in exactly one window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
