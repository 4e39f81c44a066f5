"""Bytewax's side of the windowing benchmark: tumbling-window counts per user on event time.

    scripts/install-bytewax
    target/python-venv/bin/python benches/python/bytewax_window.py --events N [--users U]

The events of window_events.py are generated into a list first (not timed), and the list is
frozen out of the garbage collector's sight. What is timed is `run_main(flow)` alone: one
worker, no recovery (nothing persisted), reading the list in batches, converting each
millisecond timestamp to the datetime Bytewax's clock needs, `count_window` over
`TumblingWindower(60 s)` with an `EventClock` that waits `GRACE_MS`, and collecting
`(key, window_start_ms, count)` into a list. The results must equal the oracle's
(`window_events.expected`), checked after the clock stops; otherwise the exit status is 1.

The input is a `DynamicSource` handing out slices of the list: a slice is one C-level copy,
where `TestingSource` runs three `isinstance` checks per item, and a dynamic source has no
partition state to snapshot at each epoch. The input is a small part of the run either way
(about 4% faster than `--source testing` at 10,000 users, the same at 100).

Bytewax's clock asks to be woken at each open window's close time, read as wall-clock time;
event times in 2023 are long past, so by default every key with an open window would be
notified on every activation. Replaying stored events, nothing needs waking: `to_system_utc`
returns None and windows close on later events or at the end of input (`--wakeups` keeps
Bytewax's default).
"""

import argparse
import gc
import importlib.metadata
import json
import sys
import time
from datetime import datetime, timedelta, timezone

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window
from bytewax.testing import TestingSink, TestingSource, run_main

from window_events import GRACE_MS, WINDOW_MS, digest, events, expected

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
BATCH = 10_000


class _ListPartition(StatelessSourcePartition):
    def __init__(self, items, batch_size):
        self._items = items
        self._batch_size = batch_size
        self._next = 0

    def next_batch(self):
        if self._next >= len(self._items):
            raise StopIteration
        start, self._next = self._next, self._next + self._batch_size
        return self._items[start : self._next]


class ListSource(DynamicSource):
    """A list, in slices of `batch_size`, read by worker 0 alone."""

    def __init__(self, items, batch_size=BATCH):
        self._items = items
        self._batch_size = batch_size

    def build(self, step_id, worker_index, worker_count):
        return _ListPartition(self._items if worker_index == 0 else [], self._batch_size)


def event_time(event):
    # Exact: integer milliseconds, no float on the way.
    return EPOCH + timedelta(milliseconds=event[2])


def build_flow(items, results, late, source, wakeups):
    flow = Dataflow("window_count")
    if source == "testing":
        stream = op.input("input", flow, TestingSource(items, batch_size=BATCH))
    else:
        stream = op.input("input", flow, ListSource(items))
    clock = EventClock(
        ts_getter=event_time,
        wait_for_system_duration=timedelta(milliseconds=GRACE_MS),
        **({} if wakeups else {"to_system_utc": lambda _close: None}),
    )
    # Aligned to the epoch, so window id * WINDOW_MS is the window's start.
    windower = TumblingWindower(length=timedelta(milliseconds=WINDOW_MS), align_to=EPOCH)
    windows = count_window("count", stream, clock, windower, key=lambda event: event[0])
    counts = op.map(
        "to_triple",
        windows.down,
        lambda key_window_count: (
            key_window_count[0],
            key_window_count[1][0] * WINDOW_MS,
            key_window_count[1][1],
        ),
    )
    op.output("results", counts, TestingSink(results))
    op.output("late", windows.late, TestingSink(late))
    return flow


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--source", choices=["list", "testing"], default="list")
    parser.add_argument("--wakeups", action="store_true", help="Bytewax's default wake-ups")
    args = parser.parse_args(argv)

    items = list(events(args.events, args.users))
    # The input list is no part of the system under test: keep the collector from rescanning
    # its million tuples each full collection (about 15% of the run otherwise).
    gc.freeze()
    results, late = [], []
    flow = build_flow(items, results, late, args.source, args.wakeups)
    began = time.perf_counter()
    run_main(flow)
    seconds = time.perf_counter() - began

    got = digest(results)
    print(json.dumps({
        "system": "bytewax",
        "version": importlib.metadata.version("bytewax"),
        "events": args.events,
        "users": args.users,
        "source": args.source,
        "wakeups": args.wakeups,
        "seconds": round(seconds, 3),
        "records_per_s": round(args.events / seconds),
        "windows": len(results),
        "late": len(late),
        "digest": got,
    }))
    want = expected(args.events, args.users)
    if late or got != digest(want):
        counted = sum(count for _, _, count in results)
        print(
            f"bytewax_window: wrong results: {len(results)} windows counting {counted} events"
            f" ({len(late)} late), expected {len(want)} windows counting {args.events};"
            f" digest {got}, expected {digest(want)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
