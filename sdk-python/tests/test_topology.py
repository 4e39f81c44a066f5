"""`chronik.Topology` from Python: each operator on a real data directory against results
worked out by hand (in the comments), Python exceptions, the simulator, invalid arguments.

Windows are aligned to the epoch; a window [start, end) closes when the operator's observed
time (the largest timestamp it has seen) reaches end + grace, and an event whose windows are
all closed is late. A windowed result has timestamp end - 1 and the headers window.start and
window.end. Sessions: events at most a gap apart merge; a session [first, last] closes when
last + gap + grace < observed; an event is late when t + grace < observed.
"""

import json
import subprocess
import sys
import time

import pytest

import chronik
from chronik.testing import SimulationFailure, simulate

Windows = chronik.Windows


@pytest.fixture
def db(tmp_path):
    with chronik.open(str(tmp_path / "data"), durability="os") as db:
        yield db


def create(db, *topics, partitions=1):
    for topic in topics:
        db.create_topic(topic, partitions=partitions)


def send(db, topic, records):
    """`(key, value, timestamp)` tuples, each to its key's partition."""
    db.producer(topic).send_batch([(key, value, None, at) for key, value, at in records])


def read(db, topic, decode=bytes.decode, partition=None):
    """The records of `topic` (or of one partition), partition by partition, as `(key,
    value, when)`: the value decoded with `decode`; `when` is the window `(start, end)` of a
    windowed result, otherwise the timestamp."""
    count = len(db.describe_topic(topic)["partitions"])
    partitions = range(count) if partition is None else [partition]
    out = []
    for p in partitions:
        for record in db.consumer(topic, partition=p):
            key = None if record.key is None else bytes(record.key).decode()
            headers = dict(record.headers)
            when = record.timestamp
            if b"window.start" in headers:
                when = (int(headers[b"window.start"]), int(headers[b"window.end"]))
                assert record.timestamp == when[1] - 1, "a window's result is at its end - 1"
            out.append((key, decode(bytes(record.value)), when))
    return out


def test_filter_peek_and_map_values_see_decoded_events(db):
    create(db, "clicks", "out")
    send(db, "clicks", [("a", '{"n": 1}', 1), ("b", '{"n": 2}', 2), ("a", '{"n": 3}', 3)])
    seen = []
    topology = chronik.Topology(db, "odd", key_format="str", value_format="json")
    (
        topology.stream("clicks")
        .filter(lambda e: e.value["n"] % 2)  # Truthy: 1 and 3 pass, 2 does not.
        .peek(lambda e: seen.append((e.key, e.value, e.timestamp)))
        .map_values(lambda e: {"n10": e.value["n"] * 10})
        .to("out")
    )
    stats = topology.run_until_caught_up()
    assert read(db, "out", json.loads) == [("a", {"n10": 10}, 1), ("a", {"n10": 30}, 3)]
    assert seen == [("a", {"n": 1}, 1), ("a", {"n": 3}, 3)]
    assert stats["records"] == 3 and stats["emitted"] == 2
    assert topology.sources() == ["clicks"]
    # The same name again: the group committed all three clicks, nothing is processed twice.
    again = chronik.Topology(db, "odd", key_format="str", value_format="json")
    again.stream("clicks").filter(lambda e: True).to("out")
    assert again.run_until_caught_up()["records"] == 0
    assert len(read(db, "out")) == 2


def test_map_returning_a_tuple_or_an_event_changes_keys_and_group_by_key_repartitions(db):
    create(db, "clicks", "swapped", "out")
    send(db, "clicks", [("u1", "/a", 1), ("u2", "/b", 2), ("u3", "/a", 3), ("u1", "/c", 4)])
    topology = chronik.Topology(db, "pages", key_format="str", value_format="str")
    # A tuple keeps the time: key page, value user.
    swapped = topology.stream("clicks").map(lambda e: (e.value, e.key))
    swapped.to("swapped")
    (
        swapped.map(lambda e: chronik.Event(e.key.upper(), e.value + "!", e.timestamp + 100))
        .group_by_key()
        .count()
        .to("out")
    )
    description = topology.describe()
    assert "Stage 1 (reads pages-repartition-" in description, description
    assert "Stage 2" not in description, description
    topology.run_until_caught_up()
    swapped_expected = [("/a", "u1", 1), ("/b", "u2", 2), ("/a", "u3", 3), ("/c", "u1", 4)]
    assert read(db, "swapped") == swapped_expected
    # Counts per new key, at the times the Event set: /A at 101 and 103.
    counted = [("/A", "1", 101), ("/B", "1", 102), ("/A", "2", 103), ("/C", "1", 104)]
    assert read(db, "out") == counted


