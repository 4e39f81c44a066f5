//! Each operator on real files, against results worked out by hand; a restart between two
//! runs; the errors of a topology that cannot run.

use super::*;
use crate::processor::ProcessorConfig;
use crate::{Chronik, Durability, Offset, Options, Record, TopicConfig};
use std::collections::BTreeMap;

fn open(dir: &std::path::Path) -> Chronik {
    Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap()
}

fn topics(chronik: &Chronik, names: &[&str], partitions: u32) {
    for name in names {
        chronik.create_topic(name, TopicConfig { partitions, ..TopicConfig::default() }).unwrap();
    }
}

fn send(chronik: &Chronik, topic: &str, events: &[(&str, &str, i64)]) {
    let partitions = chronik.partition_count(topic).unwrap();
    for (key, value, time) in events {
        let partition = crate::partition_for_key(key.as_bytes(), partitions);
        let record = Record::new(Some(key.as_bytes()), value.as_bytes()).with_timestamp(*time);
        chronik.engine().append(topic, partition, &[record]).unwrap();
    }
}

/// Every record of `topic` as `key value @start` (the window's start, when it has one) or
/// `key value @time`, partition by partition.
fn read(chronik: &Chronik, topic: &str) -> Vec<String> {
    let mut out = Vec::new();
    for partition in 0..chronik.partition_count(topic).unwrap() {
        let mut from = Offset::ZERO;
        loop {
            let fetch = chronik.engine().read(topic, partition, from, 1 << 20).unwrap();
            if fetch.is_empty() {
                break;
            }
            for record in fetch.records().filter(|r| r.offset() >= from) {
                let start = record
                    .headers()
                    .find(|h| h.key == b"window.start")
                    .map(|h| String::from_utf8_lossy(h.value).into_owned());
                out.push(format!(
                    "{} {} @{}",
                    String::from_utf8_lossy(record.key().unwrap_or_default()),
                    String::from_utf8_lossy(record.value()),
                    start.unwrap_or_else(|| record.timestamp().to_string())
                ));
            }
            from = fetch.next_offset();
        }
    }
    out
}

#[test]
fn tumbling_final_counts_wait_for_grace_and_late_events_go_aside() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "per-window", "late"], 1);
    let topology = Topology::new("tumbling");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::tumbling(10).grace(5))
        .emit_final()
        .late_to("late")
        .count()
        .to("per-window");
    send(&chronik, "clicks", &[("a", "", 1), ("b", "", 3), ("a", "", 12), ("a", "", 8)]);
    // 8 is within grace of window [0, 10): observed 12 < 10 + 5.
    send(&chronik, "clicks", &[("a", "", 15), ("b", "", 2), ("a", "", 31)]);
    // At 15 window [0, 10) closes (a: 2, b: 1); b at 2 is then late; 31 closes [10, 20).
    let mut runner = topology.runner(chronik.engine()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "per-window"), ["a 2 @0", "b 1 @0", "a 2 @10"]);
    assert_eq!(read(&chronik, "late"), ["b  @2"]);
    assert_eq!(runner.late_records().unwrap(), 1);
    assert_eq!(stats.late_records, 1);
    assert_eq!(chronik.metrics().late_records, 1);
    // Only the open window [30, 40) and the bookkeeping are left in the store.
    let store = runner.store("count-0001", 0).unwrap();
    assert_eq!(store.count().unwrap(), 2, "{:?}", store.iter().collect::<Vec<_>>());
}

#[test]
fn a_restart_goes_on_from_the_observed_time() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "per-window"], 2);
    let build = || {
        let topology = Topology::new("restart");
        topology
            .stream("clicks")
            .group_by_key()
            .window(Windows::tumbling(10))
            .emit_final()
            .count()
            .to("per-window");
        topology
    };
    send(&chronik, "clicks", &[("a", "", 1), ("a", "", 2), ("a", "", 25)]);
    build().runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    // After the restart, 5 is late (observed 25 was kept), and 35 closes [20, 30).
    send(&chronik, "clicks", &[("a", "", 5), ("a", "", 35)]);
    let mut runner = build().runner(chronik.engine()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "per-window"), ["a 2 @0", "a 1 @20"]);
    assert_eq!(runner.late_records().unwrap(), 1);
}

