"""Type stubs of the extension module `chronik._chronik`."""

from types import TracebackType
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

BytesLike = Union[bytes, bytearray, memoryview, str]
Headers = Union[Mapping[BytesLike, BytesLike], Iterable[Tuple[BytesLike, BytesLike]]]

class ChronikError(Exception): ...
class CorruptionError(ChronikError): ...
class PoisonedError(ChronikError): ...
class NotFoundError(ChronikError): ...
class AlreadyExistsError(ChronikError): ...
class InvalidArgumentError(ChronikError): ...
class LockedError(ChronikError): ...
class OffsetOutOfRangeError(ChronikError): ...
class IoError(ChronikError): ...
class ClosedError(ChronikError): ...
class ReadOnlyError(ChronikError): ...

class DecodeError(ChronikError):
    """An input record not in the processor's key or value format (`on_decode_error="fail"`)."""

    topic: str
    partition: int
    offset: int
    reason: str


class SimulationFailure(Exception):
    """A simulated run differed from the fault-free run (or an oracle failed)."""

    seed: int
    kind: str
    detail: str

class Record:
    """A record read from a partition; `key` and `value` are memoryviews (no copy per record)."""

    offset: int
    timestamp: int
    key: Optional[memoryview]
    value: memoryview
    headers: list[Tuple[bytes, bytes]]

