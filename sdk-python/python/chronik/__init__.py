"""Chronik: an embedded log engine with no server to run.

    import chronik

    with chronik.open("./data") as db:
        db.create_topic("clicks", partitions=4)
        producer = db.producer("clicks")
        producer.send(b"user-42", b"/home")
        partition, offset = producer.send(b"user-42", b"/cart")
        for record in db.consumer("clicks", partition=partition):
            print(record.offset, bytes(record.value))

The engine is the Rust crate `chronik`; this package is its Python face (pyo3). Calls that
wait on the disk release the GIL. Errors are `ChronikError` and its subclasses.
"""

from chronik._chronik import (
    AlreadyExistsError,
    Chronik,
    ChronikError,
    ClosedError,
    Consumer,
    CorruptionError,
    InvalidArgumentError,
    IoError,
    LockedError,
    NotFoundError,
    OffsetOutOfRangeError,
    PoisonedError,
    Producer,
    Record,
    open,
)

__all__ = [
    "AlreadyExistsError",
    "Chronik",
    "ChronikError",
    "ClosedError",
    "Consumer",
    "CorruptionError",
    "InvalidArgumentError",
    "IoError",
    "LockedError",
    "NotFoundError",
    "OffsetOutOfRangeError",
    "PoisonedError",
    "Producer",
    "Record",
    "open",
]