#[test]
fn hopping_windows_update_every_window_of_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "sums"], 1);
    let topology = Topology::new("hopping");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::hopping(10, 5))
        .reduce(|a, b| {
            let sum: u64 = parse_count(a) + parse_count(b);
            sum.to_string().into_bytes()
        })
        .to("sums");
    send(&chronik, "clicks", &[("a", "1", 7), ("a", "2", 9), ("a", "4", 12)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(
        read(&chronik, "sums"),
        ["a 1 @0", "a 1 @5", "a 3 @0", "a 3 @5", "a 7 @5", "a 4 @10"]
    );
}

#[test]
fn sessions_merge_when_an_event_bridges_them_and_close_after_gap_and_grace() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "sessions"], 1);
    let topology = Topology::new("sessions");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(10).grace(20))
        .emit_final()
        .count()
        .to("sessions");
    // a: 0 and 5 one session, 30 another; 20 comes late, within grace: 15 after 5 (more than
    // the gap) and 10 before 30 (the gap): it joins 30's. b: one event.
    send(&chronik, "clicks", &[("a", "", 0), ("a", "", 5), ("b", "", 6), ("a", "", 30)]);
    send(&chronik, "clicks", &[("a", "", 20), ("a", "", 44), ("a", "", 100)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    // 44 starts a session (14 after 30) and closes [0, 5] (44 > 5 + 10 + 20) and b's [6];
    // 100 closes [20, 30] and [44].
    assert_eq!(read(&chronik, "sessions"), ["a 2 @0", "b 1 @6", "a 2 @20", "a 1 @44"]);
}

#[test]
fn a_late_event_between_two_sessions_merges_them() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "sessions"], 1);
    let topology = Topology::new("merge");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(10).grace(100))
        .count()
        .to("sessions");
    send(&chronik, "clicks", &[("a", "", 0), ("a", "", 20), ("a", "", 10)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "sessions"), ["a 1 @0", "a 1 @20", "a 3 @0"]);
}

#[test]
fn sliding_windows_end_at_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "recent"], 1);
    let topology = Topology::new("sliding");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::sliding(10).grace(20))
        .count()
        .to("recent");
    // Windows (t - 10, t]: at 5 {5}; at 12 {5, 12}; at 20 {12, 20}; then 9 arrives late but
    // within grace: its own window {5, 9} and 12's {5, 9, 12} (20's starts after 10).
    send(&chronik, "clicks", &[("a", "", 5), ("a", "", 12), ("a", "", 20), ("a", "", 9)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "recent"), ["a 1 @-4", "a 2 @3", "a 2 @11", "a 2 @0", "a 3 @3"]);
}

#[test]
fn group_by_repartitions_through_an_internal_topic() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "per-page"], 2);
    let topology = Topology::new("pages");
    topology
        .stream("clicks")
        .filter(|click| !click.value.starts_with(b"bot"))
        .group_by(|click| click.value.clone())
        .named("per-page")
        .count()
        .to("per-page");
    let description = topology.describe();
    assert!(description.contains("Stage 1 (reads pages-repartition-0002)"), "{description}");
    let clicks: Vec<(String, String, i64)> = (0..40)
        .map(|i| (format!("user-{}", i % 5), format!("/page/{}", i % 3), i))
        .chain([("user-1".to_owned(), "bot/x".to_owned(), 50)])
        .collect();
    let clicks: Vec<(&str, &str, i64)> =
        clicks.iter().map(|(k, v, t)| (k.as_str(), v.as_str(), *t)).collect();
    send(&chronik, "clicks", &clicks);
    let mut runner = topology.runner(chronik.engine()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.records, 81, "40 + 1 clicks, then 40 repartitioned");
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for line in read(&chronik, "per-page") {
        let mut parts = line.split(' ');
        let page = parts.next().unwrap().to_owned();
        last.insert(page, parts.next().unwrap().parse().unwrap());
    }
    assert_eq!(
        last.into_iter().collect::<Vec<_>>(),
        [("/page/0".to_owned(), 14), ("/page/1".to_owned(), 13), ("/page/2".to_owned(), 13)]
    );
    assert!(runner.store("per-page", 0).is_some());
}

