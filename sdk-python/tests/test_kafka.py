"""The word count on a Kafka-protocol broker (tansu, started here): `chronik.connect(
"kafka://...")` and nothing else changed gives the embedded counts; exactly once is refused
with a clear error on a broker without transactions. Needs CHRONIK_TANSU (scripts/kafka-test
installs the broker and sets it); without it these tests are skipped, loudly."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chronik

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_examples import run_example, write_text  # noqa: E402

TANSU = os.environ.get("CHRONIK_TANSU")
pytestmark = pytest.mark.skipif(not TANSU, reason="CHRONIK_TANSU is not set: run scripts/kafka-test")


@pytest.fixture
def broker():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, "tansu never listened"
            time.sleep(0.05)
    yield f"kafka://127.0.0.1:{port}"
    process.kill()
    process.wait()


def test_word_count_on_the_broker_gives_the_embedded_counts(tmp_path, broker):
    text = tmp_path / "text.txt"
    write_text(text, 20_000)
    script = EXAMPLES / "word_count.py"
    embedded, on_broker = tmp_path / "embedded.json", tmp_path / "broker.json"
    done = run_example(script, tmp_path / "data", text, "--out", embedded)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, CHRONIK_GUARANTEE="at-least-once")
    done = subprocess.run(
        [sys.executable, str(script), broker, str(text), "--out", str(on_broker)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    expected = json.loads(embedded.read_text())
    assert sum(expected.values()) == 160_000
    assert json.loads(on_broker.read_text()) == expected


def test_exactly_once_is_refused_on_a_broker_without_transactions(broker):
    db = chronik.connect(broker)
    db.create_topic("lines", partitions=2)
    db.producer("lines").send_batch([(b"k", b"v")])
    app = chronik.App(db, "counter", input="lines", stores=["counts"], guarantee="exactly-once")

    @app.processor
    def count(record, ctx):
        ctx.store("counts")[record.key] = 1

    with pytest.raises(chronik.ChronikError, match="exactly-once processing refused.*EndTxn"):
        app.run_until_caught_up()


def test_producer_and_records_keep_keys_values_headers_and_timestamps(broker):
    db = chronik.connect(broker)
    db.create_topic("t", partitions=2)
    db.producer("t").send_batch(
        [(b"a", b"1", [(b"h", b"x")], 1_700_000_000_123), (None, "two", None, 5)], partition=1
    )
    records = db.records("t", 1)
    assert [(r[2], r[3], r[4], r[1]) for r in records] == [
        (b"a", b"1", [(b"h", b"x")], 1_700_000_000_123),
        (None, b"two", [], 5),
    ]
    assert db.high_watermark("t", 1) == 2 and db.high_watermark("t", 0) == 0


