"""Input records a processor's formats cannot decode (`on_decode_error`), for `App` and
`Topology`: "fail" names the record (topic, partition, offset) and commits nothing of its
batch; "skip" leaves it out and counts it; "dead_letter" sends it as it is to a topic, in the
same transaction as the other outputs, so exactly once even when the process is killed
(SIGKILL) mid-run and run again.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import chronik

# Input records: (key, value, timestamp); the bad ones are not JSON, or not UTF-8 keys.
GOOD = [(f"k{i}".encode(), json.dumps({"n": i}).encode(), 1_000 + i) for i in range(10)]
BAD_VALUE = (b"k-bad", b"{not json", 2_000)
BAD_KEY = (b"\xff\xfe", b'{"n": 99}', 2_001)


def records_with_bad():
    """GOOD with BAD_VALUE after the 4th record and BAD_KEY after the 7th: offsets 4 and 8."""
    return GOOD[:4] + [BAD_VALUE] + GOOD[4:7] + [BAD_KEY] + GOOD[7:]


BAD_OFFSETS = [4, 8]


@pytest.fixture
def db(tmp_path):
    with chronik.open(str(tmp_path / "data"), durability="os") as db:
        yield db


def send(db, topic, records, headers=()):
    db.producer(topic).send_batch([(k, v, list(headers), t) for k, v, t in records])


def read(db, topic):
    """Every record of `topic` as (key, value, timestamp, headers), partition by partition."""
    out = []
    for p in range(len(db.describe_topic(topic)["partitions"])):
        for r in db.consumer(topic, partition=p):
            key = None if r.key is None else bytes(r.key)
            headers = [(bytes(k), bytes(v)) for k, v in r.headers]
            out.append((key, bytes(r.value), r.timestamp, headers))
    return out


def app(db, name="doubler", **settings):
    """An App (key "str", value "json") emitting each record's n doubled to "out"."""
    made = chronik.App(
        db, name, input="in", key_format="str", value_format="json", commit_every_records=3,
        **settings,
    )

    @made.processor
    def double(record, ctx):
        ctx.emit("out", record.key, str(record.value["n"] * 2))

    return made


def topology(db, name="doubler", **settings):
    """The same as a Topology."""
    made = chronik.Topology(
        db, name, key_format="str", value_format="json", commit_every_records=3, **settings
    )
    made.stream("in").map_values(lambda e: e.value["n"] * 2).to("out")
    return made


KINDS = {"app": app, "topology": topology}


def outputs(db):
    """`out` as (key, n): the order within a partition as written."""
    return [(key.decode(), int(value)) for key, value, _, _ in read(db, "out")]


def expected_outputs():
    return [(k.decode(), json.loads(v)["n"] * 2) for k, v, _ in GOOD]


@pytest.mark.parametrize("kind", KINDS)
def test_fail_names_topic_partition_offset_and_commits_nothing_of_the_batch(db, kind):
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "in", records_with_bad())
    runner = KINDS[kind](db)
    with pytest.raises(chronik.DecodeError) as raised:
        runner.run_until_caught_up()
    error = raised.value
    assert isinstance(error, chronik.ChronikError)
    assert (error.topic, error.partition, error.offset) == ("in", 0, 4)
    assert "not JSON" in error.reason and "value" in error.reason
    for text in ('"in"', "partition 0", "offset 4", "json"):
        assert text in str(error), str(error)
    # Commits every 3 records: offsets 0-2 committed, 3 (in the bad record's batch) not.
    assert outputs(db) == expected_outputs()[:3]
    # The same again: the run starts at the committed position and fails at the same record.
    with pytest.raises(chronik.DecodeError, match="offset 4"):
        KINDS[kind](db).run_until_caught_up()
    assert outputs(db) == expected_outputs()[:3]


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_not_in_the_key_format_is_named_too(db, kind):
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "in", GOOD[:2] + [BAD_KEY])
    with pytest.raises(chronik.DecodeError) as raised:
        KINDS[kind](db).run_until_caught_up()
    assert raised.value.offset == 2
    assert "key" in raised.value.reason and "UTF-8" in raised.value.reason


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_an_app_names_a_record_that_passes_the_json_syntax_check_yet_does_not_decode(db, policy):
    """The runner's check is JSON syntax; a float beyond range decodes to nothing: the App
    still names the record (it cannot be skipped past: the check let it through)."""
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "in", GOOD[:1] + [(b"k", b"1e400", 5)])
    with pytest.raises(chronik.DecodeError) as raised:
        app(db, on_decode_error=policy).run_until_caught_up()
    assert (raised.value.topic, raised.value.partition, raised.value.offset) == ("in", 0, 1)
    assert "value" in raised.value.reason


@pytest.mark.parametrize("kind", KINDS)
def test_skip_counts_and_the_outputs_are_those_without_the_bad_records(db, kind):
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "in", records_with_bad())
    stats = KINDS[kind](db, on_decode_error="skip").run_until_caught_up()
    assert stats["skipped_records"] == 2
    assert stats["dead_letters"] == 0
    assert outputs(db) == expected_outputs()
    # Past them for good: a second run has nothing to do.
    again = KINDS[kind](db, on_decode_error="skip").run_until_caught_up()
    assert again["skipped_records"] == 0 and again["records"] == 0
    assert outputs(db) == expected_outputs()