#[test]
fn a_stream_joins_the_table_as_of_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "users", "enriched", "all"], 1);
    let topology = Topology::new("enrich");
    let users = topology.table("users");
    let clicks = topology.stream("clicks");
    clicks.join(&users, |click, user| [user, b":", &click.value].concat()).to("enriched");
    clicks
        .left_join(&users, |click, user| [user.unwrap_or(b"?"), b":", &click.value].concat())
        .to("all");
    send(
        &chronik,
        "users",
        &[("u1", "ann", 10), ("u1", "bob", 30), ("u2", "cy", 5), ("u2", "", 25)],
    );
    send(&chronik, "clicks", &[("u1", "a", 5), ("u1", "b", 20), ("u1", "c", 40), ("u2", "d", 26)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "enriched"), ["u1 ann:b @20", "u1 bob:c @40"]);
    // Each input in offset order, the two merged by time: u2's row is deleted (at 25) before
    // its click at 26.
    assert_eq!(read(&chronik, "all"), ["u1 ?:a @5", "u1 ann:b @20", "u1 bob:c @40", "u2 ?:d @26"]);
}

#[test]
fn two_streams_join_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["views", "clicks", "pairs"], 1);
    let topology = Topology::new("pairs");
    let views = topology.stream("views");
    let clicks = topology.stream("clicks");
    views
        .join_stream(&clicks, JoinWindows::of(10), |view, click| {
            [&view.value[..], b"+", &click.value].concat()
        })
        .to("pairs");
    send(&chronik, "views", &[("a", "v1", 0), ("a", "v2", 15), ("b", "v3", 16)]);
    send(&chronik, "clicks", &[("a", "c1", 8), ("a", "c2", 30), ("b", "c3", 40)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    // Merged by time: v1@0 c1@8 (joins v1) v2@15 (joins c1) v3@16 c2@30 (v2 is 15 away) c3@40.
    assert_eq!(read(&chronik, "pairs"), ["a v1+c1 @8", "a v2+c1 @15"]);
}

#[test]
fn topologies_that_cannot_run_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks"], 1);
    let missing_output = Topology::new("missing");
    missing_output.stream("clicks").to("nowhere");
    let error = missing_output.runner(chronik.engine()).unwrap_err();
    assert!(error.to_string().contains("nowhere"), "{error}");
    let no_merge = Topology::new("no-merge");
    no_merge
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(10))
        .aggregate(Vec::new, |a, _| a.to_vec())
        .to("clicks");
    let error = no_merge.runner(chronik.engine()).unwrap_err();
    assert!(error.to_string().contains("merge"), "{error}");
    let bad_size = Topology::new("bad-size");
    bad_size.stream("clicks").group_by_key().window(Windows::hopping(5, 10)).count().to("clicks");
    let error = bad_size.runner(chronik.engine()).unwrap_err();
    assert!(error.to_string().contains("advance"), "{error}");
    let too_many = Topology::new("too-many");
    too_many
        .stream("clicks")
        .group_by_key()
        .window(Windows::hopping(1 << 40, 1))
        .count()
        .to("clicks");
    let error = too_many.runner(chronik.engine()).unwrap_err();
    assert!(error.to_string().contains("size / advance"), "{error}");
    let twice = Topology::new("twice");
    let clicks = twice.stream("clicks");
    let _ = clicks.join_stream(&clicks, JoinWindows::of(1), |a, _| a.value.clone());
    assert!(twice.describe().contains("itself"), "{}", twice.describe());
}

