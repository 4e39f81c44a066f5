"""Python processors on the real engine: stores, emits, restore, timers, batches, errors."""

import threading
import time

import pytest

import chronik


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "data")


def produce(db, topic, records, partitions=1):
    if topic not in db.list_topics():
        db.create_topic(topic, partitions=partitions)
    db.producer(topic).send_batch(records)


def read_all(db, topic):
    partitions = len(db.describe_topic(topic)["partitions"])
    out = []
    for partition in range(partitions):
        out.extend((bytes(r.key), bytes(r.value)) for r in db.consumer(topic, partition=partition))
    return out


def counter_app(db, **settings):
    app = chronik.App(db, "counter", input="clicks", stores=["counts"], key_format="str", **settings)

    @app.processor
    def count(record, ctx):
        counts = ctx.store("counts")
        counts[record.key] = counts.get(record.key, 0) + 1
        ctx.emit("totals", record.key, counts[record.key])

    return app


def test_counts_are_exact_and_restored_after_a_reopen(path):
    with chronik.open(path) as db:
        produce(db, "clicks", [(f"user-{i % 10}", b"/") for i in range(1000)], partitions=3)
        db.create_topic("totals", partitions=3)
        app = counter_app(db)
        stats = app.run_until_caught_up()
        assert stats["records"] == 1000 and stats["emitted"] == 1000
        assert app.store("counts") == {f"user-{u}": 100 for u in range(10)}
    with chronik.open(path) as db:
        produce(db, "clicks", [(f"user-{i % 10}", b"/") for i in range(500)])
        app = counter_app(db)
        stats = app.run_until_caught_up()
        assert stats["records"] == 500
        assert stats["restored"] == 10 or stats["snapshots_loaded"] == 3
        assert app.store("counts") == {f"user-{u}": 150 for u in range(10)}
        # One output per input, each key's totals in order.
        totals = read_all(db, "totals")
        assert len(totals) == 1500
        for u in range(10):
            mine = [int(v) for k, v in totals if k == f"user-{u}".encode()]
            assert mine == list(range(1, 151))


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_store_behaves_like_a_dict(path, kind):
    seen = {}
    stores = {"j": f"json+{kind}", "b": f"bytes+{kind}"}
    with chronik.open(path) as db:
        produce(db, "in", [(None, b"go")])
        app = chronik.App(db, "dicts", input="in", stores=stores)

        @app.processor
        def use_stores(record, ctx):
            j = ctx.store("j")
            j["a"] = {"n": 1, "list": [1, 2.5, None, True, "x"]}
            j["b"] = 2
            j["c"] = "three"
            seen["get"] = (j["a"], j.get("missing"), j.get("missing", 7))
            seen["contains"] = ("a" in j, "zz" in j)
            seen["len"] = len(j)
            seen["keys"] = list(j)
            seen["items"] = j.items()
            seen["range"] = j.range("b", None)
            seen["pop"] = (j.pop("c"), j.pop("c", "gone"))
            del j["b"]
            with pytest.raises(KeyError):
                j["b"]
            with pytest.raises(KeyError):
                del j["b"]
            with pytest.raises(TypeError):
                j["bad"] = object()
            j["d"] = 4
            j.discard("d")
            j.discard("never-there")
            seen["after_discard"] = ("d" in j, len(j), j.len_estimate())
            b = ctx.store("b")
            b[b"k"] = b"\x00\xff"
            b[b"empty"] = b""
            seen["bytes"] = (b[b"k"], b[b"empty"], b"empty" in b)
            seen["store"] = j

        app.run_until_caught_up()
        assert seen["get"] == ({"n": 1, "list": [1, 2.5, None, True, "x"]}, None, 7)
        assert seen["contains"] == (True, False)
        assert seen["len"] == 3
        assert seen["keys"] == ["a", "b", "c"]
        assert [k for k, _ in seen["items"]] == ["a", "b", "c"]
        assert seen["range"] == [("b", 2), ("c", "three")]
        assert seen["pop"] == ("three", "gone")
        # `discard` deletes without reading; `len` is exact, `len_estimate` (no read) too
        # while everything is in memory.
        assert seen["after_discard"] == (False, 1, 1)
        assert seen["bytes"] == (b"\x00\xff", b"", True)
        # A store kept past its call refuses to be used.
        with pytest.raises(chronik.ChronikError):
            len(seen["store"])
        assert app.store("j") == {"a": {"n": 1, "list": [1, 2.5, None, True, "x"]}}
    with chronik.open(path) as db:
        app = chronik.App(db, "dicts", input="in", stores=stores)
        app.processor(lambda record, ctx: None)
        # The empty value survives the restore: it is not a tombstone.
        assert app.store("b") == {b"k": b"\x00\xff", b"empty": b""}


