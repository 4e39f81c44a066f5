"""Three topologies over the same clicks, each exactly once under kills (`chronik.Topology`).

    python clicks_windows.py DATA_DIR [--clicks N] [--topology per-minute|sessions|enriched]
                             [--store memory|disk|disk:MiB]

DATA_DIR may be `kafka://host:port`: the same topologies run on a Kafka-protocol cluster
(`chronik.connect`), exactly once where it has transactions, else with
CHRONIK_GUARANTEE=at-least-once (a result written again after a kill is then counted and
dropped before the check). `--store disk` keeps the windows in disk stores (on a cluster
under `state.dir`: `CHRONIK_KAFKA_STATE_DIR`).

- `per-minute`: clicks per user in tumbling one-minute windows, emitted once per window when
  it closes (5 s of grace for late clicks; later ones go to `late-clicks`);
- `sessions`: each user's sessions (clicks at most 30 s apart), emitted when they close;
- `enriched`: each click joined with its user's row in the `users` table as of the click's
  time (a Python function makes the joined value).

The Python twin of the Rust example `sdk-rust/examples/clicks_windows.rs`: the same clicks,
topologies and checks. N defaults to 200,000. The clicks: one every 3 ms of event time;
each 60 s of them comes from one tenth of the users; every 101st click is 2 s late (within
grace) and every 997th two minutes late (beyond it). Every 25,000 clicks, 20 users change
plan in `users` (all 1,000 start on "free").

The Python SDK has no transaction across partitions, so production is resumable instead:
each partition's records are a fixed sequence, appended from the partition's record count
on, so a kill leaves a prefix that the next run completes. The topology runs only after
every partition is complete, so it never sees a partial input.

Kill the example at any moment (SIGKILL included) and start it again with the same N: the
last line checks every output record, per partition and in order, against the results
worked out in plain Python (`exact: ...`); a difference prints `MISMATCH ...` and exits 1.
"""

import argparse
import heapq
import os
import sys
import time

import chronik

PARTITIONS = 4
START_MS = 1_700_000_000_000
BATCH = 1_000
GRACE_MS = 5_000
MINUTE_MS = 60_000
GAP_MS = 30_000
# Records per append: one acknowledgement each.
APPEND_RECORDS_MAX = 10_000
# A commit at least every this many records (besides the runtime's every 100 ms): a kill
# while the topology runs leaves several commits to go on from.
COMMIT_EVERY_RECORDS = 20_000
TOPICS = ["clicks", "users", "clicks-per-minute", "late-clicks", "sessions", "clicks-enriched"]
TOPOLOGIES = ["per-minute", "sessions", "enriched"]


def click(i):
    """Click `i`: (user, page, time)."""
    block = i // 20_000
    user = f"user-{(block % 10) * 100 + (i * 7919) % 100:04}"
    at = START_MS + 3 * i
    if i % 101 == 0:
        at -= 2_000
    if i % 997 == 0:
        at -= 120_000
    return user, f"/page/{i % 50}", at


def plan_changes(i):
    """The plan changes made with the batch starting at click `i`: (user, plan, time)."""
    at = START_MS + 3 * i
    if i == 0:
        return [(f"user-{u:04}", "free", at - 1) for u in range(1000)]
    if i % 25_000 != 0:
        return []
    version = i // 25_000
    return [(f"user-{(version * 37 + n * 50) % 1000:04}", f"pro-{version}", at) for n in range(20)]


def inputs(clicks):
    """Per partition, its clicks and its plan changes, in the order they are appended."""
    partition_of = {}

    def partition(user):
        if user not in partition_of:
            partition_of[user] = chronik.partition_for_key(user.encode(), PARTITIONS)
        return partition_of[user]

    per_partition = [([], []) for _ in range(PARTITIONS)]
    for batch in range(0, clicks, BATCH):
        for change in plan_changes(batch):
            per_partition[partition(change[0])][1].append(change)
        for i in range(batch, min(batch + BATCH, clicks)):
            c = click(i)
            per_partition[partition(c[0])][0].append(c)
    return per_partition