#[test]
fn a_topic_read_as_a_stream_and_a_table_is_read_once_each_event_before_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["users", "changes"], 1);
    let topology = Topology::new("changes");
    let users = topology.table("users");
    topology
        .stream("users")
        .left_join(&users, |user, before| [before.unwrap_or(b"?"), b"->", &user.value].concat())
        .to("changes");
    send(&chronik, "users", &[("a", "1", 1), ("a", "2", 2), ("b", "3", 3)]);
    let stats = topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(stats.records, 3, "one input, read once");
    assert_eq!(read(&chronik, "changes"), ["a ?->1 @1", "a 1->2 @2", "b ?->3 @3"]);
}

#[test]
fn times_at_the_ends_of_the_range_neither_panic_nor_wrap() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["events", "out"], 1);
    let topology = Topology::new("extremes");
    let events = topology.stream("events");
    for (i, windows) in [
        Windows::tumbling(10).grace(i64::MAX),
        Windows::hopping(i64::MAX, i64::MAX / 3),
        Windows::sliding(i64::MAX).grace(i64::MAX),
        Windows::session(i64::MAX).grace(i64::MAX),
    ]
    .into_iter()
    .enumerate()
    {
        events
            .group_by_key()
            .named(&format!("w{i}"))
            .window(windows)
            .emit_final()
            .count()
            .to("out");
    }
    let other = topology.stream("out");
    let _joined = events
        .join_stream(&other, JoinWindows::of(i64::MAX).grace(i64::MAX), |a, _| a.value.clone());
    let times = [i64::MIN, i64::MAX, 0, -1, i64::MIN + 1, i64::MAX - 1, i64::MIN];
    send(&chronik, "events", &times.map(|t| ("k", "v", t)));
    let mut runner = topology.runner(chronik.engine()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert!(runner.stores().iter().all(|(_, _, store)| store.check().is_ok()));
}

#[test]
fn a_stage_runs_after_the_stage_writing_its_repartition_topic() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["impressions", "clicks", "pairs"], 1);
    let topology = Topology::new("order");
    let impressions = topology.stream("impressions");
    // Built second, but upstream: the join's stage reads what this one repartitions.
    let clicks = topology.stream("clicks").map(|click| click);
    impressions
        .join_stream(&clicks, JoinWindows::of(10), |i, c| [&i.value[..], b"+", &c.value].concat())
        .to("pairs");
    send(&chronik, "impressions", &[("a", "i0", 0), ("a", "i100", 100)]);
    send(&chronik, "clicks", &[("a", "c5", 5)]);
    let mut runner = topology.runner(chronik.engine()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "pairs"), ["a i0+c5 @5"]);
    assert_eq!(runner.late_records().unwrap(), 0);
}

#[test]
fn an_out_of_order_event_inside_an_open_session_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "sessions"], 1);
    let topology = Topology::new("in-session");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(30_000))
        .emit_final()
        .count()
        .to("sessions");
    // 5_000 comes after 10_000, but session [0, 10_000] is open until 40_000 is passed.
    send(&chronik, "clicks", &[("a", "", 0), ("a", "", 10_000), ("a", "", 5_000)]);
    // 41_000 closes it; 1_000 then is late: no open session, and its own would be closed.
    send(&chronik, "clicks", &[("a", "", 41_000), ("a", "", 1_000)]);
    let mut runner = topology.runner(chronik.engine()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "sessions"), ["a 3 @0"]);
    assert_eq!(runner.late_records().unwrap(), 1);
}

#[test]
fn a_stream_join_keeps_events_for_partners_of_events_still_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["left", "right", "pairs"], 1);
    let topology = Topology::new("wait");
    let left = topology.stream("left");
    let right = topology.stream("right");
    left.join_stream(&right, JoinWindows::of(10), |l, r| [&l.value[..], b"+", &r.value].concat())
        .to("pairs");
    send(&chronik, "left", &[("a", "v1", 0)]);
    // x@15 moves the observed time to 15; c1@8 is on time (8 + 10 >= 15) and 8 from v1@0.
    send(&chronik, "right", &[("b", "x", 15), ("a", "c1", 8)]);
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "pairs"), ["a v1+c1 @8"]);
}

