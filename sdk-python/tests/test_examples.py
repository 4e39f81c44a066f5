"""The examples run as documented; the word count gives the same counts after SIGKILLs."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(*args, timeout=120):
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def write_text(path, lines, seed=7):
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(3000)]
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(lines):
            # Skewed: low-numbered words are frequent.
            words = (vocabulary[int(rng.paretovariate(1.2)) % 3000] for _ in range(8))
            out.write(" ".join(words) + ".\n")


def test_word_count_killed_with_sigkill_and_restarted_gives_the_uninterrupted_counts(tmp_path):
    text = tmp_path / "text.txt"
    write_text(text, 150_000)
    script = EXAMPLES / "word_count.py"
    whole = tmp_path / "whole.json"
    done = run_example(script, tmp_path / "whole", text, "--out", whole)
    assert done.returncode == 0, done.stderr
    expected = json.loads(whole.read_text())
    assert sum(expected.values()) == 1_200_000

    data = tmp_path / "killed"
    rng = random.Random(int(os.environ.get("CHRONIK_KILL_SEED", "1")))
    killed_running = 0
    for _ in range(6):
        process = subprocess.Popen(
            [sys.executable, str(script), str(data), str(text)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(rng.uniform(0.15, 0.6))
        if process.poll() is None:
            killed_running += 1
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = tmp_path / "final.json"
    last = run_example(script, data, text, "--out", final)
    assert last.returncode == 0, last.stderr
    assert killed_running >= 3, "the kills should land while the example runs"
    assert json.loads(final.read_text()) == expected


def test_timer_windows_check_their_own_windows(tmp_path):
    script = Path(__file__).resolve().parent / "timer_windows_app.py"
    done = run_example(script, tmp_path / "data", "--clicks", "50000")
    assert done.returncode == 0, done.stderr
    assert "every click is in exactly one window" in done.stdout
    # Run again: nothing new to process, the open window is restored, the check still holds.
    again = run_example(script, tmp_path / "data", "--clicks", "50000")
    assert again.returncode == 0, again.stderr
    assert "processed 0 clicks" in again.stdout