def produce(db, per_partition):
    """Append what each partition of `clicks` and `users` lacks: its records from its record
    count on."""
    missing = []  # (topic, partition, records)
    for topic, side in [("users", 1), ("clicks", 0)]:
        for p, rows in enumerate(per_partition):
            records = rows[side]
            done = db.high_watermark(topic, p)
            if done > len(records):
                raise SystemExit(
                    f"{topic} partition {p} holds {done} records, more than the {len(records)} "
                    "of this run: start again with the same --clicks, or in a new directory"
                )
            if done < len(records):
                missing.append((topic, p, records[done:]))
    if not missing:
        return
    print(f"appending {sum(len(records) for _, _, records in missing)} clicks and plan changes")
    started = time.monotonic()
    for topic, p, records in missing:
        producer = db.producer(topic)
        for start in range(0, len(records), APPEND_RECORDS_MAX):
            chunk = records[start : start + APPEND_RECORDS_MAX]
            producer.send_batch([(k, v, None, t) for k, v, t in chunk], partition=p)
    print(f"appended them in {time.monotonic() - started:.2f} s")


def build(db, name, store="memory"):
    """The topology `name` (its windows in stores of kind `store`), and its output topic."""
    topology = chronik.Topology(
        db, name, key_format="str", value_format="str", commit_every_records=COMMIT_EVERY_RECORDS
    )
    clicks = topology.stream("clicks")
    if name == "per-minute":
        (
            clicks.group_by_key()
            .named("per-minute")
            .store_kind(store)
            .window(
                chronik.Windows.tumbling(MINUTE_MS, grace_ms=GRACE_MS),
                emit="final",
                late_to="late-clicks",
            )
            .count()
            .to("clicks-per-minute")
        )
        return topology, "clicks-per-minute"
    if name == "sessions":
        (
            clicks.group_by_key()
            .named("sessions")
            .store_kind(store)
            .window(chronik.Windows.session(GAP_MS, grace_ms=GRACE_MS), emit="final")
            .count()
            .to("sessions")
        )
        return topology, "sessions"
    users = topology.table("users")
    clicks.left_join(
        users, lambda click, plan: f"{'unknown' if plan is None else plan} {click.value}"
    ).to("clicks-enriched")
    return topology, "clicks-enriched"


def per_minute(clicks):
    """The final counts `user count [start, end)` in the order they close, and how many
    clicks came too late for their window."""
    observed, lines, late = None, [], 0
    open_windows = {}  # (end, user) -> count
    ends = []  # heap of the open windows' (end, user): the order they close in
    for user, _, at in clicks:
        observed = at if observed is None else max(observed, at)
        end = at - at % MINUTE_MS + MINUTE_MS
        if end + GRACE_MS > observed:
            if (end, user) not in open_windows:
                open_windows[(end, user)] = 0
                heapq.heappush(ends, (end, user))
            open_windows[(end, user)] += 1
        else:
            late += 1
        while ends and ends[0][0] + GRACE_MS <= observed:
            end, user = heapq.heappop(ends)
            count = open_windows.pop((end, user))
            lines.append(f"{user} {count} [{end - MINUTE_MS}, {end})")
    return lines, late


def sessions(clicks):
    """The sessions `user count [first, last + 1)` in the order they close (by end, then
    user by length and bytes, then start), and how many clicks came too late."""
    observed, lines, late = None, [], 0
    open_sessions = {}  # user -> {start: (end, count)}
    due = None  # the earliest time past which some session closes
    for user, _, at in clicks:
        observed = at if observed is None else max(observed, at)
        mine = open_sessions.setdefault(user, {})
        # The user's open sessions within a gap of the click (one this click's time just closed
        # is closed already); a click with none, whose own session would close at once, is late.
        touching = [
            s
            for s, (e, _) in mine.items()
            if s <= at + GAP_MS and e + GAP_MS >= at and e + GAP_MS + GRACE_MS >= observed
        ]
        if touching or at + GAP_MS + GRACE_MS >= observed:
            start, end, count = at, at, 1
            for s in touching:
                e, c = mine.pop(s)
                start, end, count = min(start, s), max(end, e), count + c
            mine[start] = (end, count)
            closes = end + GAP_MS + GRACE_MS
            due = closes if due is None else min(due, closes)
        else:
            late += 1
        if due is None or due >= observed:
            continue
        closing, due = [], None
        for who, mine in open_sessions.items():
            for start, (end, count) in mine.items():
                if end + GAP_MS + GRACE_MS < observed:
                    closing.append((end, len(who), who, start, count))
                else:
                    closes = end + GAP_MS + GRACE_MS
                    due = closes if due is None else min(due, closes)
        for end, _, who, start, count in sorted(closing):
            del open_sessions[who][start]
            lines.append(f"{who} {count} [{start}, {end + 1})")
    return lines, late