def test_group_by_key_without_a_key_change_stays_in_one_stage(db):
    create(db, "clicks", "out")
    send(db, "clicks", [("a", "", 1), ("b", "", 2), ("a", "", 3)])
    topology = chronik.Topology(db, "same-keys", key_format="str", value_format="str")
    topology.stream("clicks").filter(lambda e: True).group_by_key().count().to("out")
    description = topology.describe()
    assert "Stage 0 (reads clicks)" in description and "Stage 1" not in description, description
    topology.run_until_caught_up()
    assert read(db, "out") == [("a", "1", 1), ("b", "1", 2), ("a", "2", 3)]
    assert not [t for t in db.list_topics() if "repartition" in t]


def test_group_by_repartitions_through_an_internal_topic(db):
    create(db, "clicks", "per-page", partitions=2)
    # 40 clicks of 5 users on 3 pages, and a bot's click the filter drops: /page/0 gets
    # i = 0, 3, ..., 39 (14 clicks), /page/1 and /page/2 13 each.
    clicks = [(f"user-{i % 5}", f"/page/{i % 3}", i) for i in range(40)]
    send(db, "clicks", clicks + [("user-1", "bot/x", 50)])
    topology = chronik.Topology(db, "pages", key_format="str", value_format="str")
    (
        topology.stream("clicks")
        .filter(lambda e: not e.value.startswith("bot"))
        .group_by(lambda e: e.value)
        .named("per-page")
        .count()
        .to("per-page")
    )
    description = topology.describe()
    assert "Stage 0 (reads clicks)" in description, description
    assert "Stage 1 (reads pages-repartition-0002)" in description, description
    stats = topology.run_until_caught_up()
    assert stats["records"] == 81, "40 + 1 clicks, then 40 repartitioned"
    counts = {}
    for p in range(2):
        for page, count, _ in read(db, "per-page", partition=p):
            # Each page's counts in one partition, its key's, one after the other.
            assert chronik.partition_for_key(page.encode(), 2) == p
            assert int(count) == counts.get(page, 0) + 1
            counts[page] = int(count)
    assert counts == {"/page/0": 14, "/page/1": 13, "/page/2": 13}
    assert len(db.describe_topic("pages-repartition-0002")["partitions"]) == 2


def test_flat_map_then_reduce_and_aggregate_per_key(db):
    create(db, "lines", "sums", "times")
    send(db, "lines", [("l1", '"the cat the"', 1), ("l2", '"cat"', 2)])
    topology = chronik.Topology(db, "words", key_format="str", value_format="json")
    # l1@1 -> (the, 1) (cat, 1) (the, 1) and Event(lines, 1, 10); l2@2 -> (cat, 1) and
    # Event(lines, 1, 20). Pairs keep the line's time.
    words = topology.stream("lines").flat_map(
        lambda e: [(w, 1) for w in e.value.split()] + [chronik.Event("lines", 1, e.timestamp * 10)]
    )
    grouped = words.group_by_key()
    grouped.reduce(lambda total, n: total + n).to("sums")
    grouped.aggregate(lambda: [], lambda times, e: times + [e.timestamp]).to("times")
    topology.run_until_caught_up()
    assert read(db, "sums", json.loads) == [
        ("the", 1, 1),
        ("cat", 1, 1),
        ("the", 2, 1),
        ("lines", 1, 10),
        ("cat", 2, 2),
        ("lines", 2, 20),
    ]
    assert read(db, "times", json.loads) == [
        ("the", [1], 1),
        ("cat", [1], 1),
        ("the", [1, 1], 1),
        ("lines", [10], 10),
        ("cat", [1, 2], 2),
        ("lines", [10, 20], 20),
    ]