#[test]
fn repartition_topics_are_purged_once_the_reading_stage_committed() {
    let dir = tempfile::tempdir().unwrap();
    let clicks: Vec<(String, String, i64)> =
        (0..2_000).map(|i| (format!("user-{}", i % 7), format!("/page/{}", i % 5), i)).collect();
    let clicks: Vec<(&str, &str, i64)> =
        clicks.iter().map(|(k, v, t)| (k.as_str(), v.as_str(), *t)).collect();
    let build = || {
        let topology = Topology::new("purge");
        topology.repartition_config(TopicConfig { segment_bytes: 4096, ..TopicConfig::default() });
        // A commit every 50 records: batches of 50 in the repartition topic, which roll.
        topology.configure(|config| ProcessorConfig { commit_every_records: Some(50), ..config });
        topology.stream("clicks").group_by(|click| click.value.clone()).count().to("per-page");
        topology
    };
    let repartition = "purge-repartition-0001";
    {
        let chronik = open(dir.path());
        topics(&chronik, &["clicks", "per-page"], 1);
        send(&chronik, "clicks", &clicks[..1_000]);
        build().runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
        let described = chronik.describe_topic(repartition).unwrap();
        let partition = &described.partitions[0];
        assert_eq!(described.config.segment_bytes, 4096);
        assert_eq!(partition.log_end_offset.get(), 1_000);
        // Every sealed segment went: the active one is all that is left.
        assert_eq!(partition.segment_count, 1, "{partition:?}");
        assert!(partition.log_start_offset.get() > 900, "{partition:?}");
    }
    // A restart goes on from the commit, above the log start, and counts on.
    let chronik = open(dir.path());
    send(&chronik, "clicks", &clicks[1_000..]);
    build().runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for line in read(&chronik, "per-page") {
        let mut parts = line.split(' ');
        last.insert(parts.next().unwrap().to_owned(), parts.next().unwrap().parse().unwrap());
    }
    assert_eq!(last.values().copied().collect::<Vec<_>>(), [400; 5]);
    let start = chronik.describe_topic(repartition).unwrap().partitions[0].log_start_offset;
    assert!(start.get() > 1_900, "{start:?}");
}

#[test]
fn left_and_outer_stream_joins_emit_events_without_partners_once_their_window_passed() {
    let show =
        |side: Option<&Event>| side.map_or_else(|| b"-".to_vec(), |event| event.value.clone());
    for outer in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let chronik = open(dir.path());
        topics(&chronik, &["views", "clicks", "pairs"], 1);
        let build = || {
            let topology = Topology::new("pairs");
            let views = topology.stream("views");
            let clicks = topology.stream("clicks");
            let joined = if outer {
                views.outer_join_stream(&clicks, JoinWindows::of(10), move |view, click| {
                    [show(view), b"+".to_vec(), show(click)].concat()
                })
            } else {
                views.left_join_stream(&clicks, JoinWindows::of(10), move |view, click| {
                    [view.value.clone(), b"+".to_vec(), show(click)].concat()
                })
            };
            joined.to("pairs");
            topology
        };
        let description = build().describe();
        let kind = if outer { "outer_join" } else { "left_join" };
        assert!(description.contains(kind), "{description}");
        send(&chronik, "views", &[("a", "v1", 0), ("a", "v2", 15)]);
        send(&chronik, "clicks", &[("a", "c1", 8)]);
        build().runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
        // A restart between: whether a kept event was paired is in the store.
        send(&chronik, "views", &[("b", "v3", 16), ("z", "v4", 100)]);
        send(&chronik, "clicks", &[("a", "c2", 30), ("b", "c3", 40)]);
        build().runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
        // By time: v1@0 c1@8 (joins v1) v2@15 (joins c1) v3@16 c2@30 (v1, c1 expire: paired)
        // c3@40 (v2 expires paired, v3 alone) v4@100 (c2 and c3 expire alone). Wait: twice
        // the window, so an event expires once the observed time is more than 20 past it.
        let mut expected = vec!["a v1+c1 @8", "a v2+c1 @15", "b v3+- @16"];
        if outer {
            expected.extend(["a -+c2 @30", "b -+c3 @40"]);
        }
        assert_eq!(read(&chronik, "pairs"), expected, "{kind}");
    }
}

