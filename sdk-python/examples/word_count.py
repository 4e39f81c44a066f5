"""Word count over a text file, exactly once, with state restored after a crash.

    python word_count.py DATA_DIR TEXT_FILE [--out counts.json]
    python word_count.py kafka://HOST:PORT TEXT_FILE [--out counts.json]

Three steps, each resumable after a kill at any moment:

1. The file's lines are appended to the topic `lines` (one partition, in order), from where
   an earlier run stopped (the topic's high watermark is the next line to append).
2. The application `splitter` reads `lines` and emits each word keyed by itself to `words`
   (4 partitions): a repartition by word, like Kafka Streams' `groupBy`.
3. The application `counter` reads `words` and counts per word in its store `counts`,
   backed by the compacted changelog `counter-counts-changelog`; it emits each new count to
   `word-counts`.

Both applications commit their outputs, store changes and input positions in one
transaction, so killing this script (even with SIGKILL) and running it again gives the same
final counts as one uninterrupted run. Run it twice: the second run opens the counts' disk
store, reads only the changelog it had not yet taken, and has nothing left to do.
"""

import argparse
import json
import sys

import chronik

WORD_PARTITIONS = 4


def split_line(record, ctx):
    """`lines` -> `words`: one record per word, keyed by the word."""
    for word in record.value.split():
        word = word.strip(".,;:!?\"'()[]").lower()
        if word:
            ctx.emit("words", word, b"")


def count_word(record, ctx):
    """`words` -> store `counts` and `word-counts`."""
    counts = ctx.store("counts")
    word = record.key
    total = counts.get(word, 0) + 1
    counts[word] = total
    ctx.emit("word-counts", word, total)


SPLITTER = {"value_format": "str", "commit_interval_ms": 200}
# The counts live in a disk store: memory stays bounded however many words there are, and a
# restart reads only the changelog the store had not yet taken.
COUNTER = {
    "key_format": "str",
    "stores": {"counts": "disk"},
    "commit_interval_ms": 200,
}


def ensure_topic(db, name, partitions):
    if name not in db.list_topics():
        db.create_topic(name, partitions=partitions)


def append_lines(db, path):
    """Append the lines of `path` not yet in `lines`; returns how many were appended."""
    with open(path, encoding="utf-8") as text:
        lines = text.read().splitlines()
    done = db.high_watermark("lines", 0)
    producer = db.producer("lines")
    for start in range(done, len(lines), 10_000):
        producer.send_batch([(None, line) for line in lines[start : start + 10_000]], partition=0)
    return len(lines) - done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("text_file")
    parser.add_argument("--out", help="write the final counts here as JSON")
    parser.add_argument(
        "--step",
        choices=["all", "split", "count"],
        default="all",
        help="all (the default); or only append and split, or only count: start `--step count` "
        "several times on a cluster and the processes share the partitions of `words`",
    )
    args = parser.parse_args(argv)
    with chronik.connect(args.data_dir) as db:
        for line in db.recovery():
            print(f"recovery: {line}")
        ensure_topic(db, "lines", 1)
        ensure_topic(db, "words", WORD_PARTITIONS)
        ensure_topic(db, "word-counts", WORD_PARTITIONS)
        if args.step in ("all", "split"):
            appended = append_lines(db, args.text_file)
            print(f"appended {appended} lines")

        splitter = chronik.App(db, "splitter", input="lines", **SPLITTER)
        splitter.processor(split_line)
        counter_settings = dict(COUNTER)
        if args.data_dir.startswith("kafka://"):
            # On a cluster a partition may move to another machine: its store is kept in
            # memory and restored from the changelog topic.
            counter_settings["stores"] = {"counts": "memory"}
        counter = chronik.App(db, "counter", input="words", **counter_settings)
        counter.processor(count_word)

        if args.step in ("all", "split"):
            split = splitter.run_until_caught_up()
            print(f"splitter: {split['records']} lines, {split['emitted']} words emitted")
        if args.step == "split":
            return 0
        counted = counter.run_until_caught_up()
        print(
            f"counter: restored {counted['restored']} changelog records "
            f"({counted['stores_opened']} disk stores opened, {counted['stores_rebuilt']} rebuilt), "
            f"counted {counted['records']} words"
        )
        counts = counter.store("counts")
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        print(f"{len(counts)} distinct words, {sum(counts.values())} in all; top: {top}")
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                json.dump(counts, out, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