# Tumbling windows of 10 ms, grace 5, over: a@1 b@3 a@12 a@8 a@15 b@2 a@31.
# a@8 is within grace of [0, 10) (observed 12 < 10 + 5); a@15 closes [0, 10) (a: 1 and 8,
# b: 3); b@2 is then late; a@31 closes [10, 20) (a: 12 and 15); [30, 40) stays open.
TUMBLING_CLICKS = [("a", 1), ("b", 3), ("a", 12), ("a", 8), ("a", 15), ("b", 2), ("a", 31)]


def test_tumbling_final_counts_wait_for_grace_and_late_events_go_aside(db):
    create(db, "clicks", "per-window", "late")
    send(db, "clicks", [(key, f"v{at}", at) for key, at in TUMBLING_CLICKS])

    def build():
        topology = chronik.Topology(db, "tumbling", key_format="str", value_format="str")
        (
            topology.stream("clicks")
            .group_by_key()
            .window(Windows.tumbling(10, grace_ms=5), emit="final", late_to="late")
            .count()
            .to("per-window")
        )
        return topology

    topology = build()
    topology.run_until_caught_up()
    # Closed in order of (window end, key).
    closed = [("a", "2", (0, 10)), ("b", "1", (0, 10)), ("a", "2", (10, 20))]
    assert read(db, "per-window") == closed
    first = next(iter(db.consumer("per-window")))
    assert first.timestamp == 9
    assert first.headers == [(b"window.start", b"0"), (b"window.end", b"10")]
    # The late click as it came: key, value and time.
    assert read(db, "late") == [("b", "v2", 2)]
    assert topology.late_records() == 1
    # A new topology object of the same name goes on from the observed time 31 in the store:
    # a@5 is late, a@45 closes [30, 40) with a@31 and a@35.
    send(db, "clicks", [("a", "v5", 5), ("a", "v35", 35), ("a", "v45", 45)])
    restarted = build()
    restarted.run_until_caught_up()
    assert read(db, "per-window")[3:] == [("a", "2", (30, 40))]
    assert read(db, "late") == [("b", "v2", 2), ("a", "v5", 5)]
    assert restarted.late_records() == 2


def test_tumbling_updates_emit_after_every_event_with_the_window_on_the_event(db):
    create(db, "clicks", "sums")
    send(db, "clicks", [(key, json.dumps({"n": at}), at) for key, at in TUMBLING_CLICKS])
    topology = chronik.Topology(db, "tumbling-sums", key_format="str", value_format="json")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.tumbling(10, grace_ms=5))
        .aggregate(lambda: 0, lambda total, e: total + e.value["n"])
        .map_values(lambda e: {"sum": e.value, "window": list(e.window)})
        .to("sums")
    )
    topology.run_until_caught_up()

    def result(key, total, start):
        return (key, {"sum": total, "window": [start, start + 10]}, (start, start + 10))

    # a@1: 1; b@3: 3; a@12: 12; a@8: 1 + 8; a@15: 12 + 15; b@2 late (dropped, counted);
    # a@31: 31.
    assert read(db, "sums", json.loads) == [
        result("a", 1, 0),
        result("b", 3, 0),
        result("a", 12, 10),
        result("a", 9, 0),
        result("a", 27, 10),
        result("a", 31, 30),
    ]
    assert topology.late_records() == 1


@pytest.mark.parametrize(
    "emit, expected",
    [
        # Windows [0, 10) and [5, 15) hold 7 and 9; [5, 15) and [10, 20) hold 12 (and 100:
        # [95, 105) and [100, 110)). Updates: every window of each event, earliest first.
        ("updates", [(1, (0, 10)), (1, (5, 15)), (3, (0, 10)), (3, (5, 15)), (7, (5, 15)),
                     (4, (10, 20)), (8, (95, 105)), (8, (100, 110))]),
        # Final: 12 closes [0, 10) (grace 0); 100 closes [5, 15) and [10, 20).
        ("final", [(3, (0, 10)), (7, (5, 15)), (4, (10, 20))]),
    ],
)
def test_hopping_windows_reduce_every_window_of_an_event(db, emit, expected):
    create(db, "clicks", "sums")
    send(db, "clicks", [("a", "1", 7), ("a", "2", 9), ("a", "4", 12), ("a", "8", 100)])
    topology = chronik.Topology(db, "hopping", key_format="str", value_format="json")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.hopping(10, 5), emit=emit)
        .reduce(lambda total, n: total + n)
        .to("sums")
    )
    topology.run_until_caught_up()
    assert read(db, "sums", json.loads) == [("a", total, window) for total, window in expected]


