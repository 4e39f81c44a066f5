"""Processor applications: the decorators and the `App` class over the Rust runner."""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from chronik._chronik import Chronik, _App, _check_spec

StoresSpec = Union[Sequence[str], Mapping[str, str]]


class Processor:
    """Base class of a class-based processor: one instance per input partition (task).

    Define `process(record, ctx)`, or `process_batch(records, ctx)` to take a whole batch
    (up to 1024 records of one input) in one call. Optionally `init(ctx)` (after the stores
    are restored), `punctuate(kind, time, ctx)` (a timer: kind "stream" or "wall") and
    `close(ctx)` (at a clean stop, before the last commit). Keep all state in `ctx.store(...)`:
    anything kept in attributes is lost at a crash and not restored.
    """


def _store_list(stores: StoresSpec) -> List[Tuple[str, str]]:
    if isinstance(stores, Mapping):
        return [(str(name), str(fmt)) for name, fmt in stores.items()]
    if isinstance(stores, str):
        return [(stores, "json")]
    return [(str(name), "json") for name in stores]


class _FunctionHandler:
    """A handler made of functions (the decorator form); Rust looks its methods up once."""

    __slots__ = ("process", "process_batch", "punctuate", "init", "close")

    def __init__(self, process, process_batch, punctuate, init, close):
        self.process = process
        self.process_batch = process_batch
        self.punctuate = punctuate
        self.init = init
        self.close = close


