"""The three topologies of `clicks_windows.py` killed with SIGKILL in a loop, then run to the
end: every result exactly once, equal to what the example works out from the clicks.

Run with `pytest sdk-python/examples`. Each kill lands at a random moment of a step (the
example appending its input, or the topology running), timed from the line the example
prints as it begins the step and from how long the step took in an uninterrupted run. After
each kill the test reads the data directory: the kills aim at the input until one leaves it
partly appended, then at the topology until one leaves it partly committed (both are
checked), then anywhere. The moments come from a seed: `CHRONIK_KILL_SEED=<seed>` to replay
one (the default is fixed).
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chronik
from clicks_windows import PARTITIONS, TOPOLOGIES, inputs

SCRIPT = Path(__file__).resolve().parent / "clicks_windows.py"
# 200,000 clicks: a whole run takes about a second here, of which the topology runs a tenth
# to a half; ten commits per run (the example commits every 20,000 records).
CLICKS = 200_000
KILLS = 8
RUN_SECONDS_MAX = 120


def start(data, topology):
    """The example, unbuffered, its output piped to read its steps as they begin."""
    return subprocess.Popen(
        [sys.executable, "-u", str(SCRIPT), str(data), "--clicks", str(CLICKS)]
        + ["--topology", topology],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


# The lines of the example's output that begin and end its steps.
MARKS = {
    "appending": "appending ",
    "appended": "appended ",
    "running": "Topology {topology}",
    "ran": "{topology}: ",
}


def timed_run(data, topology):
    """Run to the end; how long it appended its input, and how long the topology ran (from
    the lines that begin and end each), and the output."""
    started = time.monotonic()
    process = start(data, topology)
    marks, output = {}, []
    for line in process.stdout:
        output.append(line)
        for mark, begins in MARKS.items():
            if line.startswith(begins.format(topology=topology)):
                marks[mark] = time.monotonic() - started
    assert process.wait(RUN_SECONDS_MAX) == 0, "".join(output)
    assert set(marks) == set(MARKS), "".join(output)
    durations = {
        "appending": marks["appended"] - marks["appending"],
        "running": marks["ran"] - marks["running"],
    }
    return durations, "".join(output)


def progress(data, topology):
    """What the data directory holds after a kill: records appended to the inputs, and clicks
    whose processing the topology committed."""
    with chronik.open(str(data)) as db:
        if "users" not in db.list_topics():
            return 0, 0
        appended = 0
        for topic in ["clicks", "users"]:
            appended += sum(db.high_watermark(topic, p) for p in range(PARTITIONS))
        committed = 0
        for p in range(PARTITIONS):
            committed += db.consumer("clicks", partition=p, group=topology).committed() or 0
        return appended, committed


def kill_during(process, topology, step, fraction, duration):
    """SIGKILL `process` `fraction` of `duration` into `step` ("appending" or "running"; the
    topology's run if the input is already complete); the step it was killed in (None: it
    had finished)."""
    for line in process.stdout:
        if line.startswith("appending ") and step == "appending":
            break
        if line.startswith(f"Topology {topology}"):
            step = "running"
            break
    else:
        assert process.wait() == 0, f"the example failed on its own before its {step} kill"
        return None
    deadline = time.monotonic() + fraction * duration[step]
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.002)
    finished = process.poll()
    assert finished in (None, 0), f"the example failed on its own during its {step} kill"
    process.send_signal(signal.SIGKILL)
    process.wait()
    return step if finished is None else None


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_the_topology_killed_in_a_loop_emits_every_result_exactly_once(tmp_path, topology):
    durations, output = timed_run(tmp_path / "whole", topology)
    assert "exact:" in output.splitlines()[-1], output
    inputs_total = sum(len(clicks) + len(changes) for clicks, changes in inputs(CLICKS))

    def cut_input(left):
        return any(0 < appended < inputs_total for _, appended, _ in left)

    def cut_run(left):
        return any(0 < committed < CLICKS for _, _, committed in left)

    data = tmp_path / "killed"
    rng = random.Random(int(os.environ.get("CHRONIK_KILL_SEED", "20261203")))
    left = []  # After each kill: (step killed in, input records, committed clicks).
    for _ in range(KILLS):
        # First the input is cut in the middle, then the topology's run; then anywhere. The
        # first aim is at most half into the step (as long as it took uninterrupted); a kill
        # before the step's first append (or commit) leaves nothing of it, and the next one
        # aims 1.6 times later. So the cuts hold on a machine slower or faster than expected.
        if not cut_input(left):
            step = "appending"
            missed = sum(1 for _, appended, _ in left if appended == 0)
        elif not cut_run(left):
            step = "running"
            missed = sum(1 for k, _, committed in left if k == "running" and committed == 0)
        else:
            step, missed = rng.choice(["appending", "running"]), None
        if missed is None:
            fraction = rng.uniform(0.0, 1.0)
        else:
            fraction = rng.uniform(0.1, 0.5) * 1.6**missed
        process = start(data, topology)
        killed = kill_during(process, topology, step, fraction, durations)
        left.append((killed, *progress(data, topology)))

    final = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--clicks", str(CLICKS), "--topology", topology],
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS_MAX,
    )
    report = f"{topology}: after each kill (step, input records, committed clicks): {left}"
    print(report)  # Shown with `pytest -s`.
    assert final.returncode == 0, f"{report}\n{final.stdout}\n{final.stderr}"
    assert "exact:" in final.stdout.splitlines()[-1], f"{report}\n{final.stdout}"
    # The kills must have hit what they are meant to: a partial input, and a partial run.
    assert cut_input(left) and cut_run(left), report