@pytest.mark.parametrize(
    "emit, expected",
    [
        # Windows (t - 10, t], i.e. [t - 9, t + 1): at 5 {5}; at 12 {5, 12}; at 20 {12, 20};
        # 9 comes late but within grace (20 < 10 + 20): its own window {5, 9} and 12's
        # {5, 9, 12} (20's starts after 10). 100: {100}.
        ("updates", [(1, (-4, 6)), (2, (3, 13)), (2, (11, 21)), (2, (0, 10)), (3, (3, 13)),
                     (1, (91, 101))]),
        # Final: 100 closes every window ending by 80, in order of their ends.
        ("final", [(1, (-4, 6)), (2, (0, 10)), (3, (3, 13)), (2, (11, 21))]),
    ],
)
def test_sliding_windows_end_at_each_event(db, emit, expected):
    create(db, "clicks", "recent")
    send(db, "clicks", [("a", "", at) for at in [5, 12, 20, 9, 100]])
    topology = chronik.Topology(db, "sliding", key_format="str", value_format="str")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.sliding(10, grace_ms=20), emit=emit)
        .count()
        .to("recent")
    )
    topology.run_until_caught_up()
    assert read(db, "recent") == [("a", str(count), window) for count, window in expected]


def test_session_updates_merge_two_sessions_an_event_bridges_with_the_merge_function(db):
    create(db, "clicks", "sessions")
    send(db, "clicks", [("a", '"x"', 0), ("a", '"y"', 20), ("a", '"z"', 10)])
    topology = chronik.Topology(db, "merging", key_format="str", value_format="json")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.session(10, grace_ms=100))
        .aggregate(lambda: [], lambda values, e: values + [e.value], lambda a, b: a + b)
        .to("sessions")
    )
    topology.run_until_caught_up()
    # x@0 and y@20 are 20 apart, two sessions; z@10 is at most 10 from each: one session
    # [0, 20], the two merged (earlier first) and z added.
    assert read(db, "sessions", json.loads) == [
        ("a", ["x"], (0, 1)),
        ("a", ["y"], (20, 21)),
        ("a", ["x", "y", "z"], (0, 21)),
    ]


def test_session_final_counts_close_after_gap_and_grace(db):
    create(db, "clicks", "sessions", "late")
    # Gap 10, grace 20. a: 0 and 5 one session, 30 another; 20 comes within grace, 15 after
    # 5 (more than the gap) and 10 before 30: it joins 30's. b: one event at 6. 44 starts
    # a session (14 after 30) and closes a's [0, 5] (5 + 10 + 20 < 44) and b's [6]; 100
    # closes [20, 30] and [44]; then b@50 is late (b has no open session, and 50 + 10 + 20 < 100).
    send(db, "clicks", [("a", "", 0), ("a", "", 5), ("b", "", 6), ("a", "", 30)])
    send(db, "clicks", [("a", "", 20), ("a", "", 44), ("a", "", 100), ("b", "", 50)])
    topology = chronik.Topology(db, "sessions", key_format="str", value_format="str")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.session(10, grace_ms=20), emit="final", late_to="late")
        .count()
        .to("sessions")
    )
    topology.run_until_caught_up()
    # A session [first, last] is the window [first, last + 1).
    assert read(db, "sessions") == [
        ("a", "2", (0, 6)),
        ("b", "1", (6, 7)),
        ("a", "2", (20, 31)),
        ("a", "1", (44, 45)),
    ]
    assert read(db, "late") == [("b", "", 50)]
    assert topology.late_records() == 1


