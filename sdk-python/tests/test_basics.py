"""The Python package against the real engine: topics, producing, consuming, groups, errors."""

import pytest

import chronik


@pytest.fixture
def db(tmp_path):
    with chronik.open(str(tmp_path / "data")) as opened:
        yield opened


def test_produce_and_consume_round_trip_with_keys_headers_and_timestamps(db):
    db.create_topic("clicks", partitions=2)
    producer = db.producer("clicks")
    partition, offset = producer.send(b"user-1", b"/home", headers={"source": b"web"})
    assert offset == 0
    partition_again, next_offset = producer.send("user-1", "/cart")
    assert (partition_again, next_offset) == (partition, 1)
    records = list(db.consumer("clicks", partition=partition))
    assert [r.offset for r in records] == [0, 1]
    assert [bytes(r.value) for r in records] == [b"/home", b"/cart"]
    assert bytes(records[0].key) == b"user-1"
    assert records[0].headers == [(b"source", b"web")]
    assert records[0].timestamp > 0
    assert isinstance(records[0].value, memoryview)


def test_send_async_keeps_many_in_flight_in_order(db):
    db.create_topic("pipelined", partitions=2)
    producer = db.producer("pipelined")
    pending = [producer.send_async(f"k{i % 7}", f"v{i}") for i in range(2000)]
    producer.flush()
    assert all(p.done() for p in pending), "flush waits for everything queued before it"
    per_partition = {}
    for i, p in enumerate(pending):
        partition, offset = p.result()
        assert partition == p.partition
        per_partition.setdefault(partition, []).append((offset, f"v{i}"))
    for partition, sent in per_partition.items():
        assert [offset for offset, _ in sent] == list(range(len(sent))), "order of the calls"
        values = [bytes(r.value).decode() for r in db.consumer("pipelined", partition=partition)]
        assert values == [value for _, value in sent]
    assert pending[0].result() == pending[0].result(), "a result can be read again"


def test_send_async_refuses_at_once_what_send_refuses(db):
    db.create_topic("one", partitions=1)
    producer = db.producer("one")
    with pytest.raises(chronik.NotFoundError):
        producer.send_async(None, b"x", partition=5)
    with pytest.raises(chronik.NotFoundError):
        producer.send(None, b"x", partition=5)


def test_send_batch_appends_one_batch_per_partition_in_order(db):
    db.create_topic("events", partitions=3)
    producer = db.producer("events")
    batches = producer.send_batch([(f"k{i % 5}", f"v{i}") for i in range(1000)])
    assert sum(last - first + 1 for _, first, last in batches) == 1000
    seen = []
    for partition in range(3):
        seen.extend(bytes(r.value).decode() for r in db.consumer("events", partition=partition))
    assert sorted(seen) == sorted(f"v{i}" for i in range(1000))
    # Within a key, the order of sending is kept.
    consumer = db.consumer("events", partition=batches[0][0])
    values = [int(bytes(r.value)[1:]) for r in consumer]
    assert values == sorted(values)


def test_every_bytes_like_kind_is_appended_as_its_bytes(db):
    # bytes are read in place (held, no copy), str as UTF-8, bytearray and memoryview copied.
    db.create_topic("kinds")
    producer = db.producer("kinds")
    backing = bytearray(b"..view..")
    kinds = [b"bytes", "str \u00e9\u4e2d", bytearray(b"bytearray"), memoryview(backing)[2:6]]
    producer.send_batch([(k, k, None, 1_000 + i) for i, k in enumerate(kinds)])
    for k in kinds:
        producer.send(k, k)
    backing[:] = b"XXXXXXXX"  # changed after the send: what was sent stays
    expected = [k.encode() if isinstance(k, str) else bytes(k) for k in kinds]
    expected[3] = b"view"
    records = list(db.consumer("kinds"))
    assert [bytes(r.key) for r in records] == expected * 2
    assert [bytes(r.value) for r in records] == expected * 2
    assert [r.timestamp for r in records[:4]] == [1_000, 1_001, 1_002, 1_003]
    with pytest.raises(chronik.InvalidArgumentError):
        producer.send(b"k", 42)
    with pytest.raises(chronik.InvalidArgumentError):
        producer.send_batch([(b"k", b"v"), (b"k", object())])
    assert db.high_watermark("kinds", 0) == 8  # a refused batch appends nothing


def test_poll_seek_and_groups_resume_where_they_committed(db):
    db.create_topic("log")
    db.producer("log").send_batch([(None, str(i)) for i in range(100)], partition=0)
    consumer = db.consumer("log", group="billing")
    first = consumer.poll(max_records=10)
    assert [r.offset for r in first] == list(range(10))
    consumer.commit()
    assert consumer.committed() == 10
    rest = db.consumer("log", group="billing").poll()
    assert rest[0].offset == 10 and rest[-1].offset == 99
    consumer.seek(95)
    assert [r.offset for r in consumer.poll()] == [95, 96, 97, 98, 99]
    assert consumer.poll(timeout=0.01) == []


def test_topics_are_managed_and_described(db):
    db.create_topic("t", partitions=2, config={"cleanup": "compact", "retention_ms": 60000})
    assert db.list_topics() == ["t"]
    described = db.describe_topic("t")
    assert described["config"]["cleanup"] == "compact"
    assert len(described["partitions"]) == 2
    db.alter_topic_config("t", {"retention_ms": 1000})
    assert db.describe_topic("t")["config"]["retention_ms"] == "1000"
    db.delete_topic("t")
    assert db.list_topics() == []


def test_delete_records_moves_the_log_start_a_segment_at_a_time(db):
    db.create_topic("log", config={"segment_bytes": 4096})
    producer = db.producer("log")
    for batch in range(20):
        producer.send_batch([(None, f"{batch}-{i}-" + "x" * 40) for i in range(25)], partition=0)
    start = db.delete_records("log", 0, 250)
    assert 0 < start <= 250
    assert db.describe_topic("log")["partitions"][0]["log_start_offset"] == start
    assert db.consumer("log").poll(max_records=1)[0].offset == start
    assert db.delete_records("log", 0, 10) == start, "never back"
    with pytest.raises(chronik.NotFoundError):
        db.delete_records("log", 1, 0)


def test_errors_are_typed(tmp_path, db):
    with pytest.raises(chronik.NotFoundError):
        db.producer("missing")
    db.create_topic("t")
    with pytest.raises(chronik.AlreadyExistsError):
        db.create_topic("t")
    with pytest.raises(chronik.InvalidArgumentError):
        db.create_topic("bad name!")
    with pytest.raises(chronik.InvalidArgumentError):
        db.create_topic("u", config={"cleanup": "sometimes"})
    with pytest.raises(chronik.InvalidArgumentError):
        chronik.open(str(tmp_path / "x"), durability="eventually")
    with pytest.raises(chronik.LockedError):
        chronik.open(db.path)
    assert issubclass(chronik.CorruptionError, chronik.ChronikError)
    db.close()
    with pytest.raises(chronik.ClosedError):
        db.list_topics()


def test_records_survive_a_reopen(tmp_path):
    path = str(tmp_path / "data")
    with chronik.open(path, durability="os") as db:
        db.create_topic("t")
        db.producer("t").send_batch([(None, b"x" * i) for i in range(1, 50)])
    with chronik.open(path) as db:
        assert db.high_watermark("t", 0) == 49
        assert [len(r.value) for r in db.consumer("t")] == list(range(1, 50))