class Spec:
    """What a processor is: its handler (a function or a Processor class) and its settings.

    `stores`: store names (JSON keys and values, kept in memory), or a mapping of name to a
    spec: `+`-separated words, each a format (`"json"`, the default; `"str"`; `"bytes"`) or a
    kind (`"memory"`; `"disk"`; `"disk:<MiB>"`), e.g. `{"counts": "disk"}` or
    `{"raw": "bytes+disk:256"}`. A disk store keeps its entries in sorted files beside the
    topics and restarts by reading only the changelog it had not yet taken. Its cache, its
    changes not yet written and its files' indexes live in one memory budget that every disk
    store and partition of the application shares: `store_memory_mib` MiB, or by default the
    process's (256 MiB, shared by every application of the process); `"disk:<MiB>"` gives a
    store a budget of its own, shared by its partitions. `store_kind` sets the kind of every
    store whose spec names none.

    `on_decode_error`: what an input record whose key or value is not in `key_format` /
    `value_format` does, checked before the handler sees it. `"fail"` (the default): the
    run raises `DecodeError` (its `topic`, `partition`, `offset` and `reason`), and nothing
    of the record's batch commits. `"skip"`: the record is left out, counted in the run's
    `skipped_records`. `"dead_letter"`: the record as it is (key, value, timestamp, headers)
    goes to `dead_letter_topic` (which must exist) with the headers `dead_letter.topic`,
    `dead_letter.partition`, `dead_letter.offset` and `dead_letter.error`, in the same
    transaction as the task's other outputs (exactly once), counted in `dead_letters`.
    """

    def __init__(
        self,
        name: str,
        input: Union[str, Sequence[str]],
        *,
        stores: StoresSpec = (),
        key_format: str = "bytes",
        value_format: str = "bytes",
        commit_interval_ms: int = 100,
        commit_every_records: Optional[int] = None,
        snapshot_every_commits: Optional[int] = None,
        store_kind: Optional[str] = None,
        store_memory_mib: Optional[int] = None,
        threads: int = 1,
        punctuate_stream_ms: Optional[int] = None,
        punctuate_wall_ms: Optional[int] = None,
        on_decode_error: str = "fail",
        dead_letter_topic: Optional[str] = None,
    ) -> None:
        self.name = name
        self.inputs = [input] if isinstance(input, str) else list(input)
        self.stores = _store_list(stores)
        self.key_format = key_format
        self.value_format = value_format
        self.options = {
            "commit_interval_ms": commit_interval_ms,
            "commit_every_records": commit_every_records,
            "snapshot_every_commits": snapshot_every_commits,
            "store_kind": store_kind,
            "store_memory_mib": store_memory_mib,
            "threads": threads,
            "punctuate_stream_ms": punctuate_stream_ms,
            "punctuate_wall_ms": punctuate_wall_ms,
            "on_decode_error": on_decode_error,
            "dead_letter_topic": dead_letter_topic,
        }
        # Bad store specs, formats and settings raise InvalidArgumentError here, not at the
        # first run (often far from the line that made the mistake).
        _check_spec(name, self.inputs, self.stores, key_format, value_format, self.options)
        self._target: Any = None
        self._batch = False
        self._timer: Optional[Callable[..., Any]] = None
        self._init: Optional[Callable[..., Any]] = None
        self._close: Optional[Callable[..., Any]] = None

    def processor(self, target: Any = None, *, batch: bool = False) -> Any:
        """Register the handler: a function `(record, ctx)` (with `batch=True`, `(records,
        ctx)`), or a `Processor` subclass. Usable as `@app.processor` or
        `@app.processor(batch=True)`."""

        def register(target: Any) -> Any:
            if self._target is not None:
                raise ValueError(f"application {self.name!r} already has a processor")
            if not (inspect.isclass(target) or callable(target)):
                raise TypeError("a processor is a function or a Processor subclass")
            self._target = target
            self._batch = batch
            return target

        return register if target is None else register(target)

    def timer(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Register `function(kind, time, ctx)` for a function processor's timers."""
        self._timer = function
        return function

    def on_init(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Register `function(ctx)`, called per task after its stores are restored."""
        self._init = function
        return function

    def on_close(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Register `function(ctx)`, called per task at a clean stop, before the last commit."""
        self._close = function
        return function

    def _factory(self) -> Callable[[int], Any]:
        target = self._target
        if target is None:
            raise ValueError(f"application {self.name!r} has no processor: use @app.processor")
        if inspect.isclass(target):
            return lambda partition: target()
        handler = _FunctionHandler(
            None if self._batch else target,
            target if self._batch else None,
            self._timer,
            self._init,
            self._close,
        )
        return lambda partition: handler

    def _arguments(
        self,
    ) -> Tuple[str, List[str], Callable[[int], Any], List[Tuple[str, str]], str, str, Dict[str, Any]]:
        return (
            self.name,
            self.inputs,
            self._factory(),
            self.stores,
            self.key_format,
            self.value_format,
            self.options,
        )


class App(Spec):
    """A stateful stream processor application on an open data directory.

        app = chronik.App(db, "wordcount", input="lines", stores=["counts"])

        @app.processor
        def count(record, ctx):
            counts = ctx.store("counts")
            for word in record.value.decode().split():
                counts[word] = counts.get(word, 0) + 1

        app.run()   # until Ctrl-C or app.stop(); or app.run_for(10), app.run_until_caught_up()

    One task per input partition; each commits its store changes (to compacted changelog
    topics `<name>-<store>-changelog`), its emitted records and its input position in one
    transaction, so after a crash the state and the outputs are exactly those of a run
    without it. The loop runs in Rust and takes the GIL once per batch of records.
    """

    def __init__(
        self,
        db: Chronik,
        name: str,
        input: Union[str, Sequence[str]],
        guarantee: Optional[str] = None,
        **settings: Any,
    ):
        super().__init__(name, input, **settings)
        self._db = db
        self._app: Optional[_App] = None
        # On a Kafka-protocol cluster: "exactly-once" (Kafka transactions) or "at-least-once";
        # CHRONIK_GUARANTEE sets the default. The embedded engine is always exactly once.
        self.guarantee = guarantee or os.environ.get("CHRONIK_GUARANTEE", "exactly-once")

    def _rust(self) -> _App:
        if self._app is None:
            from chronik._cluster import Cluster

            if isinstance(self._db, Cluster):
                from chronik._chronik import _ClusterApp

                self._app = _ClusterApp(self._db._rust, *self._arguments(), self.guarantee)
            else:
                self._app = _App(self._db, *self._arguments())
        return self._app

    def run(self) -> Dict[str, int]:
        """Restore the stores and process on the worker threads until `stop()` or Ctrl-C
        (then the processors close and commit, and KeyboardInterrupt propagates). Returns
        counts: records, commits, emitted, restored, snapshots_loaded, snapshots_written,
        stores_opened (disk stores opened with their state: only the changelog after it was
        read), stores_rebuilt (disk stores found missing, stale, foreign or damaged),
        skipped_records and dead_letters (inputs that did not decode: see `on_decode_error`)."""
        return self._rust().run()

    def run_for(self, seconds: float) -> Dict[str, int]:
        """`run` for at most `seconds`, then stop cleanly."""
        return self._rust().run(seconds)

    def run_until_caught_up(self) -> Dict[str, int]:
        """Process every input partition up to its high watermark on this thread, commit."""
        return self._rust().run_until_caught_up()

    def stop(self) -> None:
        """Make a `run` in progress (another thread, a signal handler) stop cleanly."""
        if self._app is not None:
            self._app.stop()

    def store(self, name: str, partition: Optional[int] = None) -> Dict[Any, Any]:
        """Store `name` of one task (`partition`) as a dict, or of all tasks in one dict
        (a key in two partitions is an error then). Restores the stores first if needed.
        On a cluster: the committed state of every partition, read from the changelog."""
        if partition is None and not isinstance(self._rust(), _App):
            return self._rust().store(name)
        return self._rust().store(name, partition)

    def positions(self) -> List[int]:
        """Per partition, the next offset of the first input to process."""
        return self._rust().positions()