@pytest.mark.parametrize("kind", KINDS)
def test_dead_letter_gets_the_raw_records_with_where_and_why(db, kind):
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    db.create_topic("bad", partitions=1)
    send(db, "in", records_with_bad(), headers=[(b"trace", b"t-1")])
    settings = {"on_decode_error": "dead_letter", "dead_letter_topic": "bad"}
    stats = KINDS[kind](db, **settings).run_until_caught_up()
    assert stats["dead_letters"] == 2 and stats["skipped_records"] == 0
    assert outputs(db) == expected_outputs()
    dead = read(db, "bad")
    assert [(key, value, at) for key, value, at, _ in dead] == [BAD_VALUE, BAD_KEY]
    for (_, _, _, headers), offset in zip(dead, BAD_OFFSETS):
        named = dict(headers)
        assert headers[0] == (b"trace", b"t-1"), "the record's own headers first"
        assert named[b"dead_letter.topic"] == b"in"
        assert named[b"dead_letter.partition"] == b"0"
        assert named[b"dead_letter.offset"] == str(offset).encode()
    assert b"not JSON" in dict(dead[0][3])[b"dead_letter.error"]
    assert b"not UTF-8" in dict(dead[1][3])[b"dead_letter.error"]


@pytest.mark.parametrize("kind", KINDS)
def test_bad_policies_are_refused_in_the_constructor(db, kind):
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    make = KINDS[kind]
    with pytest.raises(chronik.InvalidArgumentError, match="on_decode_error"):
        make(db, on_decode_error="ignore")
    with pytest.raises(chronik.InvalidArgumentError, match="dead_letter_topic"):
        make(db, on_decode_error="dead_letter")
    with pytest.raises(chronik.InvalidArgumentError, match="dead_letter_topic"):
        make(db, on_decode_error="skip", dead_letter_topic="bad")
    # A topic that does not exist: refused when the run starts, before any record.
    send(db, "in", records_with_bad())
    missing = make(db, on_decode_error="dead_letter", dead_letter_topic="no-such-topic")
    with pytest.raises(chronik.NotFoundError, match="no-such-topic"):
        missing.run_until_caught_up()
    assert outputs(db) == []


def test_bytes_formats_take_every_record(db):
    """Nothing to decode, nothing refused (and no check on the way)."""
    db.create_topic("in", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "in", records_with_bad())
    raw = chronik.App(db, "raw", input="in")

    @raw.processor
    def copy(record, ctx):
        ctx.emit("out", record.key, record.value)

    stats = raw.run_until_caught_up()
    assert stats["records"] == len(records_with_bad())
    assert stats["skipped_records"] == 0 and stats["dead_letters"] == 0


def test_a_topology_table_is_not_checked(db):
    """A table's empty value deletes its key's row: it is not a value to decode."""
    db.create_topic("in", partitions=1)
    db.create_topic("users", partitions=1)
    db.create_topic("out", partitions=1)
    send(db, "users", [(b"k1", b'"ann"', 1), (b"k2", b'"bob"', 2), (b"k2", b"", 3)])
    send(db, "in", GOOD[:3])
    joined = chronik.Topology(
        db, "joined", key_format="str", value_format="json", on_decode_error="fail"
    )
    joined.stream("in").left_join(joined.table("users"), lambda e, user: user).to("out")
    joined.run_until_caught_up()
    assert [json.loads(v) for _, v, _, _ in read(db, "out")] == [None, "ann", None]


CHILD = r"""
import sys, time
import chronik
kind, data = sys.argv[1], sys.argv[2]
with chronik.open(data) as db:
    settings = dict(key_format="str", value_format="json", commit_every_records=20,
                    on_decode_error="dead_letter", dead_letter_topic="bad")
    def slow_double(n):
        time.sleep(0.0005)  # so that a kill lands mid-run
        return n * 2
    if kind == "app":
        app = chronik.App(db, "killed", input="in", **settings)
        @app.processor
        def double(record, ctx):
            ctx.emit("out", record.key, str(slow_double(record.value["n"])))
        app.run_until_caught_up()
    else:
        topology = chronik.Topology(db, "killed", **settings)
        topology.stream("in").map_values(lambda e: slow_double(e.value["n"])).to("out")
        topology.run_until_caught_up()
"""


@pytest.mark.parametrize("kind", KINDS)
def test_dead_letters_are_exactly_once_across_sigkill(tmp_path, kind):
    data = str(tmp_path / "data")
    rng = random.Random(int(os.environ.get("CHRONIK_KILL_SEED", "1")))
    records, bad, good = [], [], []
    for i in range(8_000):
        key = f"k{i % 17}".encode()
        if rng.random() < 0.05:
            record = (key, f"not json {i}".encode(), 10_000 + i)
            bad.append(record)
        else:
            record = (key, json.dumps({"n": i}).encode(), 10_000 + i)
            good.append((key.decode(), i * 2))
        records.append(record)
    with chronik.open(data) as db:
        for topic in ("in", "out", "bad"):
            db.create_topic(topic, partitions=2)
        send(db, "in", records)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    killed_running = 0
    for _ in range(5):
        process = subprocess.Popen(
            [sys.executable, str(script), kind, data],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(rng.uniform(0.2, 0.6))
        if process.poll() is None:
            killed_running += 1
        process.send_signal(signal.SIGKILL)
        process.wait()
    last = subprocess.run(
        [sys.executable, str(script), kind, data], capture_output=True, text=True, timeout=120
    )
    assert last.returncode == 0, last.stderr
    assert killed_running >= 3, "the kills should land while the run goes on"
    with chronik.open(data) as db:
        dead = read(db, "bad")
        assert sorted((k, v, t) for k, v, t, _ in dead) == sorted(bad)
        assert len(dead) == len(bad), "each bad record once"
        assert sorted((k.decode(), int(v)) for k, v, _, _ in read(db, "out")) == sorted(good)