def enriched(clicks, changes):
    """Each click with its user's plan as of its time: the two inputs merged by time, a
    change before a click only if strictly earlier."""
    plans, lines, u = {}, [], 0
    for user, page, at in clicks:
        while u < len(changes) and changes[u][2] < at:
            plans[changes[u][0]] = changes[u][1]
            u += 1
        lines.append(f"{user} {plans.get(user, 'unknown')} {page}")
    return lines


def line(record):
    """A record as the check compares it: `key value`, and its window if it has one."""
    text = f"{bytes(record.key).decode()} {bytes(record.value).decode()}"
    headers = dict(record.headers)
    if b"window.start" in headers and b"window.end" in headers:
        text += f" [{headers[b'window.start'].decode()}, {headers[b'window.end'].decode()})"
    return text


class ClusterRecord:
    """A record of `Cluster.records`, with the fields `line` reads."""

    def __init__(self, timestamp, key, value, headers):
        self.timestamp, self.key, self.value, self.headers = timestamp, key, value, headers


def records(db, topic, partition):
    """Every record of the partition, in order (fetch by fetch: `poll` returns a whole one)."""
    if isinstance(db, chronik.Cluster):
        return [ClusterRecord(t, k, v, h) for _, t, k, v, h in db.records(topic, partition)]
    consumer = db.consumer(topic, partition=partition)
    out = []
    while consumer.position < db.high_watermark(topic, partition):
        fetched = consumer.poll()
        if not fetched:
            raise RuntimeError(f"{topic} partition {partition}: no record at {consumer.position}")
        out.extend(fetched)
    return out


def mismatch(message):
    print(f"MISMATCH {message}", file=sys.stderr)
    return 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--topology", choices=TOPOLOGIES, default="per-minute")
    parser.add_argument("--store", default="memory", help="memory, disk or disk:MiB")
    args = parser.parse_args(argv)
    name = args.topology
    per_partition = inputs(args.clicks)
    with chronik.connect(args.data_dir) as db:
        for topic in TOPICS:
            if topic not in db.list_topics():
                db.create_topic(topic, partitions=PARTITIONS)
        produce(db, per_partition)
        topology, output = build(db, name, args.store)
        print(topology.describe(), end="")
        started = time.monotonic()
        stats = topology.run_until_caught_up()
        elapsed = time.monotonic() - started
        # Embedded, as the stores count them; on a cluster, as this run counted them (the
        # check below counts those written instead).
        on_cluster = isinstance(db, chronik.Cluster)
        late = stats["late_records"] if on_cluster else topology.late_records()
        # At least once, a result (or late click) a kill made a stage write again is there
        # twice: the same line. Exactly once, none is.
        at_least_once = on_cluster and os.environ.get("CHRONIK_GUARANTEE") == "at-least-once"
        repeated = 0
        print(
            f"{name}: {stats['records']} records in {elapsed:.2f} s, {stats['emitted']} results, "
            f"{late} late clicks so far"
        )
        results, late_expected = 0, 0
        for p, (clicks, changes) in enumerate(per_partition):
            if name == "per-minute":
                wanted, late_here = per_minute(clicks)
            elif name == "sessions":
                wanted, late_here = sessions(clicks)
            else:
                wanted, late_here = enriched(clicks, changes), 0
            late_expected += late_here
            found = [line(record) for record in records(db, output, p)]
            if at_least_once:
                once = list(dict.fromkeys(found))
                repeated, found = repeated + len(found) - len(once), once
            if found != wanted:
                at = next(
                    (i for i, (a, b) in enumerate(zip(found, wanted)) if a != b),
                    min(len(found), len(wanted)),
                )
                return mismatch(
                    f"in {output} partition {p}: {len(found)} records, expected {len(wanted)}; "
                    f"first difference at {at}: {found[at:at + 1]} vs {wanted[at:at + 1]}"
                )
            results += len(found)
        if late != late_expected and not on_cluster:
            return mismatch(f"{late} late clicks counted, {late_expected} expected")
        if name == "per-minute":
            written = [r for p in range(PARTITIONS) for r in records(db, "late-clicks", p)]
            distinct = len({(bytes(r.key or b""), bytes(r.value), r.timestamp) for r in written})
            if at_least_once:
                repeated += len(written) - distinct
            elif distinct != len(written):
                return mismatch(f"{len(written) - distinct} late clicks written twice")
            if distinct != late_expected:
                return mismatch(f"{distinct} late clicks written, {late_expected} expected")
            print(f"late clicks: {distinct}, each counted and written to late-clicks once")
        if repeated:
            print(f"repeated: {repeated} results written again (at least once), dropped above")
    print(f"exact: {results} {name} results, each once, as worked out from the clicks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