/// Runs `topology` over `clicks` a batch at a time, caught up after each: what each batch
/// added to `results` and to `late`.
fn per_batch(
    chronik: &Chronik,
    topology: &Topology,
    batches: &[&[(&str, &str, i64)]],
) -> Vec<(Vec<String>, Vec<String>)> {
    let mut runner = topology.runner(chronik.engine()).unwrap();
    let (mut results_seen, mut late_seen) = (0, 0);
    let mut out = Vec::new();
    for batch in batches {
        send(chronik, "clicks", batch);
        runner.run_until_caught_up().unwrap();
        let (results, late) = (read(chronik, "results"), read(chronik, "late"));
        out.push((results[results_seen..].to_vec(), late[late_seen..].to_vec()));
        (results_seen, late_seen) = (results.len(), late.len());
    }
    out
}

/// What [`per_batch`] reports for a batch.
fn batch(results: &[&str], late: &[&str]) -> (Vec<String>, Vec<String>) {
    let strings = |lines: &[&str]| lines.iter().map(|&line| line.to_owned()).collect();
    (strings(results), strings(late))
}

#[test]
fn tumbling_windows_at_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("tumbling-edges");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::tumbling(10).grace(5))
        .emit_final()
        .late_to("late")
        .count()
        .to("results");
    let found = per_batch(
        &chronik,
        &topology,
        &[
            // -1 is in [-10, 0), 0 (a start) and 9 (the last millisecond) in [0, 10), 10 (an
            // end, exactly a size after 0) in [10, 20). At 9, [-10, 0) closes (9 >= 0 + 5).
            // At 14, one before [0, 10)'s end plus grace, it is open: the second 9 counts.
            &[("b", "b-1", -1), ("a", "a0", 0), ("a", "a9", 9), ("a", "a10", 10)],
            &[("a", "a14", 14), ("a", "a9'", 9)],
            // 15 is exactly [0, 10)'s end plus grace: it closes (0, 9, 9), and 9 is then late.
            &[("a", "a15", 15), ("a", "a9''", 9)],
            // 24: [10, 20) is still open (one before 25), so 10 counts in it; 25 closes it.
            &[("a", "a24", 24), ("a", "a10'", 10)],
            &[("a", "a25", 25)],
        ],
    );
    assert_eq!(
        found,
        [
            batch(&["b 1 @-10"], &[]),
            batch(&[], &[]),
            batch(&["a 3 @0"], &["a a9'' @9"]),
            batch(&[], &[]),
            batch(&["a 4 @10"], &[]), // 10, 14, 15, 10
        ]
    );
}

#[test]
fn hopping_windows_at_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("hopping-edges");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::hopping(10, 5).grace(5))
        .late_to("late")
        .count()
        .to("results");
    let found = per_batch(
        &chronik,
        &topology,
        &[&[
            // 4 is in [-5, 5) and [0, 10); 5, a start, in [0, 10) and [5, 15), as is 9.
            ("a", "4", 4),
            ("a", "5", 5),
            ("a", "9", 9),
            // 10, [0, 10)'s end, is in [5, 15) and [10, 20); [-5, 5) closes (10 = 5 + 5).
            ("a", "10", 10),
            // So 4 now counts only in [0, 10), open until 15.
            ("a", "4'", 4),
            // 15, exactly a size after 5 (no window in common), closes [0, 10).
            ("a", "15", 15),
            // 9 counts only in [5, 15); 4 in none: late.
            ("a", "9'", 9),
            ("a", "4''", 4),
        ]],
    );
    let results = [
        ["a 1 @-5", "a 1 @0"].as_slice(),
        &["a 2 @0", "a 1 @5"],
        &["a 3 @0", "a 2 @5"],
        &["a 3 @5", "a 1 @10"],
        &["a 4 @0"],
        &["a 2 @10", "a 1 @15"],
        &["a 4 @5"],
    ]
    .concat();
    assert_eq!(found, [batch(&results, &["a 4'' @4"])]);
}

