"""Hostile use of the Python package: every bad argument raises a chronik exception, or a
TypeError/ValueError with a message, never a pyo3 PanicException or a hang, and nothing
acknowledged before or between the bad calls is lost."""

import time

import pytest

import chronik

# What Python raises for an int that does not fit the Rust integer type (a negative partition,
# offset or count, or one past 2**32 / 2**64).
OVERFLOW = OverflowError


@pytest.fixture
def db(tmp_path):
    with chronik.open(str(tmp_path / "data")) as opened:
        opened.create_topic("t", partitions=2)
        yield opened


def raises_typed(call, expected):
    """Run `call`; it must raise `expected` (never a PanicException) with a message."""
    with pytest.raises(expected) as caught:
        call()
    assert type(caught.value).__name__ != "PanicException"
    assert str(caught.value), f"{type(caught.value).__name__} with no message"
    return caught.value


@pytest.mark.parametrize(
    "durability, expected",
    [
        ("fast", chronik.InvalidArgumentError),
        ("interval:-5", chronik.InvalidArgumentError),
        ("interval:", chronik.InvalidArgumentError),
        ("interval:1.5", chronik.InvalidArgumentError),
        ("interval:99999999999999999999999", chronik.InvalidArgumentError),
        ("SYNC", chronik.InvalidArgumentError),
        ("", chronik.InvalidArgumentError),
        (None, TypeError),
        (5, TypeError),
    ],
)
def test_bad_open_arguments_are_refused(tmp_path, durability, expected):
    raises_typed(lambda: chronik.open(str(tmp_path / "d"), durability=durability), expected)
    assert not (tmp_path / "d").exists()


def test_bad_open_paths_and_options_are_refused(tmp_path):
    file = tmp_path / "file"
    file.write_bytes(b"not a directory")
    cases = [
        (lambda: chronik.open(str(file)), chronik.ChronikError),
        (lambda: chronik.open(str(file / "below")), chronik.ChronikError),
        (lambda: chronik.open(str(tmp_path / "nul\0byte")), (chronik.ChronikError, ValueError)),
        (lambda: chronik.open(None), TypeError),
        (lambda: chronik.open(b"bytes-path"), TypeError),
        (lambda: chronik.open(str(tmp_path / "x"), io="no-such-backend"), TypeError),
    ]
    for call, expected in cases:
        raises_typed(call, expected)
    assert file.read_bytes() == b"not a directory"
    # Open twice in one process: the lock refuses the second.
    with chronik.open(str(tmp_path / "locked")):
        raises_typed(lambda: chronik.open(str(tmp_path / "locked")), chronik.LockedError)


def test_bad_topic_names_and_configs_are_refused(db):
    cases = [
        (("",), chronik.InvalidArgumentError),
        ((".",), chronik.InvalidArgumentError),
        (("..",), chronik.InvalidArgumentError),
        (("../escape",), chronik.InvalidArgumentError),
        (("a/b",), chronik.InvalidArgumentError),
        (("/abs",), chronik.InvalidArgumentError),
        (("a\0b",), chronik.InvalidArgumentError),
        (("__internal",), chronik.InvalidArgumentError),
        (("x" * 201,), chronik.InvalidArgumentError),
        (("t",), chronik.AlreadyExistsError),
        (("p", 0), chronik.InvalidArgumentError),
        (("p", 4097), chronik.InvalidArgumentError),
        (("p", -1), OVERFLOW),
        (("p", 2**40), OVERFLOW),
        (("p", 1.5), TypeError),
        (("p", "2"), TypeError),
        ((None,), TypeError),
        ((b"bytes-name",), TypeError),
        (("p", 1, {"segment.bytes": "-5"}), chronik.InvalidArgumentError),
        (("p", 1, {"no.such.setting": "1"}), chronik.InvalidArgumentError),
        (("p", 1, {"retention.ms": "soon"}), chronik.InvalidArgumentError),
        (("p", 1, "not a dict"), TypeError),
    ]
    for args, expected in cases:
        raises_typed(lambda: db.create_topic(*args), expected)
    assert db.list_topics() == ["t"]