def test_windows_closing_together_emit_in_key_order(db):
    create(db, "clicks", "per-window", "sessions")
    # Three keys with one click at 5; z@100 closes their windows at once (grace 0).
    send(db, "clicks", [("bb", "", 5), ("c", "", 5), ("a", "", 5), ("z", "", 100)])
    tumbling = chronik.Topology(db, "order-tumbling", key_format="str", value_format="str")
    (
        tumbling.stream("clicks")
        .group_by_key()
        .window(Windows.tumbling(10), emit="final")
        .count()
        .to("per-window")
    )
    tumbling.run_until_caught_up()
    # Time windows: by end, then key bytes.
    by_key_bytes = [("a", "1", (0, 10)), ("bb", "1", (0, 10)), ("c", "1", (0, 10))]
    assert read(db, "per-window") == by_key_bytes
    sessions = chronik.Topology(db, "order-sessions", key_format="str", value_format="str")
    (
        sessions.stream("clicks")
        .group_by_key()
        .window(Windows.session(10), emit="final")
        .count()
        .to("sessions")
    )
    sessions.run_until_caught_up()
    # Sessions: by end, then key length, then key bytes, then start.
    assert read(db, "sessions") == [("a", "1", (5, 6)), ("c", "1", (5, 6)), ("bb", "1", (5, 6))]


def test_an_out_of_order_event_updates_the_open_sliding_window_of_a_later_event(db):
    create(db, "clicks", "recent")
    # Sliding windows of 10, grace 0. a@20: window (10, 20], i.e. [11, 21). Then a@15: its
    # own window (5, 15] closed (observed 20 >= 16), but 20's window holds 15 and is open
    # (21 > 20): not all of 15's windows are closed, so it is not late and 20's window
    # counts 2 ("an event arriving out of order updates the windows of the later events it
    # falls in"; late: "windows that are all closed").
    send(db, "clicks", [("a", "", 20), ("a", "", 15)])
    topology = chronik.Topology(db, "sliding-late", key_format="str", value_format="str")
    topology.stream("clicks").group_by_key().window(Windows.sliding(10)).count().to("recent")
    topology.run_until_caught_up()
    assert read(db, "recent") == [("a", "1", (11, 21)), ("a", "2", (11, 21))]
    assert topology.late_records() == 0


def test_a_stream_joins_the_table_as_of_its_time(db):
    create(db, "clicks", "users", "enriched", "all")
    send(db, "users", [("u1", "ann", 10), ("u1", "bob", 30), ("u2", "cy", 5), ("u2", "", 25)])
    send(db, "users", [("u3", "eve", 50)])
    send(db, "clicks", [("u1", "a", 5), ("u1", "b", 20), ("u1", "c", 40), ("u2", "d", 26)])
    send(db, "clicks", [("u3", "e", 50)])
    topology = chronik.Topology(db, "enrich", key_format="str", value_format="str")
    users = topology.table("users")
    clicks = topology.stream("clicks")
    clicks.join(users, lambda click, user: f"{user}:{click.value}").to("enriched")
    clicks.left_join(users, lambda click, user: f"{user or '?'}:{click.value}").to("all")
    assert topology.sources() == ["users", "clicks"], "the order first used"
    topology.run_until_caught_up()
    # The inputs merged by time, each in offset order: a@5 (no row; the click first on the
    # tie with cy@5), ann@10, b@20 (ann), u2's row deleted at 25 (an empty value), d@26 (no
    # row), bob@30, c@40 (bob); e@50 ties with eve@50: the click first, no row yet.
    assert read(db, "enriched") == [("u1", "ann:b", 20), ("u1", "bob:c", 40)]
    assert read(db, "all") == [
        ("u1", "?:a", 5),
        ("u1", "ann:b", 20),
        ("u1", "bob:c", 40),
        ("u2", "?:d", 26),
        ("u3", "?:e", 50),
    ]


def test_two_streams_join_within_the_window_and_late_events_are_counted(db):
    create(db, "views", "clicks", "pairs")
    send(db, "views", [("a", "v1", 0), ("a", "v2", 15), ("b", "v3", 16), ("a", "v4", 5)])
    send(db, "clicks", [("a", "c1", 8), ("a", "c2", 30), ("b", "c3", 40)])
    topology = chronik.Topology(db, "pairs", key_format="str", value_format="str")
    views = topology.stream("views")
    clicks = topology.stream("clicks")
    views.join_stream(clicks, 10, lambda view, click: f"{view.value}+{click.value}").to("pairs")
    topology.run_until_caught_up()
    # Merged by time: v1@0, c1@8 (joins v1: 8 apart), v2@15 (joins c1: 7 apart), v3@16,
    # v4@5 (late: 5 + 10 < 16), c2@30 (v2 is 15 away), c3@40 (v3 is 24 away). A pair is at
    # the later of its two times.
    assert read(db, "pairs") == [("a", "v1+c1", 8), ("a", "v2+c1", 15)]
    assert topology.late_records() == 1


