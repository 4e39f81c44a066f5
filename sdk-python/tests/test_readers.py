"""Readers and writers at the edges: a consumer over a compacted topic whose early batches
compaction emptied, Ctrl-C during `poll(timeout=...)`, a read-only open beside a writing
process, batches past the engine's limits, settings refused at construction, and damage in
the committed offsets reported as damage."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import chronik


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "data")


def compacted_topic(db, name="changelog"):
    """100 keys written 6 times (in small segments), then 3 unkeyed records, compacted: the
    early batches hold no record any more. Returns the latest value per key."""
    db.create_topic(name, config={"segment_bytes": 4096, "cleanup": "compact"})
    producer = db.producer(name)
    latest = {}
    for round_ in range(6):
        for key in range(100):
            value = f"v{round_}-{key}-" + "x" * 20
            producer.send(f"k{key}", value, partition=0)
            latest[f"k{key}"] = value
    for i in range(3):
        producer.send(None, f"unkeyed-{i}", partition=0)
    kept = db.compact_topic(name)
    assert kept[0] is not None and kept[0] < 600, kept
    return latest


def test_iteration_and_poll_read_past_batches_compaction_emptied(path):
    with chronik.open(path) as db:
        latest = compacted_topic(db)
        high_watermark = db.high_watermark("changelog", 0)
        # The premise: the first fetches hold no record at all.
        assert db.describe_topic("changelog")["partitions"][0]["log_start_offset"] == 0

        def check(records):
            keyed = {bytes(r.key).decode(): bytes(r.value).decode() for r in records if r.key}
            assert keyed == latest
            unkeyed = [bytes(r.value).decode() for r in records if r.key is None]
            assert unkeyed == ["unkeyed-0", "unkeyed-1", "unkeyed-2"]
            offsets = [r.offset for r in records]
            assert offsets == sorted(set(offsets))

        consumer = db.consumer("changelog", partition=0)
        check(list(consumer))
        assert consumer.position == high_watermark

        polled, consumer = [], db.consumer("changelog", partition=0)
        while batch := consumer.poll():
            polled.extend(batch)
        check(polled)
        assert consumer.position == high_watermark
        assert consumer.poll() == []

        one_at_a_time, consumer = [], db.consumer("changelog", partition=0)
        while batch := consumer.poll(max_records=1, timeout=0.01):
            one_at_a_time.extend(batch)
        check(one_at_a_time)


def test_poll_with_a_timeout_returns_records_appended_while_it_waits(path):
    with chronik.open(path) as db:
        db.create_topic("t")
        consumer = db.consumer("t")
        assert consumer.poll(timeout=0.05) == []
        import threading

        timer = threading.Timer(0.5, lambda: db.producer("t").send(None, b"late"))
        timer.start()
        started = time.monotonic()
        records = consumer.poll(timeout=30)
        timer.join()
        assert [bytes(r.value) for r in records] == [b"late"]
        assert time.monotonic() - started < 10


# The child installs Python's own Ctrl-C handler (it may inherit SIGINT ignored, as background
# jobs of a shell do), then waits in poll for an hour on a topic nobody writes.
POLL_CTRL_C_SCRIPT = """
import signal, sys, time, chronik
signal.signal(signal.SIGINT, signal.default_int_handler)
with chronik.open(sys.argv[1]) as db:
    db.create_topic("quiet")
    consumer = db.consumer("quiet")
    print("polling", flush=True)
    started = time.monotonic()
    try:
        consumer.poll(timeout=3600)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    print("returned after", time.monotonic() - started, flush=True)
"""


def test_ctrl_c_interrupts_poll_with_a_timeout_within_a_second(path):
    child = subprocess.Popen(
        [sys.executable, "-c", POLL_CTRL_C_SCRIPT, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "polling"
        time.sleep(0.5)  # into the wait
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().strip()
        answered = time.monotonic() - sent
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert (line, child.returncode) == ("interrupted", 3), (line, out)
    # The wait is cut in 0.2 s slices; the rest is slack for a loaded machine.
    assert answered < 2, answered


WRITER_SCRIPT = """
import sys, chronik
with chronik.open(sys.argv[1]) as db:
    db.create_topic("events", partitions=1)
    producer = db.producer("events")
    producer.send_batch([(None, f"first-{i}") for i in range(100)])
    print("written", flush=True)
    sys.stdin.readline()
    producer.send_batch([(None, f"second-{i}") for i in range(50)])
    print("written", flush=True)
    sys.stdin.readline()
