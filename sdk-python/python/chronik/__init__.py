"""Chronik: an embedded log engine with no server to run.

    import chronik

    with chronik.open("./data") as db:
        db.create_topic("clicks", partitions=4)
        producer = db.producer("clicks")
        producer.send(b"user-42", b"/home")
        partition, offset = producer.send(b"user-42", b"/cart")
        for record in db.consumer("clicks", partition=partition):
            print(record.offset, bytes(record.value))

Stateful processors (exactly once, state restored after a crash):

    app = chronik.App(db, "wordcount", input="lines", stores=["counts"])

    @app.processor
    def count(record, ctx):
        counts = ctx.store("counts")
        for word in record.value.decode().split():
            counts[word] = counts.get(word, 0) + 1
            ctx.emit("word-counts", word, counts[word])

    app.run_for(10)

Windows, aggregations and joins as operators (a topology), exactly once:

    topology = chronik.Topology(db, "per-minute", key_format="str")
    (topology.stream("clicks")
        .group_by_key()
        .window(chronik.Windows.tumbling(60_000, grace_ms=5_000), emit="final")
        .count()
        .to("clicks-per-minute"))
    topology.run_until_caught_up()

The engine is the Rust crate `chronik`; this package is its Python face (pyo3). Calls that
wait on the disk release the GIL. Errors are `ChronikError` and its subclasses.
"""

from chronik._app import App, Processor, Spec
from chronik._cluster import Cluster, ClusterProducer, connect
from chronik._chronik import (
    AlreadyExistsError,
    Chronik,
    ChronikError,
    ClosedError,
    Consumer,
    Context,
    CorruptionError,
    DecodeError,
    Event,
    Grouped,
    InvalidArgumentError,
    IoError,
    LockedError,
    NotFoundError,
    OffsetOutOfRangeError,
    PoisonedError,
    Producer,
    ReadOnlyError,
    Record,
    Store,
    Stream,
    Table,
    Topology,
    Windowed,
    Windows,
    open,
    partition_for_key,
)

__all__ = [
    "AlreadyExistsError",
    "App",
    "Chronik",
    "ChronikError",
    "ClosedError",
    "Cluster",
    "ClusterProducer",
    "Consumer",
    "Context",
    "CorruptionError",
    "DecodeError",
    "Event",
    "Grouped",
    "InvalidArgumentError",
    "IoError",
    "LockedError",
    "NotFoundError",
    "OffsetOutOfRangeError",
    "PoisonedError",
    "Processor",
    "Producer",
    "ReadOnlyError",
    "Record",
    "Spec",
    "Store",
    "Stream",
    "Table",
    "Topology",
    "Windowed",
    "Windows",
    "connect",
    "open",
    "partition_for_key",
]
