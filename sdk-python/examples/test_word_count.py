"""The word count's processors under crashes: run with `pytest sdk-python/examples`.

`chronik.testing.simulate` runs each processor over the records on a simulated disk that
loses power at random points, restarts it after every crash, and compares its final store
and outputs with a run without faults, for each seed. A failure names the seed to replay:
`CHRONIK_SIM_SEED=<seed> pytest ...`.
"""

import pytest

from chronik.testing import SimulationFailure, simulate
from word_count import COUNTER, SPLITTER, WORD_PARTITIONS, count_word, split_line

LINES = ["the cat sat on the mat", "The Cat! ran", "", "a mat, a cat; the end"] * 10


def test_the_splitter_emits_each_word_exactly_once_under_crashes():
    report = simulate(
        split_line,
        input="lines",
        records=[(None, line) for line in LINES],
        outputs={"words": WORD_PARTITIONS},
        seeds=30,
        **SPLITTER,
    )
    assert report["seeds"] == 30 and report["crashes"] > 0


def test_the_counter_restores_its_counts_exactly_under_crashes():
    words = [w.strip(".,;:!?").lower() for line in LINES for w in line.split()]
    report = simulate(
        count_word,
        input="words",
        records=[(word, b"") for word in words if word],
        input_partitions=WORD_PARTITIONS,
        outputs={"word-counts": WORD_PARTITIONS},
        seeds=30,
        **COUNTER,
    )
    assert report["crashes"] > 0


def test_a_counter_keeping_state_outside_its_store_is_caught():
    totals = {}

    def forgetful(record, ctx):
        # Wrong: a dict in the process is neither committed nor restored.
        totals[record.key] = totals.get(record.key, 0) + 1
        ctx.emit("word-counts", record.key, totals[record.key])

    with pytest.raises(SimulationFailure) as failure:
        simulate(
            forgetful,
            input="words",
            key_format="str",
            records=[(w, b"") for w in ["a", "b", "a", "c", "a"] * 20],
            outputs={"word-counts": 1},
            seeds=30,
        )
    assert failure.value.kind == "outputs"
    assert "CHRONIK_SIM_SEED=" in str(failure.value)