"""


def test_a_read_only_open_reads_beside_a_writer_and_refuses_writes(path):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "written"
        with pytest.raises(chronik.LockedError):
            chronik.open(path)
        with chronik.open(path, read_only=True) as db:
            assert db.read_only
            consumer = db.consumer("events")
            assert [bytes(r.value).decode() for r in consumer] == [
                f"first-{i}" for i in range(100)
            ]
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written"
            # A caught-up consumer of a read-only open looks for what the writer appended.
            later = []
            deadline = time.monotonic() + 30
            while len(later) < 50 and time.monotonic() < deadline:
                later.extend(bytes(r.value).decode() for r in consumer.poll(timeout=1))
            assert later == [f"second-{i}" for i in range(50)]
            db.refresh()
            assert db.high_watermark("events", 0) == 150
            writes = [
                lambda: db.producer("events").send(None, b"refused"),
                lambda: db.producer("events").send_batch([(None, b"refused")]),
                lambda: db.create_topic("new"),
                lambda: db.delete_topic("events"),
                lambda: db.consumer("events", group="g").commit(),
            ]
            for write in writes:
                with pytest.raises(chronik.ReadOnlyError, match="read-only"):
                    write()
        writer.stdin.write("done\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
        writer.wait()
    with chronik.open(path) as db:
        assert db.high_watermark("events", 0) == 150, "the refused writes left nothing"


# The engine's limits: 16 MiB of encoded batch, 2**20 records.
BATCH_BYTES_MAX = 16 << 20
BATCH_RECORDS_MAX = 1 << 20


def test_send_batch_splits_a_batch_past_the_engine_limits(path):
    with chronik.open(path, durability="os") as db:
        db.create_topic("big", partitions=2)
        producer = db.producer("big")
        value = b"v" * (1 << 20)
        # 40 MiB for partition 0: three batches, in order; one small record for partition 1.
        records = [(None, value + bytes([i])) for i in range(40)]
        batches = producer.send_batch(records, partition=0)
        assert len(batches) == 3, batches
        assert [b[0] for b in batches] == [0, 0, 0]
        assert batches[0][1] == 0 and batches[-1][2] == 39
        assert all(a[2] + 1 == b[1] for a, b in zip(batches, batches[1:])), batches
        assert [bytes(r.value)[-1] for r in db.consumer("big", partition=0)] == list(range(40))
        # Past the record count limit (empty records pass the byte limit first).
        many = producer.send_batch([(None, b"")] * (BATCH_RECORDS_MAX + 1), partition=1)
        counts = [last - first + 1 for p, first, last in many]
        assert len(many) == 2 and all(p == 1 for p, _, _ in many), many
        assert sum(counts) == BATCH_RECORDS_MAX + 1 and max(counts) <= BATCH_RECORDS_MAX
        assert db.high_watermark("big", 1) == BATCH_RECORDS_MAX + 1
        # A record too large for any batch is refused, saying why; nothing of its batch is
        # appended before it.
        with pytest.raises(chronik.InvalidArgumentError, match="exceeds the maximum"):
            producer.send_batch([(None, b"x" * BATCH_BYTES_MAX)], partition=0)
        assert db.high_watermark("big", 0) == 40


@pytest.mark.parametrize(
    "settings",
    [
        {"stores": {"counts": "yaml"}},
        {"stores": {"counts": "json+tape"}},
        {"stores": {"counts": "disk:lots"}},
        {"stores": ["counts", "counts"]},
        {"key_format": "xml"},
        {"value_format": "pickle"},
        {"store_kind": "tape"},
        {"threads": 0},
        {"commit_interval_ms": 0},
    ],
)
def test_an_app_refuses_bad_settings_at_construction(path, settings):
    with chronik.open(path) as db:
        db.create_topic("in")
        with pytest.raises(chronik.InvalidArgumentError):
            chronik.App(db, "app", input="in", **settings)


@pytest.mark.parametrize(
    "settings",
    [
        {"key_format": "xml"},
        {"value_format": "pickle"},
        {"store_kind": "tape"},
        {"threads": 0},
        {"commit_interval_ms": 0},
        {"no_such_setting": 1},
    ],
)
def test_a_topology_refuses_bad_settings_at_construction(path, settings):
    with chronik.open(path) as db:
        with pytest.raises(chronik.InvalidArgumentError):
            chronik.Topology(db, "topology", **settings)
        with pytest.raises(chronik.InvalidArgumentError):
            chronik.Topology(None, "simulated", **settings)


def damage_consumer_offsets(path):
    """Flip a bit in the last byte of the committed offsets' segment (a commit's checksum), and
    leave the directory as a writer killed before its close leaves it (no clean-shutdown mark,
    no recovery point over the damage), so that the open reads the damaged end."""
    segment = os.path.join(path, "topics", "__consumer_offsets", "0", "00000000000000000000.log")
    for leftover in [
        os.path.join(path, "clean.shutdown"),
        segment[: -len(".log")] + ".index",
        segment[: -len(".log")] + ".timeindex",
    ]:
        if os.path.exists(leftover):
            os.remove(leftover)
    with open(segment, "r+b") as file:
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
        file.seek(-1, os.SEEK_END)
        file.write(bytes([last[0] ^ 0x20]))
    return segment


def test_damage_in_the_committed_offsets_reaches_python_as_corruption(path):
    with chronik.open(path) as db:
        db.create_topic("t")
        db.producer("t").send_batch([(None, f"{i}") for i in range(10)])
        consumer = db.consumer("t", group="g")
        consumer.poll(max_records=5)
        consumer.commit()
        consumer.poll(max_records=2)
        consumer.commit()
    damage_consumer_offsets(path)
    with chronik.open(path) as db:
        # The group's position is unknown: a group consumer is refused, naming the damage.
        with pytest.raises(chronik.CorruptionError, match="checksum mismatch") as caught:
            db.consumer("t", group="g")
        assert "__consumer_offsets" in str(caught.value)
        # An application's commit meets the damage at the offsets topic's end.
        app = chronik.App(db, "app", input="t", stores=["s"])
        app.processor(lambda record, ctx: None)
        with pytest.raises(chronik.CorruptionError):
            app.run_until_caught_up()
        # Reading without a group works as before.
        assert len(list(db.consumer("t"))) == 10