class Producer:
    topic: str
    def send(
        self,
        key: Optional[BytesLike],
        value: BytesLike,
        headers: Optional[Headers] = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> Tuple[int, int]:
        """Append one record (timestamp: ms since the epoch, default now); `(partition,
        offset)` once acknowledged per the durability mode."""
    def send_batch(
        self, records: Iterable[Sequence[object]], partition: Optional[int] = None
    ) -> list[Tuple[int, int, int]]:
        """Append `(key, value)`, `(key, value, headers)` or `(key, value, headers, timestamp)`
        tuples, one batch per partition (more where one would pass the engine's limits of 16 MiB
        and 2**20 records, each batch atomic on its own); `(partition, first offset, last
        offset)` per batch."""
    def send_async(
        self,
        key: Optional[BytesLike],
        value: BytesLike,
        headers: Optional[Headers] = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> PendingSend:
        """Queue one record and return at once; many in flight share fsyncs. Offsets follow
        the order of the calls per partition."""
    def flush(self) -> None:
        """Wait until every record queued so far is durable."""

class PendingSend:
    partition: int
    def done(self) -> bool:
        """Whether the send is acknowledged or failed (never blocks)."""
    def result(self) -> Tuple[int, int]:
        """Wait (without the GIL) and return `(partition, offset)`, or raise what `send`
        would have raised."""

class Consumer:
    position: int
    group: Optional[str]
    def poll(
        self, max_records: Optional[int] = None, timeout: Optional[float] = None
    ) -> list[Record]:
        """Records from the position on; `[]` only when caught up (at the high watermark),
        after waiting up to `timeout` seconds (Ctrl-C interrupts the wait)."""
    def __iter__(self) -> Iterator[Record]: ...
    def __next__(self) -> Record: ...
    def seek(self, offset: int) -> None: ...
    def commit(self) -> None: ...
    def committed(self) -> Optional[int]: ...

class _ClusterConsumer:
    """`chronik.connect("kafka://...").consumer(...)`: the calls of `Consumer` on a cluster."""

    position: int
    group: Optional[str]
    def poll(
        self, max_records: Optional[int] = None, timeout: Optional[float] = None
    ) -> list[Record]:
        """Records from the position on; `[]` when caught up, after waiting up to `timeout`
        seconds."""
    def __iter__(self) -> Iterator[Record]: ...
    def __next__(self) -> Record: ...
    def seek(self, offset: int) -> None: ...
    def commit(self) -> None: ...
    def committed(self) -> Optional[int]: ...

class Chronik:
    path: str
    def __enter__(self) -> "Chronik": ...
    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
    def close(self) -> None: ...
    def recovery(self) -> list[str]: ...
    def metrics(self) -> dict[str, Any]:
        """Counters and latency histograms since the directory was opened."""
    def metrics_prometheus(self) -> str:
        """The metrics in the Prometheus text exposition format."""
    def create_topic(
        self, name: str, partitions: int = 1, config: Optional[Mapping[str, object]] = None
    ) -> None: ...
    def delete_topic(self, name: str) -> None: ...
    def list_topics(self) -> list[str]: ...
    def describe_topic(self, name: str) -> dict: ...
    def alter_topic_config(self, name: str, settings: Mapping[str, object]) -> None: ...
    def high_watermark(self, topic: str, partition: int) -> int: ...
    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """Delete the records below `before`, whole sealed segments at a time (Kafka's
        DeleteRecords); returns the log start after the call (the call never moves it past
        `before`, nor back)."""
    def flush(self) -> None: ...
    read_only: bool
    def refresh(self) -> None:
        """Read-only opens: take in what the writing process appended since the last look."""
    def compact_topic(self, name: str) -> list[Optional[int]]:
        """Compact a compacted topic now; the records kept per partition (None: nothing to do)."""
    def partition_count(self, topic: str) -> int:
        """The topic's partition count (`NotFoundError` for no such topic)."""
    def records(
        self, topic: str, partition: int
    ) -> list[Tuple[int, int, Optional[bytes], bytes, list[Tuple[bytes, bytes]]]]:
        """Every record from the log start: (offset, timestamp, key, value, headers)."""
    def producer(self, topic: str) -> Producer: ...
    def consumer(self, topic: str, partition: int = 0, group: Optional[str] = None) -> Consumer: ...

class Store:
    """A task's key-value store (restored from its changelog), usable inside its calls."""

    name: str
    def get(self, key: Any, default: Any = None) -> Any: ...
    def __getitem__(self, key: Any) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None:
        """KeyError when absent, as a dict: it reads the key first (`discard` does not)."""
    def discard(self, key: Any) -> None:
        """Delete the key whether it is there or not, without reading it."""
    def __contains__(self, key: Any) -> bool: ...
    def __len__(self) -> int:
        """Exact: a disk store scans every entry (`len_estimate()` answers at once)."""
    def len_estimate(self) -> int:
        """Keys without reading: exact in memory, an estimate on disk."""
    def __iter__(self) -> Iterator[Any]: ...
    def pop(self, key: Any, default: Any = ...) -> Any: ...
    def keys(self) -> list[Any]: ...
    def values(self) -> list[Any]: ...
    def items(self) -> list[Tuple[Any, Any]]: ...
    def range(self, start: Any = None, end: Any = None) -> list[Tuple[Any, Any]]:
        """Entries with start <= encoded key < end, in key order."""

class Context:
    """Given to each handler call: stores, emits, partition and stream time."""

    partition: int
    stream_time: int
    input: str
    def store(self, name: str) -> Store: ...
    def emit(self, topic: str, key: Any, value: Any) -> None:
        """Emit with the next commit; bytes-like and str as they are, others as JSON."""
    def emit_json(self, topic: str, key: Any, value: Any) -> None:
        """Emit with key (unless None) and value as JSON, strings included."""

class _App:
    def __init__(
        self,
        db: Chronik,
        application: str,
        inputs: Sequence[str],
        factory: Callable[[int], Any],
        stores: Sequence[Tuple[str, str]],
        key_format: str,
        value_format: str,
        options: Mapping[str, Any],
    ) -> None: ...
    def run(self, seconds: Optional[float] = None) -> dict[str, int]: ...
    def run_until_caught_up(self) -> dict[str, int]: ...
    def stop(self) -> None: ...
    def store(self, name: str, partition: Optional[int] = None) -> dict[Any, Any]: ...
    def positions(self) -> list[int]: ...

def simulate(
    application: str,
    inputs: Sequence[str],
    factory: Callable[[int], Any],
    stores: Sequence[Tuple[str, str]],
    key_format: str,
    value_format: str,
    options: Mapping[str, Any],
    input_partitions: int,
    outputs: Sequence[Tuple[str, int]],
    records: Sequence[Tuple[int, int, Optional[bytes], bytes, Optional[int]]],
    seeds: Tuple[int, int],
    crashes_max: int,
) -> dict[str, int]: ...
def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a key goes to among `partitions` (the producer's choice)."""

def _encode(format: str, value: Any) -> bytes: ...
def _check_spec(
    application: str,
    inputs: Sequence[str],
    stores: Sequence[Tuple[str, str]],
    key_format: str,
    value_format: str,
    options: Mapping[str, Any],
) -> None: ...

def open(path: str, durability: str = "sync", read_only: bool = False) -> Chronik:
    """Open (creating if needed) a data directory; durability "sync", "os" or "interval:MS".
    `read_only`: beside a process that writes it, without the lock; writes raise
    `ReadOnlyError`."""

class Event:
    """A record as a topology's functions see it: key and value in the topology's formats,
    timestamp (ms), and for a windowed aggregation's result its window (start, end) in ms.
    Return one from `map` or `flat_map` (or a `(key, value)` pair)."""

    key: Any
    value: Any
    timestamp: Optional[int]
    window: Optional[Tuple[int, int]]
    def __init__(self, key: Any, value: Any, timestamp: Optional[int] = None) -> None:
        """Without a timestamp, it keeps the time of the event it replaces."""

class Windows:
    """How events are cut into windows, each with `grace_ms` for late events."""

    @staticmethod
    def tumbling(size_ms: int, grace_ms: int = 0) -> "Windows":
        """Back-to-back windows of `size_ms`, aligned to the epoch."""
    @staticmethod
    def hopping(size_ms: int, advance_ms: int, grace_ms: int = 0) -> "Windows":
        """Windows of `size_ms` starting every `advance_ms`."""
    @staticmethod
    def sliding(size_ms: int, grace_ms: int = 0) -> "Windows":
        """For each event, the window of `size_ms` ending at it: (t - size, t]."""
    @staticmethod
    def session(gap_ms: int, grace_ms: int = 0) -> "Windows":
        """A key's events at most `gap_ms` apart, in one window."""

class Table:
    """A topic's latest value per key (an empty value deletes), to join streams with."""

class Stream:
    """A stream of events; each operator returns a new stream."""

    def filter(self, keep: Callable[[Event], bool]) -> "Stream": ...
    def map(self, f: Callable[[Event], Union[Event, Tuple[Any, Any]]]) -> "Stream":
        """Each event replaced by f's (the key may change: group_by_key then repartitions)."""
    def map_values(self, f: Callable[[Event], Any]) -> "Stream": ...
    def flat_map(self, f: Callable[[Event], Iterable[Union[Event, Tuple[Any, Any]]]]) -> "Stream": ...
    def peek(self, f: Callable[[Event], Any]) -> "Stream": ...
    def group_by(self, key: Callable[[Event], Any]) -> "Grouped":
        """Grouped by key(event), repartitioned through an internal topic."""
    def group_by_key(self) -> "Grouped": ...
    def join(self, table: Table, f: Callable[[Event, Any], Any]) -> "Stream":
        """Joined with the key's row as of the event's time; events without a row dropped."""
    def left_join(self, table: Table, f: Callable[[Event, Optional[Any]], Any]) -> "Stream": ...
    def join_stream(
        self, other: "Stream", window_ms: int, f: Callable[[Event, Event], Any], grace_ms: int = 0
    ) -> "Stream":
        """Pairs of same-key events of both streams at most window_ms apart."""
    def left_join_stream(
        self,
        other: "Stream",
        window_ms: int,
        f: Callable[[Event, Optional[Event]], Any],
        grace_ms: int = 0,
    ) -> "Stream":
        """join_stream, and f(event, None) for each event of this stream that found no
        partner, once its window and grace have passed."""
    def outer_join_stream(
        self,
        other: "Stream",
        window_ms: int,
        f: Callable[[Optional[Event], Optional[Event]], Any],
        grace_ms: int = 0,
    ) -> "Stream":
        """left_join_stream on both sides: f(event, None) or f(None, other_event) for events
        of either stream without a partner."""
    def to(self, topic: str) -> None:
        """Write to `topic`; windowed results carry headers window.start and window.end."""

class Grouped:
    """A grouped stream, to aggregate in windows or not."""

    def named(self, store: str) -> "Grouped": ...
    def store_kind(self, kind: str) -> "Grouped": ...
    def window(
        self, windows: Windows, emit: str = "updates", late_to: Optional[str] = None
    ) -> "Windowed":
        """emit: "updates" (after each event) or "final" (once, when the window closes)."""
    def count(self) -> Stream: ...
    def reduce(self, f: Callable[[Any, Any], Any]) -> Stream: ...
    def aggregate(self, init: Callable[[], Any], add: Callable[[Any, Event], Any]) -> Stream: ...

class Windowed:
    """A grouped stream in windows, to aggregate."""

    def count(self) -> Stream: ...
    def reduce(self, f: Callable[[Any, Any], Any]) -> Stream: ...
    def aggregate(
        self,
        init: Callable[[], Any],
        add: Callable[[Any, Event], Any],
        merge: Optional[Callable[[Any, Any], Any]] = None,
    ) -> Stream:
        """Session windows need merge(a, b) for two sessions an event bridges."""

class Topology:
    """Streams, tables and their operators, run exactly once on a data directory (or `None`
    to only simulate it), or on a cluster (`chronik.connect("kafka://...")`: exactly once
    with Kafka transactions, or `guarantee="at-least-once"`, by default CHRONIK_GUARANTEE's;
    outputs may repeat: docs/kafka.md). Settings: commit_interval_ms, commit_every_records,
    snapshot_every_commits, threads, store_kind, store_memory_mib (the budget its disk
    stores share, as `App`'s), on_decode_error ("fail", "skip" or "dead_letter": for the
    records of its streams not in its formats, as `App`'s) and dead_letter_topic."""

    key_format: str
    value_format: str
    def __init__(
        self,
        db: Optional[Any],
        name: str,
        key_format: str = "str",
        value_format: str = "json",
        **settings: Any,
    ) -> None: ...
    def stream(self, topic: str) -> Stream: ...
    def table(self, topic: str) -> Table: ...
    def describe(self) -> str: ...
    def sources(self) -> list[str]: ...
    def run_until_caught_up(self) -> Dict[str, int]: ...
    def run(self, seconds: Optional[float] = None) -> Dict[str, int]: ...
    def stop(self) -> None: ...
    def late_records(self) -> int: ...

def simulate_topology(
    topology: Topology,
    input_partitions: int,
    outputs: Sequence[Tuple[str, int]],
    records: Sequence[Tuple[int, int, Optional[bytes], bytes, Optional[int]]],
    seeds: Tuple[int, int],
    crashes_max: int,
) -> Dict[str, int]: ...