def test_bad_sends_are_refused_and_lose_nothing(db):
    producer = db.producer("t")
    acknowledged = []

    def good(i):
        value = f"ok-{i}".encode()
        assert producer.send(None, value, partition=0)[0] == 0
        acknowledged.append(value)

    huge = b"\0" * (20 << 20)
    cases = [
        (lambda: producer.send(b"k", None), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", 5), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", 1.5), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", object()), chronik.InvalidArgumentError),
        (lambda: producer.send(5, b"v"), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", "\udcff"), UnicodeEncodeError),
        (lambda: producer.send(b"k", b"v", partition=2), chronik.NotFoundError),
        (lambda: producer.send(b"k", b"v", partition=2**32 - 1), chronik.NotFoundError),
        (lambda: producer.send(b"k", b"v", partition=-1), OVERFLOW),
        (lambda: producer.send(b"k", b"v", partition=2**32), OVERFLOW),
        (lambda: producer.send(b"k", b"v", partition="0"), TypeError),
        (lambda: producer.send(b"k", b"v", timestamp=2**63), OVERFLOW),
        (lambda: producer.send(b"k", b"v", timestamp=1.5), TypeError),
        (lambda: producer.send(b"k", b"v", headers=5), TypeError),
        (lambda: producer.send(b"k", b"v", headers=[(b"only-key",)]), ValueError),
        (lambda: producer.send(b"k", b"v", headers={b"h": None}), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", huge), chronik.InvalidArgumentError),
        (lambda: producer.send(b"k", memoryview(huge)), chronik.InvalidArgumentError),
        (lambda: producer.send_batch(5), TypeError),
        (lambda: producer.send_batch([b"not a tuple"]), chronik.InvalidArgumentError),
        (lambda: producer.send_batch([(b"k",)]), chronik.InvalidArgumentError),
        (lambda: producer.send_batch([()]), chronik.InvalidArgumentError),
        (lambda: producer.send_batch([(b"k", b"v", None, 1, "x")]), chronik.InvalidArgumentError),
        (lambda: producer.send_batch([(b"k", b"v", None, "soon")]), TypeError),
        (lambda: producer.send_batch([(b"k", huge)] * 2, partition=0),
         chronik.InvalidArgumentError),
        (lambda: db.producer("missing"), chronik.NotFoundError),
        (lambda: db.producer("../t"), chronik.NotFoundError),
        (lambda: db.producer(None), TypeError),
    ]
    for i, (call, expected) in enumerate(cases):
        raises_typed(call, expected)
        good(i)
    assert producer.send_batch([]) == []
    values = [bytes(r.value) for r in db.consumer("t", partition=0)]
    assert values == acknowledged


def test_binary_keys_values_and_headers_round_trip(db):
    producer = db.producer("t")
    key = bytes([0xFF, 0xFE, 0x00, 0x80])
    value = bytes(range(256))
    partition, offset = producer.send(key, value, headers=[(b"\xc3\x28", b"\0")])
    assert partition == chronik.partition_for_key(key, 2)
    (record,) = db.consumer("t", partition=partition).poll()
    assert (record.offset, bytes(record.key), bytes(record.value)) == (offset, key, value)
    assert record.headers == [(b"\xc3\x28", b"\0")]
    raises_typed(lambda: chronik.partition_for_key(key, 0), chronik.InvalidArgumentError)
    raises_typed(lambda: chronik.partition_for_key("str", 2), TypeError)


def test_bad_consumers_are_refused_without_waiting(db):
    db.producer("t").send(None, b"v", partition=0)
    cases = [
        (lambda: db.consumer("missing"), chronik.NotFoundError),
        (lambda: db.consumer("t", partition=2), chronik.NotFoundError),
        (lambda: db.consumer("t", partition=-1), OVERFLOW),
        (lambda: db.consumer("t", partition=None), TypeError),
        (lambda: db.consumer("t").seek(-1), OVERFLOW),
        (lambda: db.consumer("t").seek(2**64), OVERFLOW),
        (lambda: db.consumer("t").seek("0"), TypeError),
        (lambda: db.consumer("t").poll(max_records=-1), OVERFLOW),
        (lambda: db.consumer("t").poll(timeout="1"), TypeError),
        (lambda: db.consumer("t").commit(), chronik.InvalidArgumentError),
        (lambda: db.consumer("t", group="").commit(), chronik.InvalidArgumentError),
        (lambda: db.high_watermark("missing", 0), chronik.NotFoundError),
        (lambda: db.high_watermark("t", 9), chronik.NotFoundError),
        (lambda: db.describe_topic("missing"), chronik.NotFoundError),
        (lambda: db.delete_topic("missing"), chronik.NotFoundError),
        (lambda: db.delete_topic("__consumer_offsets"), chronik.ChronikError),
    ]
    for call, expected in cases:
        raises_typed(call, expected)
    for offset in [2, 2**63, 2**64 - 1]:
        consumer = db.consumer("t")
        consumer.seek(offset)
        started = time.monotonic()
        raises_typed(lambda: consumer.poll(timeout=3600), chronik.OffsetOutOfRangeError)
        raises_typed(lambda: next(consumer), chronik.OffsetOutOfRangeError)
        assert time.monotonic() - started < 5
    # Odd timeouts neither hang nor raise: NaN, negative and zero do not wait; inf is capped.
    consumer = db.consumer("t")
    assert len(consumer.poll()) == 1
    for timeout in [float("nan"), -1.0, 0.0, 0]:
        started = time.monotonic()
        assert consumer.poll(timeout=timeout) == []
        assert time.monotonic() - started < 1
    assert consumer.poll(max_records=0) == []


def test_closed_handles_raise_closed_error(tmp_path):
    with chronik.open(str(tmp_path / "data")) as db:
        db.create_topic("t")
        producer = db.producer("t")
        producer.send(None, b"kept")
        consumer = db.consumer("t", group="g")
        (record,) = consumer.poll()
    calls = [
        lambda: db.create_topic("u"),
        lambda: db.list_topics(),
        lambda: db.producer("t"),
        lambda: db.consumer("t"),
        lambda: db.high_watermark("t", 0),
        lambda: db.flush(),
        lambda: db.metrics(),
        lambda: producer.send(None, b"lost?"),
        lambda: producer.send_batch([(None, b"lost?")]),
        lambda: consumer.poll(),
        lambda: next(consumer),
        lambda: consumer.commit(),
        lambda: consumer.committed(),
    ]
    for call in calls:
        raises_typed(call, chronik.ClosedError)
    db.close()  # closing again is harmless
    assert bytes(record.value) == b"kept"  # a record read before the close stays readable
    with chronik.open(str(tmp_path / "data")) as reopened:
        assert [bytes(r.value) for r in reopened.consumer("t")] == [b"kept"]