def test_left_and_outer_stream_joins_emit_events_without_partners_after_their_window(db):
    create(db, "views", "clicks", "left", "outer")
    send(db, "views", [("a", "v1", 0), ("a", "v2", 15), ("b", "v3", 16), ("z", "v4", 100)])
    send(db, "clicks", [("a", "c1", 8), ("a", "c2", 30), ("b", "c3", 40)])
    topology = chronik.Topology(db, "joins", key_format="str", value_format="str")
    views = topology.stream("views")
    clicks = topology.stream("clicks")
    side = lambda event: "-" if event is None else event.value  # noqa: E731
    views.left_join_stream(clicks, 10, lambda v, c: f"{v.value}+{side(c)}").to("left")
    views.outer_join_stream(clicks, 10, lambda v, c: f"{side(v)}+{side(c)}").to("outer")
    assert "left_join" in topology.describe() and "outer_join" in topology.describe()
    topology.run_until_caught_up()
    # An event comes out alone once the observed time is more than twice the window past it
    # with no partner: v3 when c3@40 comes, c2 and c3 when v4@100 comes (outer join only).
    paired = [("a", "v1+c1", 8), ("a", "v2+c1", 15), ("b", "v3+-", 16)]
    assert read(db, "left") == paired
    assert read(db, "outer") == paired + [("a", "-+c2", 30), ("b", "-+c3", 40)]


def test_an_exception_in_a_function_fails_the_batch_and_a_fixed_function_goes_on(db):
    create(db, "clicks", "sums")
    # a: 1, 3, then -1 (the bad one), b: 2, 5.
    clicks = [("a", 1, 1), ("b", 2, 2), ("a", 3, 3), ("a", -1, 4), ("b", 5, 5)]
    send(db, "clicks", [(key, json.dumps({"n": n}), at) for key, n, at in clicks])
    bad = ValueError("negative click")

    def strict(total, e):
        if e.value["n"] < 0:
            raise bad
        return total + e.value["n"]

    def lenient(total, e):
        return total + max(e.value["n"], 0)

    def build(add):
        topology = chronik.Topology(db, "sums", key_format="str", value_format="json")
        # Stage 0 re-keys (upper case); stage 1 sums in a store.
        (
            topology.stream("clicks")
            .group_by(lambda e: e.key.upper())
            .aggregate(lambda: 0, add)
            .to("sums")
        )
        return topology

    failing = build(strict)
    with pytest.raises(ValueError) as raised:
        failing.run_until_caught_up()
    assert raised.value is bad
    # Stage 0 committed its repartition; stage 1 committed nothing of its batch: no output,
    # no input position.
    internal = [t for t in db.list_topics() if "repartition" in t]
    assert len(internal) == 1 and db.high_watermark(internal[0], 0) == 5
    assert read(db, "sums") == []
    assert db.consumer(internal[0], group="sums").committed() is None
    # The same object fails the same way again.
    with pytest.raises(ValueError):
        failing.run_until_caught_up()

    fixed = build(lenient)
    stats = fixed.run_until_caught_up()
    assert stats["records"] == 5, "stage 1's five records, once"
    # A: 1, 4, 4 (the bad click counts 0); B: 2, 7. Nothing of the failed runs is in the sums.
    assert read(db, "sums", json.loads) == [
        ("A", 1, 1),
        ("B", 2, 2),
        ("A", 4, 3),
        ("A", 4, 4),
        ("B", 7, 5),
    ]


def test_run_raises_an_exception_of_a_later_stage_at_once(db):
    create(db, "clicks", "out")
    send(db, "clicks", [("a", "x", 1)])
    topology = chronik.Topology(db, "stages", key_format="str", value_format="str")

    def add(total, e):
        raise KeyError("no total")

    topology.stream("clicks").group_by(lambda e: e.value).aggregate(lambda: "", add).to("out")
    # run() runs each stage on its thread until stop(), `seconds` or Ctrl-C: a stage whose
    # function raised must end the run with the exception, not leave the others running.
    started = time.monotonic()
    with pytest.raises(KeyError, match="no total"):
        topology.run(seconds=15)
    assert time.monotonic() - started < 5, "the run went on for its seconds after the failure"
    assert read(db, "out") == []


