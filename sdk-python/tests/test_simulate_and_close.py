"""chronik.testing.simulate against right and wrong processors; closing releases everything."""

import pytest

import chronik
from chronik.testing import SimulationFailure, simulate


class Counter(chronik.Processor):
    def process(self, record, ctx):
        counts = ctx.store("counts")
        counts[record.key] = counts.get(record.key, 0) + 1
        ctx.emit("totals", record.key, counts[record.key])


class AttributeCounter(chronik.Processor):
    """Wrong: counts in an attribute are lost at a crash."""

    def __init__(self):
        self.counts = {}

    def process(self, record, ctx):
        self.counts[record.key] = self.counts.get(record.key, 0) + 1
        ctx.store("counts")[record.key] = self.counts[record.key]


RECORDS = [(f"k{i % 7}", b"x") for i in range(150)]


def test_a_store_backed_counter_passes_with_crashes_and_snapshots():
    report = simulate(
        Counter,
        input="clicks",
        stores=["counts"],
        key_format="str",
        records=RECORDS,
        input_partitions=2,
        outputs={"totals": 2},
        seeds=range(100, 140),
    )
    assert report["seeds"] == 40 and report["crashes"] >= 20
    assert report["records_processed"] > 0


def test_state_kept_in_attributes_fails_and_names_its_seed():
    with pytest.raises(SimulationFailure) as failure:
        simulate(
            AttributeCounter,
            input="clicks",
            stores=["counts"],
            key_format="str",
            records=RECORDS,
            seeds=40,
        )
    assert failure.value.kind == "state"
    assert isinstance(failure.value.seed, int)
    assert f"CHRONIK_SIM_SEED={failure.value.seed}" in str(failure.value)


def test_a_processor_that_raises_fails_as_a_run_failure():
    def broken(record, ctx):
        raise RuntimeError("boom")

    with pytest.raises(SimulationFailure, match="boom"):
        simulate(broken, input="in", records=[(None, b"x")], seeds=1)


def test_an_app_is_simulated_with_its_own_settings(tmp_path):
    with chronik.open(str(tmp_path / "d")) as db:
        app = chronik.App(db, "c", input="clicks", stores=["counts"], key_format="str")
        app.processor(Counter)
        report = simulate(app, records=RECORDS, outputs={"totals": 1}, seeds=10)
        assert report["seeds"] == 10


def test_close_releases_the_directory_held_by_producers_consumers_and_apps(tmp_path):
    path = str(tmp_path / "data")
    db = chronik.open(path)
    db.create_topic("clicks")
    db.create_topic("totals")
    producer = db.producer("clicks")
    producer.send("k", b"v")
    consumer = db.consumer("clicks")
    app = chronik.App(db, "c", input="clicks", stores=["counts"], key_format="str")
    app.processor(Counter)
    app.run_until_caught_up()
    db.close()
    with pytest.raises(chronik.ClosedError):
        producer.send("k", b"v")
    with pytest.raises(chronik.ClosedError):
        consumer.poll()
    with pytest.raises(chronik.ClosedError):
        app.run_until_caught_up()
    with chronik.open(path) as again:
        assert again.high_watermark("clicks", 0) == 1