#[test]
fn sliding_windows_at_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("sliding-edges");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::sliding(10).grace(5))
        .late_to("late")
        .count()
        .to("results");
    // An event at t has the window (t - 10, t] = [t - 9, t + 1), which closes once the
    // observed time reaches t + 1 + 5.
    let found = per_batch(
        &chronik,
        &topology,
        &[&[
            ("a", "0", 0),
            // Exactly a size after 0: (0, 10] leaves 0 out. 0's window closes (10 >= 6).
            ("a", "10", 10),
            // 4's own window closed exactly now (10 = 4 + 6); it counts in 10's only.
            ("a", "4", 4),
            // 5's is open (11 > 10): 0, 4, 5; and 10's takes it.
            ("a", "5", 5),
            // 1, a size less a millisecond before 10: in 10's window, and in 5's.
            ("a", "1", 1),
            // 0 again: in 5's window, not in 10's (exactly a size before it).
            ("a", "0'", 0),
            // 11's window (1, 11] is 4, 5, 10, 11. 5's window closes (11 = 5 + 6).
            ("a", "11", 11),
            // 5 again: its own window is closed; 10's and 11's take it.
            ("a", "5'", 5),
            // -1: the windows holding it (4's, 5's, ...) are all closed: late.
            ("a", "-1", -1),
        ]],
    );
    let results = [
        ["a 1 @-9"].as_slice(),
        &["a 1 @1"],
        &["a 2 @1"],
        &["a 3 @-4", "a 3 @1"],
        &["a 4 @-4", "a 4 @1"],
        &["a 5 @-4"],
        &["a 4 @2"],
        &["a 5 @1", "a 5 @2"],
    ]
    .concat();
    assert_eq!(found, [batch(&results, &["a -1 @-1"])]);
}

#[test]
fn sliding_final_results_come_exactly_at_end_plus_grace() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("sliding-final");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::sliding(10).grace(5))
        .emit_final()
        .late_to("late")
        .count()
        .to("results");
    let found = per_batch(
        &chronik,
        &topology,
        &[
            // 0's window [-9, 1) closes at 1 + 5: not at 5.
            &[("a", "0", 0), ("a", "5", 5)],
            &[("a", "6", 6)],
            // 5's window (0, 5], which 0 is in (0 > -5), closes at 11; 6's, (-4, 6], at 12.
            &[("a", "11", 11)],
            &[("a", "12", 12)],
        ],
    );
    assert_eq!(
        found,
        [
            batch(&[], &[]),
            batch(&["a 1 @-9"], &[]),
            batch(&["a 2 @-4"], &[]),
            batch(&["a 3 @-3"], &[]),
        ]
    );
}

#[test]
fn sessions_at_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("session-edges");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(10).grace(5))
        .late_to("late")
        .count()
        .to("results");
    // A session [first, last] (results: `@first`) closes once the observed time is past
    // last + 10 + 5.
    let found = per_batch(
        &chronik,
        &topology,
        &[&[
            ("a", "0", 0),
            // Exactly the gap after 0: one session [0, 10].
            ("a", "10", 10),
            // The gap and a millisecond after 10: a session of its own.
            ("a", "21", 21),
            // Exactly the gap before 0: [-10, 10].
            ("a", "-10", -10),
            // 25 joins [21]; the observed time is exactly 10 + 10 + 5, so [-10, 10] is open...
            ("a", "25", 25),
            // ... and 20 (exactly the gap after 10) bridges it and [21, 25]: [-10, 25].
            ("a", "20", 20),
            // Exactly the gap after 25: [-10, 35], closing past 50.
            ("a", "35", 35),
            // At 50 exactly it is still open: 26 joins it.
            ("c", "50", 50),
            ("a", "26", 26),
            // At 51 it is closed: 36 starts a session (its own closes past 51, so not late),
            // and 0 has no open session within the gap, and its own would be closed: late.
            ("c", "51", 51),
            ("a", "36", 36),
            ("a", "0'", 0),
        ]],
    );
    let results = [
        "a 1 @0", "a 2 @0", "a 1 @21", "a 3 @-10", "a 2 @21", "a 6 @-10", "a 7 @-10", "c 1 @50",
        "a 8 @-10", "c 2 @50", "a 1 @36",
    ];
    assert_eq!(found, [batch(&results, &["a 0' @0"])]);
}