def test_a_handler_exception_propagates_and_nothing_of_it_commits(path):
    with chronik.open(path) as db:
        produce(db, "clicks", [("u", str(i)) for i in range(100)])
        db.create_topic("totals")
        app = chronik.App(db, "fragile", input="clicks", stores=["counts"], value_format="str")

        @app.processor
        def fragile(record, ctx):
            counts = ctx.store("counts")
            counts["n"] = counts.get("n", 0) + 1
            ctx.emit("totals", None, str(counts["n"]))
            if record.value == "50":
                raise ValueError("bad record 50")

        with pytest.raises(ValueError, match="bad record 50"):
            app.run_until_caught_up()
        # The failed batch did not commit: no output of it, and the next run redoes it.
        assert read_all_values(db, "totals") == []
        seen = []
        app2 = chronik.App(db, "fragile", input="clicks", stores=["counts"], value_format="str")

        @app2.processor
        def fixed(record, ctx):
            counts = ctx.store("counts")
            counts["n"] = counts.get("n", 0) + 1
            seen.append(record.value)

        app2.run_until_caught_up()
        assert seen == [str(i) for i in range(100)]
        assert app2.store("counts") == {"n": 100}


def read_all_values(db, topic):
    return [bytes(r.value) for r in db.consumer(topic)]


def test_tumbling_windows_with_stream_time_timers_and_a_processor_class(path):
    class Window(chronik.Processor):
        def __init__(self):
            self.inits = 0

        def init(self, ctx):
            self.inits += 1
            assert ctx.partition == 0

        def process(self, record, ctx):
            w = ctx.store("w")
            w["n"] = w.get("n", 0) + 1

        def punctuate(self, kind, time, ctx):
            w = ctx.store("w")
            ctx.emit_json("windows", None, {"end": time, "n": w.pop("n", 0)})

    with chronik.open(path) as db:
        db.create_topic("events")
        db.create_topic("windows")
        base = 1_000_000
        # 25 events 100 ms apart: windows of 1 s hold 10, 10, and 5 left open.
        records = [(None, b"e", None, base + 100 * i) for i in range(25)]
        db.producer("events").send_batch(records)
        app = chronik.App(db, "win", input="events", stores=["w"], punctuate_stream_ms=1000)
        app.processor(Window)
        app.run_until_caught_up()
        import json

        windows = [json.loads(v) for v in read_all_values(db, "windows")]
        assert windows == [{"end": base + 1000, "n": 10}, {"end": base + 2000, "n": 10}]
        assert app.store("w") == {"n": 5}


def test_batch_handlers_get_lists_and_stream_time(path):
    sizes = []
    with chronik.open(path, durability="os") as db:
        db.create_topic("in")
        db.producer("in").send_batch([(None, str(i), None, 1000 + i) for i in range(5000)])
        app = chronik.App(db, "batches", input="in", stores=["sum"], value_format="str")

        @app.processor(batch=True)
        def add(records, ctx):
            sizes.append(len(records))
            s = ctx.store("sum")
            s["total"] = s.get("total", 0) + sum(int(r.value) for r in records)
            assert ctx.stream_time >= records[0].timestamp

        app.run_until_caught_up()
        assert sum(sizes) == 5000 and max(sizes) <= 1024 and len(sizes) < 50
        assert app.store("sum") == {"total": sum(range(5000))}


