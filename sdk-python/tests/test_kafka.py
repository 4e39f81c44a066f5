"""The word count on a Kafka-protocol broker (tansu, started here): `chronik.connect(
"kafka://...")` and nothing else changed gives the embedded counts; so do the windows
example's topologies (`chronik.Topology` on a cluster), also in disk stores killed once;
exactly once is refused
with a clear error on a broker without transactions; over mutual TLS (config= and
CHRONIK_KAFKA_* variables), a wrong CA refused with a clear error and no secret shown. Needs
CHRONIK_TANSU (scripts/kafka-test
installs the broker and sets it); without it these tests are skipped, loudly."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import chronik

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_examples import run_example, write_text  # noqa: E402

TANSU = os.environ.get("CHRONIK_TANSU")
pytestmark = pytest.mark.skipif(not TANSU, reason="CHRONIK_TANSU is not set: run scripts/kafka-test")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port):
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.time() < deadline, f"nothing listened on {port}"
            time.sleep(0.05)


@pytest.fixture
def broker():
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port)
    yield f"kafka://127.0.0.1:{port}"
    process.kill()
    process.wait()


def word_counts(tmp_path, target, lines, **env):
    """word_count.py's counts of `lines` lines embedded, and on `target` at least once with
    `env` added to its environment; and the broker run's output."""
    text = tmp_path / "text.txt"
    write_text(text, lines)
    script = EXAMPLES / "word_count.py"
    embedded, on_broker = tmp_path / "embedded.json", tmp_path / "broker.json"
    done = run_example(script, tmp_path / "data", text, "--out", embedded)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, CHRONIK_GUARANTEE="at-least-once", **env)
    done = subprocess.run(
        [sys.executable, str(script), target, str(text), "--out", str(on_broker)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(embedded.read_text()), json.loads(on_broker.read_text()), done


def test_word_count_on_the_broker_gives_the_embedded_counts(tmp_path, broker):
    expected, on_broker, _ = word_counts(tmp_path, broker, 20_000)
    assert sum(expected.values()) == 160_000
    assert on_broker == expected


def final_state(done):
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("final state:")]


def test_timer_windows_on_the_broker_close_the_embedded_windows(tmp_path, broker):
    script = Path(__file__).resolve().parent / "timer_windows_app.py"
    embedded = final_state(run_example(script, tmp_path / "data", "--clicks", "20000"))
    assert len(embedded) == 1
    env = dict(os.environ, CHRONIK_GUARANTEE="at-least-once")
    done = subprocess.run(
        [sys.executable, str(script), broker, "--clicks", "20000"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert final_state(done) == embedded


@pytest.mark.parametrize("topology", ["per-minute", "sessions"])
def test_the_windows_example_on_the_broker_gives_the_results_worked_out_from_the_clicks(
    broker, topology
):
    # `chronik.Topology` over `chronik.connect("kafka://...")`, the example unchanged: every
    # final window (and late click) once, as worked out in plain Python.
    env = dict(os.environ, CHRONIK_GUARANTEE="at-least-once")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "clicks_windows.py"), broker, "--clicks", "60000",
         "--topology", topology],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0 and "exact:" in done.stdout, done.stdout + done.stderr[-3000:]


def test_the_windows_example_in_disk_stores_killed_on_the_broker_ends_with_every_result_once(
    broker, tmp_path
):
    # `per-minute` with its windows in a disk store (state.dir from CHRONIK_KAFKA_STATE_DIR),
    # SIGKILLed once it has written results, started again once the dead process's group
    # session is over (tansu keeps a member joining beside a dead one waiting: docs/kafka.md):
    # every final window and late click once after the repeats are dropped.
    env = dict(
        os.environ,
        CHRONIK_GUARANTEE="at-least-once",
        CHRONIK_KAFKA_SESSION_TIMEOUT_MS="6000",
        CHRONIK_KAFKA_STATE_DIR=str(tmp_path / "state"),
    )
    command = [sys.executable, str(EXAMPLES / "clicks_windows.py"), broker, "--clicks", "200000",
               "--topology", "per-minute", "--store", "disk"]
    victim = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    db = chronik.connect(broker)
    deadline = time.monotonic() + 240
    while victim.poll() is None:
        topics = db.list_topics()
        if "clicks-per-minute" in topics and any(
            db.high_watermark("clicks-per-minute", p) > 0 for p in range(4)
        ):
            break
        assert time.monotonic() < deadline, "no result before the kill"
        time.sleep(0.05)
    assert victim.poll() is None, "the example ended before its kill: " + victim.stderr.read().decode()
    victim.kill()
    victim.wait()
    time.sleep(7)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "exact:" in done.stdout, done.stdout + done.stderr[-3000:]


def test_a_topology_on_a_cluster_refuses_what_only_a_directory_has(broker):
    cluster = chronik.connect(broker)
    topology = chronik.Topology(cluster, "refusals", guarantee="at-least-once")
    with pytest.raises(chronik.InvalidArgumentError, match="late_records"):
        topology.late_records()
    with pytest.raises(chronik.InvalidArgumentError, match="exactly-once or at-least-once"):
        chronik.Topology(cluster, "refusals", guarantee="twice")
    with pytest.raises(TypeError, match="chronik.connect"):
        chronik.Topology(object(), "refusals")


def test_group_consumers_resume_where_the_group_committed(broker):
    db = chronik.connect(broker)
    db.create_topic("t", partitions=2)
    db.producer("t").send_batch([(f"k{i}", f"v{i}") for i in range(10)], partition=1)
    first = db.consumer("t", partition=1, group="readers")
    assert [bytes(r.value) for r in first.poll(max_records=4)] == [b"v0", b"v1", b"v2", b"v3"]
    assert first.position == 4
    first.commit()
    assert first.committed() == 4
    second = db.consumer("t", partition=1, group="readers")
    assert [bytes(r.value) for r in second] == [f"v{i}".encode() for i in range(4, 10)]
    db.producer("t").send_batch([("k", "v10")], partition=1)
    assert [bytes(r.value) for r in second.poll(timeout=5)] == [b"v10"]
    assert [r.offset for r in db.consumer("t", partition=1)][:2] == [0, 1]
    with pytest.raises(chronik.InvalidArgumentError):
        db.consumer("t", partition=1).commit()
    with pytest.raises(chronik.NotFoundError):
        db.consumer("t", partition=2)


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



def test_cluster_producer_answers_as_embedded(broker):
    """The calls a program written for embedded makes, with the offsets the cluster gave."""
    db = chronik.connect(broker)
    db.create_topic("t", partitions=2)
    producer = db.producer("t")
    assert producer.topic == "t"
    assert producer.send(b"a", b"0", partition=1) == (1, 0)
    assert producer.send_batch([(b"b", b"1"), (b"c", b"2")], partition=1) == [(1, 1, 2)]
    assert producer.send_batch([(None, b"x"), (None, b"y")]) == [(0, 0, 1)]
    assert producer.send_batch([]) == []
    pending = producer.send_async(None, b"3", {"h": "v"}, partition=1)
    assert pending.done() and pending.partition == 1 and pending.result() == (1, 3)
    producer.flush()
    keyed = producer.send(b"user-7", b"v")
    assert keyed[0] == chronik.partition_for_key(b"user-7", 2)
    with pytest.raises(chronik.InvalidArgumentError):
        producer.send_batch([(b"k",)])
    with pytest.raises(chronik.NotFoundError):
        db.producer("missing")


def test_cluster_admin_answers_as_embedded(broker):
    db = chronik.connect(broker)
    db.create_topic("t", partitions=2, config={"cleanup": "compact"})
    assert db.partition_count("t") == 2
    for i in range(5):  # one batch each: tansu 0.6 reports a batch's end as its start plus one
        db.producer("t").send(b"k", b"%d" % i, partition=0)
    described = db.describe_topic("t")
    assert described["name"] == "t" and described["config"].get("cleanup") == "compact"
    assert [p["high_watermark"] for p in described["partitions"]] == [5, 0]
    # tansu 0.6 has no DeleteRecords (it drops the connection): the call is an error there,
    # not a silent no-op. Untested against a broker that has it.
    with pytest.raises(chronik.ChronikError, match="delete records"):
        db.delete_records("t", 0, 2)
    db.delete_topic("t")
    assert "t" not in db.list_topics()
    with pytest.raises(chronik.InvalidArgumentError):
        db.create_topic("u", config={"retention_ms": 5})




# word_count.py, its counter slowed to about 10,000 words a second, so that a kill lands
# mid-run whatever the machine's speed.
PACED_WORD_COUNT = '''
import sys
import time

sys.path.insert(0, {examples!r})
import word_count

count_word, seen = word_count.count_word, [0]


def paced(record, ctx):
    seen[0] += 1
    if seen[0] % 100 == 0:
        time.sleep(0.01)
    count_word(record, ctx)


word_count.count_word = paced
sys.exit(word_count.main())
'''


class Counter:
    """A `word_count.py --step count` process; a thread collects its standard error (group
    assignments among it) as it is printed, so a full pipe never stalls the process."""

    def __init__(self, script, broker, text, out, env):
        self.process = subprocess.Popen(
            [sys.executable, str(script), broker, str(text), "--step", "count", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines = []
        self.more = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stderr:
            with self.more:
                self.lines.append(line)
                self.more.notify_all()
        with self.more:
            self.lines.append(None)  # end of output
            self.more.notify_all()

    def assignments(self):
        """The partitions of `words` given to this process, one set per assignment so far."""
        found = []
        for line in list(self.lines):
            match = line and re.search(r"group counter assigned here: \{([0-9, ]*)\}", line)
            if match:
                found.append({int(p) for p in match.group(1).split(",") if p.strip()})
        return found

    def latest(self):
        """The partitions of `words` this process holds now (as far as it said)."""
        found = self.assignments()
        return found[-1] if found else set()

    def wait_for(self, condition, what, seconds=120):
        deadline = time.time() + seconds
        with self.more:
            while not condition():
                assert None not in self.lines, f"ended before {what}: {self.said()}"
                left = deadline - time.time()
                assert left > 0, f"no {what}: {self.said()}"
                self.more.wait(min(left, 0.2))

    def said(self):
        """The end of what the process printed to standard error so far."""
        return "".join(filter(None, self.lines))[-3000:]

    def finish(self, seconds=300):
        try:
            out, _ = self.process.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        self.reader.join()
        return out + self.said()


def test_two_counters_share_the_partitions_and_the_survivor_of_a_kill_takes_the_others_over(
    tmp_path, broker
):
    text = tmp_path / "text.txt"
    write_text(text, 20_000)
    script = EXAMPLES / "word_count.py"
    embedded = tmp_path / "embedded.json"
    done = run_example(script, tmp_path / "data", text, "--out", embedded)
    paced = tmp_path / "paced_word_count.py"
    paced.write_text(PACED_WORD_COUNT.format(examples=str(EXAMPLES)))
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, CHRONIK_GUARANTEE="at-least-once", CHRONIK_KAFKA_DEBUG="cgrp")
    done = subprocess.run(
        [sys.executable, str(script), broker, str(text), "--step", "split"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    # Two counters in one group, the partitions of `words` spread over both, then one is
    # killed mid-run. Once its session expires, the group rebalances and the survivor alone is
    # given all four partitions, restores the victim's counts from the changelog and finishes.
    survivor_out = tmp_path / "survivor.json"
    survivor = Counter(paced, broker, text, survivor_out, env)
    survivor.wait_for(lambda: any(survivor.assignments()), "a first assignment")
    victim = Counter(paced, broker, text, tmp_path / "victim.json", env)
    survivor.wait_for(
        lambda: all(0 < len(c.latest()) < 4 for c in (survivor, victim)),
        "the partitions shared by both",
    )
    time.sleep(1.0)
    assert victim.process.poll() is None, "the victim ended before its kill"
    assert survivor.process.poll() is None, "the survivor ended before the kill"
    victim.process.kill()
    victim.finish()
    taken_over = len(survivor.assignments())
    survivor.wait_for(
        lambda: any(a == {0, 1, 2, 3} for a in survivor.assignments()[taken_over:]),
        "all four partitions for the survivor after the kill",
    )
    said = survivor.finish()
    assert survivor.process.returncode == 0, said
    assert json.loads(survivor_out.read_text()) == json.loads(embedded.read_text())


# TLS: tansu 0.6 takes --cert/--key and still serves plaintext, so the tests put the Rust
# tests' TLS terminator (standard library only) in front of it, with a CA made here.
TLS_PROXY = Path(__file__).resolve().parents[2] / "sdk-rust" / "src" / "testing" / "tls_proxy.py"
SECRET = "python-key-passphrase-41c7"


def make_certificates(directory):
    """A CA, a server certificate for 127.0.0.1 and a client one whose key has SECRET."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    d = directory
    openssl("req", "-x509", "-nodes", "-days", "2", *ec, "-subj", "/CN=test-ca",
            "-keyout", d / "ca.key", "-out", d / "ca.pem")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, protect in [("server", "/CN=localhost", ["-nodes"]),
                                   ("client", "/CN=client", ["-passout", f"pass:{SECRET}"])]:
        openssl("req", "-new", *ec, "-subj", subject, "-keyout", d / f"{name}.key",
                "-out", d / f"{name}.csr", *protect)
        openssl("x509", "-req", "-days", "2", "-in", d / f"{name}.csr", "-CA", d / "ca.pem",
                "-CAkey", d / "ca.key", "-CAcreateserial", "-out", d / f"{name}.pem",
                "-extfile", d / "san.ext")
    return d


@pytest.fixture
def tls_broker(tmp_path):
    """`(target, certificate directory)` of tansu behind mutual TLS."""
    certificates = make_certificates(tmp_path)
    broker_port, port = free_port(), free_port()
    tansu = subprocess.Popen(
        [TANSU, "broker", "--listener-url", f"tcp://127.0.0.1:{broker_port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_listening(broker_port)
    proxy = subprocess.Popen(
        [sys.executable, str(TLS_PROXY), str(port), str(broker_port),
         str(certificates / "server.pem"), str(certificates / "server.key"), str(certificates / "ca.pem")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_listening(port)
    yield f"kafka://127.0.0.1:{port}", certificates
    for process in (proxy, tansu):
        process.kill()
        process.wait()


def tls_properties(certificates, ca="ca.pem"):
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certificates / ca),
        "ssl.certificate.location": str(certificates / "client.pem"),
        "ssl.key.location": str(certificates / "client.key"),
        "ssl.key.password": SECRET,
    }


def test_a_cluster_over_mutual_tls_and_refusals_without_the_secret(tls_broker, tmp_path):
    target, certificates = tls_broker
    db = chronik.connect(target, config=tls_properties(certificates))
    assert repr(db).startswith("Cluster(") and SECRET not in repr(db)
    db.create_topic("t", partitions=2)
    db.producer("t").send_batch([(f"k{i}", f"v{i}") for i in range(10)], partition=1)
    consumer = db.consumer("t", partition=1, group="readers")
    assert [bytes(r.value) for r in consumer] == [f"v{i}".encode() for i in range(10)]
    consumer.commit()
    assert db.consumer("t", partition=1, group="readers").position == 10

    # A CA that did not sign the broker's certificate: a clear error, no secret in it.
    other = tmp_path / "other"
    other.mkdir()
    make_certificates(other)
    wrong = tls_properties(certificates)
    wrong["ssl.ca.location"] = str(other / "ca.pem")
    with pytest.raises(chronik.ChronikError, match="certificate verify failed") as refused:
        chronik.connect(target, config=wrong)
    assert SECRET not in str(refused.value) + repr(refused.value)
    # Properties Chronik manages, and values that are no property value, are named.
    with pytest.raises(chronik.InvalidArgumentError, match="acks"):
        chronik.connect(target, config={**tls_properties(certificates), "acks": "1"})
    with pytest.raises(chronik.InvalidArgumentError, match="sasl.password") as bad:
        chronik.connect(target, config={"sasl.password": object()})
    assert "object at" not in str(bad.value)
    with pytest.raises(chronik.InvalidArgumentError, match="config="):
        chronik.connect(str(tmp_path / "data"), config={"security.protocol": "SSL"})


def test_word_count_runs_unchanged_over_tls_given_properties_in_the_environment(tmp_path, tls_broker):
    target, certificates = tls_broker
    env = {"CHRONIK_KAFKA_" + key.upper().replace(".", "_"): value
           for key, value in tls_properties(certificates).items()}
    expected, on_broker, done = word_counts(tmp_path, target, 5_000, **env)
    assert SECRET not in done.stdout + done.stderr
    assert on_broker == expected