#[test]
fn session_final_results_come_a_millisecond_past_gap_plus_grace() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 1);
    let topology = Topology::new("session-final");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::session(10).grace(5))
        .emit_final()
        .late_to("late")
        .count()
        .to("results");
    // [0, 0] closes past 0 + 10 + 5: not at 15, at 16. x's [15, 16] stays open.
    let found = per_batch(&chronik, &topology, &[&[("a", "", 0), ("x", "", 15)], &[("x", "", 16)]]);
    assert_eq!(found, [batch(&[], &[]), batch(&["a 1 @0"], &[])]);
}

#[test]
fn windows_keep_the_observed_time_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "results", "late"], 2);
    // Two keys in different partitions (among a hundred, both are found).
    let key_in = |partition: u32| {
        (0..100)
            .map(|i| format!("k{i}"))
            .find(|key| crate::partition_for_key(key.as_bytes(), 2) == partition)
            .unwrap()
    };
    let (a, b) = (key_in(0), key_in(1));
    let topology = Topology::new("per-partition");
    topology
        .stream("clicks")
        .group_by_key()
        .window(Windows::tumbling(10))
        .emit_final()
        .late_to("late")
        .count()
        .to("results");
    // a at 100 does not close b's [0, 10) in the other partition: b's 5 and 9 are on time,
    // and b's own 10 closes it.
    let found = per_batch(
        &chronik,
        &topology,
        &[&[(&a, "", 100), (&b, "", 5), (&b, "", 9)], &[(&b, "", 10)]],
    );
    assert_eq!(found, [batch(&[], &[]), batch(&[&format!("{b} 2 @0")], &[])]);
}

#[test]
fn a_repartition_topic_has_the_upstream_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "per-page"], 3);
    let topology = Topology::new("count");
    topology.stream("clicks").group_by(|click| click.value.clone()).count().to("per-page");
    let _runner = topology.runner(chronik.engine()).unwrap();
    assert_eq!(chronik.partition_count("count-repartition-0001"), Some(3));
}

#[test]
fn a_stream_table_join_reads_rows_stamped_after_its_events_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    topics(&chronik, &["clicks", "users", "enriched", "all"], 1);
    let topology = Topology::new("later-rows");
    let users = topology.table("users");
    let clicks = topology.stream("clicks");
    clicks.join(&users, |click, user| [user, b":", &click.value].concat()).to("enriched");
    clicks
        .left_join(&users, |click, user| [user.unwrap_or(b"?"), b":", &click.value].concat())
        .to("all");
    // The row is appended first but stamped 10: read together, the click at 5 comes first
    // and joins nothing.
    send(&chronik, "users", &[("u1", "ann", 10)]);
    send(&chronik, "clicks", &[("u1", "a", 5)]);
    let mut runner = topology.runner(chronik.engine()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "enriched"), Vec::<String>::new());
    assert_eq!(read(&chronik, "all"), ["u1 ?:a @5"]);
    // A row already read is in the store: a click appended after it joins it, although
    // stamped before it (the merge does not wait for an input with nothing to read).
    send(&chronik, "clicks", &[("u1", "b", 6)]);
    runner.run_until_caught_up().unwrap();
    assert_eq!(read(&chronik, "enriched"), ["u1 ann:b @6"]);
    assert_eq!(read(&chronik, "all"), ["u1 ?:a @5", "u1 ann:b @6"]);
}