def test_run_stops_from_another_thread_and_commits(path):
    with chronik.open(path, durability="os") as db:
        produce(db, "clicks", [(f"user-{i % 3}", b"/") for i in range(300)], partitions=2)
        db.create_topic("totals", partitions=2)
        app = counter_app(db, threads=2)
        stopper = threading.Timer(0.5, app.stop)
        stopper.start()
        stats = app.run()
        stopper.join()
        assert stats["records"] == 300
        assert sum(app.positions()) == 300
        # run_for processes what arrives meanwhile, then stops cleanly.
        db.producer("clicks").send_batch([("user-0", b"/")] * 7)
        assert app.run_for(0.3)["records"] == 7
        assert app.store("counts")["user-0"] == 107


def test_bad_setups_are_typed_errors(path):
    with chronik.open(path) as db:
        missing = chronik.App(db, "x", input="missing", stores=["s"])
        missing.processor(lambda record, ctx: None)
        with pytest.raises(chronik.NotFoundError):
            missing.run_until_caught_up()
        db.create_topic("in")
        with pytest.raises(chronik.InvalidArgumentError):  # at construction, not at the run
            chronik.App(db, "x", input="in", stores={"s": "yaml"})
        empty = chronik.App(db, "x", input="in")
        with pytest.raises(ValueError):
            empty.run_until_caught_up()
        with pytest.raises(TypeError):
            empty.processor(object())

        class NoProcess:
            pass

        no_process = chronik.App(db, "y", input="in")
        no_process.processor(NoProcess)
        with pytest.raises(chronik.InvalidArgumentError):
            no_process.run_until_caught_up()


# The child takes Python's own Ctrl-C handler even when it inherits SIGINT ignored (a shell
# starts background jobs so, and Python then installs no handler).
CTRL_C_SCRIPT = """
import signal, sys, chronik
signal.signal(signal.SIGINT, signal.default_int_handler)
with chronik.open(sys.argv[1], durability="os") as db:
    db.create_topic("clicks", partitions=2)
    db.create_topic("totals", partitions=2)
    db.producer("clicks").send_batch([(f"user-{i % 3}", b"/") for i in range(500)])
    app = chronik.App(db, "counter", input="clicks", stores=["counts"], key_format="str")

    @app.processor
    def count(record, ctx):
        counts = ctx.store("counts")
        counts[record.key] = counts.get(record.key, 0) + 1

    print("running", flush=True)
    try:
        app.run()
    except KeyboardInterrupt:
        print("interrupted", sum(app.positions()), flush=True)
        sys.exit(3)
    print("returned without an interrupt", flush=True)
"""


def test_ctrl_c_stops_run_cleanly_and_raises_keyboard_interrupt(path):
    import signal
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, path], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "running"
    time.sleep(0.5)  # the 500 clicks are processed well before this; run() then waits
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 3, out
    assert out.split() == ["interrupted", "500"]
    # What the interrupted run processed was committed: a new run has nothing left to do.
    with chronik.open(path) as db:
        app = chronik.App(db, "counter", input="clicks", stores=["counts"], key_format="str")
        app.processor(lambda record, ctx: None)
        assert app.run_until_caught_up()["records"] == 0
        assert app.store("counts") == {"user-0": 167, "user-1": 167, "user-2": 166}


def test_metrics_count_appends_reads_and_restores(path):
    with chronik.open(path, durability="os") as db:
        produce(db, "clicks", [(f"user-{i % 3}", b"/") for i in range(300)])
        db.create_topic("totals")
        counter_app(db).run_until_caught_up()
        metrics = db.metrics()
        assert metrics["records_appended"] >= 300 + 300  # the clicks, then the totals
        # One latency per append call or transaction; a transaction appends a batch per partition.
        assert 0 < metrics["append_latency"]["count"] <= metrics["appends"]
        assert metrics["fetches"] > 0 and metrics["bytes_read"] > 0
        assert metrics["restore_records"] == 0
        text = db.metrics_prometheus()
        assert f"chronik_appends_total {metrics['appends']}\n" in text
        assert "# TYPE chronik_fsync_latency_seconds histogram" in text
    with chronik.open(path) as db:
        app = counter_app(db)
        app.run_until_caught_up()  # restores the counts from the changelog first
        metrics = db.metrics()
        assert metrics["restores_done"] == 1
        assert 3 <= metrics["restore_records"] <= 300, metrics