# A topology on two threads whose function lets another thread take the GIL, as any I/O in
# a function does (a print, a log line); time.sleep(0) does it every call.
TWO_THREADS = """
import sys, time, chronik
with chronik.open(sys.argv[1], durability="os") as db:
    db.create_topic("clicks", partitions=2)
    db.create_topic("out", partitions=2)
    db.producer("clicks").send_batch([(f"k{i % 10}", str(i), None, i) for i in range(2_000)])
    topology = chronik.Topology(db, "threads", key_format="str", value_format="str", threads=2)
    topology.stream("clicks").peek(lambda e: time.sleep(0)).to("out")
    print(topology.run(seconds=1)["records"])
"""


def test_functions_that_release_the_gil_on_two_threads_do_not_deadlock(tmp_path):
    # In a child process: a deadlocked thread holding the GIL would hang pytest itself.
    try:
        child = subprocess.run(
            [sys.executable, "-c", TWO_THREADS, str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("run(seconds=1) on two threads did not return in 20 s: deadlocked")
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["2000"]


def windowed_count(db, name):
    topology = chronik.Topology(db, name, key_format="str", value_format="str")
    (
        topology.stream("clicks")
        .group_by_key()
        .window(Windows.tumbling(10, grace_ms=5), emit="final", late_to="late")
        .count()
        .to("per-window")
    )
    return topology


def test_a_windowed_count_with_late_events_is_exact_under_crashes(db):
    # Per key, clicks in time order with some late ones (beyond grace), over 2 partitions.
    records = []
    for i in range(120):
        key = f"user-{i % 6}"
        records.append((key, "", i * 3))
        if i % 10 == 9:
            records.append((key, "", i * 3 - 40))  # Late: 40 ms back is past 10 + 5.
    # Run for real first: the twelve late clicks are late, the others are counted.
    create(db, "clicks", "per-window", "late", partitions=2)
    send(db, "clicks", records)
    real = windowed_count(db, "real-windows")
    real.run_until_caught_up()
    assert real.late_records() == 12 and len(read(db, "late")) == 12
    assert 0 < sum(int(count) for _, count, _ in read(db, "per-window")) <= 120
    report = simulate(
        windowed_count(None, "sim-windows"),
        records=records,
        outputs={"per-window": 2, "late": 2},
        input_partitions=2,
        seeds=20,
    )
    assert report["seeds"] == 20 and report["crashes"] > 0
    assert report["records_processed"] >= len(records)


def test_a_function_keeping_state_outside_stores_is_caught_by_the_simulator():
    counts = {}

    def running_count(e):
        # Wrong: the counts live in the process, neither committed nor restored. A run from
        # the first record (time 0) starts them afresh, so a run without a crash is right;
        # after a crash the records since the last commit are counted twice.
        if e.timestamp == 0:
            counts.clear()
        counts[e.key] = counts.get(e.key, 0) + 1
        return counts[e.key]

    def build():
        topology = chronik.Topology(None, "forgetful", key_format="str", value_format="json")
        topology.stream("clicks").map_values(running_count).to("out")
        return topology

    records = [(f"k{i % 3}", 0, i) for i in range(60)]
    # Without crashes the runs agree: what fails below is the state lost in crashes.
    report = simulate(build(), records=records, outputs={"out": 1}, seeds=5, crashes_max=0)
    assert report["crashes"] == 0
    with pytest.raises(SimulationFailure) as failure:
        simulate(build(), records=records, outputs={"out": 1}, seeds=20)
    assert failure.value.kind == "outputs"
    assert "CHRONIK_SIM_SEED=" in str(failure.value)


def test_invalid_arguments_raise_invalid_argument_error(db):
    create(db, "clicks", "out")
    send(db, "clicks", [("a", "", 1)])
    grouped = chronik.Topology(db, "checks", key_format="str").stream("clicks").group_by_key()
    with pytest.raises(chronik.InvalidArgumentError, match='emit "sometimes"'):
        grouped.window(Windows.tumbling(10), emit="sometimes")
    with pytest.raises(chronik.InvalidArgumentError, match="unknown store kind"):
        grouped.store_kind("ssd")
    with pytest.raises(chronik.InvalidArgumentError, match="unknown store kind"):
        chronik.Topology(db, "kinds", store_kind="ssd")
    with pytest.raises(chronik.InvalidArgumentError, match='unknown option "colour"'):
        chronik.Topology(db, "options", colour="blue")
    with pytest.raises(chronik.InvalidArgumentError, match='format "xml"'):
        chronik.Topology(db, "formats", value_format="xml")


def run_invalid(db, name, build):
    topology = chronik.Topology(db, name, key_format="str", value_format="str")
    build(topology)
    with pytest.raises(chronik.InvalidArgumentError) as raised:
        topology.run_until_caught_up()
    return str(raised.value), topology.describe()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Windows.hopping(5, 10), "an advance at most the size"),
        (lambda: Windows.hopping(1 << 40, 1), "size / advance"),
        (lambda: Windows.tumbling(0), "sizes must be positive"),
        (lambda: Windows.sliding(-5), "sizes must be positive"),
        (lambda: Windows.session(10, grace_ms=-1), "the grace not negative"),
    ],
)
def test_windows_that_cannot_work_are_refused_when_made(make, message):
    with pytest.raises(chronik.InvalidArgumentError) as raised:
        make()
    assert message in str(raised.value)


