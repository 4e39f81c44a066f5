"""Disk stores from Python: `stores={"counts": "disk"}` (or `store_kind="disk"`), restarted
from the store and the changelog after it, under the simulator's crashes, and bad specs."""

import pytest

import chronik
from chronik.testing import simulate


def count(record, ctx):
    counts = ctx.store("counts")
    counts[record.key] = counts.get(record.key, 0) + 1
    ctx.emit("totals", record.key, counts[record.key])


def test_a_disk_store_counts_and_restarts_from_itself(tmp_path):
    path = str(tmp_path / "data")
    records = [(f"user-{i % 500}", b"/") for i in range(5000)]
    with chronik.open(path) as db:
        db.create_topic("clicks", partitions=2)
        db.create_topic("totals", partitions=2)
        db.producer("clicks").send_batch(records)
        app = chronik.App(db, "c", input="clicks", stores={"counts": "disk:1"}, key_format="str")
        app.processor(count)
        stats = app.run_until_caught_up()
        assert stats["records"] == 5000 and stats["stores_rebuilt"] == 0
        assert app.store("counts") == {f"user-{u}": 10 for u in range(500)}
    with chronik.open(path) as db:
        db.producer("clicks").send_batch(records[:1000])
        app = chronik.App(db, "c", input="clicks", stores=["counts"], store_kind="disk:1",
                          key_format="str")
        app.processor(count)
        stats = app.run_until_caught_up()
        # Both partitions' stores opened with their state: the changelog after it was empty.
        assert stats["stores_opened"] == 2 and stats["restored"] == 0
        assert stats["records"] == 1000
        expected = {f"user-{u}": 12 for u in range(500)}
        assert app.store("counts") == expected


def test_stores_and_partitions_share_one_small_memory_budget(tmp_path):
    # 2 stores x 4 partitions in a 1 MiB budget: memtables flush early and often, the shared
    # cache evicts, and every count still comes out exact after a restart.
    def both(record, ctx):
        for name in ("counts", "lengths"):
            store = ctx.store(name)
            store[record.key] = store.get(record.key, 0) + (1 if name == "counts" else 2)

    path = str(tmp_path / "data")
    records = [(f"user-{i % 3000}", b"/") for i in range(30_000)]
    settings = dict(input="clicks", stores={"counts": "disk", "lengths": "disk"},
                    key_format="str", store_memory_mib=1)
    with chronik.open(path) as db:
        db.create_topic("clicks", partitions=4)
        db.producer("clicks").send_batch(records)
        app = chronik.App(db, "m", **settings)
        app.processor(both)
        assert app.run_until_caught_up()["records"] == 30_000
    with chronik.open(path) as db:
        app = chronik.App(db, "m", **settings)
        app.processor(both)
        stats = app.run_until_caught_up()
        assert stats["stores_opened"] == 8 and stats["stores_rebuilt"] == 0
        assert app.store("counts") == {f"user-{u}": 10 for u in range(3000)}
        assert app.store("lengths") == {f"user-{u}": 20 for u in range(3000)}


def test_disk_stores_restore_exactly_under_simulated_crashes():
    words = [f"w{i % 37}" for i in range(600)]
    report = simulate(
        count,
        input="words",
        records=[(w, b"") for w in words],
        input_partitions=3,
        outputs={"totals": 3},
        stores={"counts": "json+disk"},
        key_format="str",
        seeds=20,
    )
    assert report["seeds"] == 20 and report["crashes"] > 0


def test_a_bad_store_spec_is_a_typed_error(tmp_path):
    with chronik.open(str(tmp_path / "data")) as db:
        db.create_topic("in")
        for stores, settings in [({"s": "json+flash"}, {}), ({"s": "disk:0"}, {}),
                                 (["s"], {"store_kind": "tape"}),
                                 (["s"], {"store_kind": "disk", "store_memory_mib": 0}),
                                 (["s"], {"store_kind": "disk", "store_memory_mib": -1})]:
            # Refused by the constructor, not at the first run.
            with pytest.raises(chronik.InvalidArgumentError):
                chronik.App(db, "x", input="in", stores=stores, **settings)
