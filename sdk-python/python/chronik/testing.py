"""Test a processor under crashes, in your own pytest suite.

    from chronik.testing import simulate

    def test_counts_survive_crashes():
        report = simulate(count_words, input="lines", stores=["counts"],
                          records=[(None, "a b a"), (None, "b c")], outputs={"counts": 1},
                          seeds=50)
        assert report["crashes"] > 0

`simulate` runs the processor over the records on a simulated disk that loses power at
random points (and sometimes fails reads, writes and fsyncs), restarting it after each crash,
once per seed, and compares its final stores and its outputs with a run without faults. A
processor that keeps state outside its stores, or depends on anything but its input (a
global counter, the wall clock, a random number), fails with `SimulationFailure`, whose
message names the seed; set `CHRONIK_SIM_SEED=<seed>` to replay only that one.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

from chronik._app import Spec
from chronik._chronik import SimulationFailure, Topology, _encode, partition_for_key
from chronik._chronik import simulate as _simulate, simulate_topology as _simulate_topology

__all__ = ["SimulationFailure", "simulate"]


def _input_records(spec: Any, records: Iterable[Any], partitions: int, inputs: Sequence[str]):
    out = []
    for item in records:
        if isinstance(item, Mapping):
            key, value = item.get("key"), item["value"]
            timestamp = item.get("timestamp")
            partition = item.get("partition")
            which = item.get("input", 0)
        else:
            key, value, *rest = item
            timestamp = rest[0] if rest else None
            partition, which = None, 0
        if isinstance(which, str):
            which = list(inputs).index(which)
        key_bytes = None if key is None else _encode(spec.key_format, key)
        if partition is None:
            partition = 0 if key_bytes is None else partition_for_key(key_bytes, partitions)
        out.append((which, partition, key_bytes, _encode(spec.value_format, value), timestamp))
    return out


def simulate(
    processor: Any,
    *,
    records: Iterable[Any],
    input: Union[str, Sequence[str], None] = None,
    outputs: Optional[Mapping[str, int]] = None,
    input_partitions: int = 1,
    seeds: Union[int, range] = 20,
    crashes_max: int = 4,
    batch: bool = False,
    timer: Any = None,
    **settings: Any,
) -> Dict[str, int]:
    """Run `processor` over `records` under crashes, once per seed; raise `SimulationFailure`
    at the first seed whose final stores or outputs differ from a run without faults.

    `processor`: a `Topology` (its stages run; records go to its `sources()`, `input`
    indexing them), an `App` or `Spec` (its handler and settings are used), or a function
    `(record, ctx)` (`batch=True`: `(records, ctx)`) or a `Processor` subclass with the
    settings as keywords (`stores`, `key_format`, `value_format`, `punctuate_stream_ms`...;
    `input` names the input topic, default "input"). `records`: `(key, value)` or `(key,
    value, timestamp)` tuples, or dicts with `key`, `value`, `timestamp`, `partition`,
    `input`; keys and values in the application's formats; the partition is the key's when
    not given. `outputs`: every topic the processor emits to, with its partition count.
    `seeds`: a count or a range. Returns `seeds`, `crashes`, `records_processed`.
    """
    seed_range = range(seeds) if isinstance(seeds, int) else seeds
    if seed_range.step != 1:
        raise ValueError("seeds: a count or a range with step 1")
    if isinstance(processor, Topology):
        if settings or timer is not None or batch or input is not None:
            raise TypeError("settings come from the Topology given")
        return _simulate_topology(
            processor,
            input_partitions,
            list((outputs or {}).items()),
            _input_records(processor, records, input_partitions, processor.sources()),
            (seed_range.start, seed_range.stop),
            crashes_max,
        )
    if isinstance(processor, Spec):
        if settings or timer is not None or batch:
            raise TypeError("settings come from the App or Spec given")
        spec = processor
    else:
        spec = Spec(settings.pop("name", "app"), input or "input", **settings)
        spec.processor(processor, batch=batch)
        if timer is not None:
            spec.timer(timer)
    return _simulate(
        *spec._arguments(),
        input_partitions,
        list((outputs or {}).items()),
        _input_records(spec, records, input_partitions, spec.inputs),
        (seed_range.start, seed_range.stop),
        crashes_max,
    )