def test_topologies_that_cannot_run_are_refused(db):
    create(db, "clicks", "views", "out")

    def session_aggregate_without_merge(t):
        (
            t.stream("clicks")
            .group_by_key()
            .window(Windows.session(10))
            .aggregate(lambda: 0, lambda total, e: total + 1)
            .to("out")
        )

    error, _ = run_invalid(db, "no-merge", session_aggregate_without_merge)
    assert "needs a merge" in error

    def joined_with_itself(t):
        clicks = t.stream("clicks")
        clicks.join_stream(clicks, 10, lambda a, b: a.value).to("out")

    error, description = run_invalid(db, "itself", joined_with_itself)
    assert "joined with itself" in error and "joined with itself" in description

    def negative_join_window(t):
        t.stream("clicks").join_stream(t.stream("views"), -1, lambda a, b: a.value).to("out")

    error, _ = run_invalid(db, "negative-join", negative_join_window)
    assert "must not be negative" in error

    def two_stores_named_alike(t):
        grouped = t.stream("clicks").group_by_key()
        grouped.named("totals").count().to("out")
        grouped.named("totals").count().to("out")

    error, _ = run_invalid(db, "same-store", two_stores_named_alike)
    assert "two operators have the store totals" in error

    missing = chronik.Topology(db, "missing", key_format="str")
    missing.stream("clicks").to("nowhere")
    with pytest.raises(chronik.NotFoundError, match="nowhere"):
        missing.run_until_caught_up()
    with pytest.raises(chronik.InvalidArgumentError, match="no data directory"):
        chronik.Topology(None, "only-simulated").run_until_caught_up()


def test_an_event_made_without_a_time_keeps_the_time_and_window_it_replaces(db):
    create(db, "clicks", "rekeyed", "per-window")
    send(db, "clicks", [("a", "x", 7), ("b", "y", 12)])
    topology = chronik.Topology(db, "keep-time", key_format="str", value_format="str")
    clicks = topology.stream("clicks")
    # Made without a time: each keeps its click's (7 and 12), so the windows are [0, 10) and
    # [10, 20), not the epoch's.
    clicks.map(lambda e: chronik.Event(e.key.upper(), e.value)).to("rekeyed")
    (
        clicks.group_by_key()
        .window(Windows.tumbling(10))
        .count()
        .map(lambda e: chronik.Event(e.key + "!", e.value))  # the window goes on with it
        .to("per-window")
    )
    topology.run_until_caught_up()
    assert read(db, "rekeyed") == [("A", "x", 7), ("B", "y", 12)]
    assert read(db, "per-window") == [("a!", "1", (0, 10)), ("b!", "1", (10, 20))]
