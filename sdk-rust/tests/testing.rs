//! `chronik::testing` passes a correct processor over many seeds with crashes, and catches one
//! that counts on a side channel outside its store (its count survives the crashes in memory,
//! so what it emits after a restart differs from the fault-free run).

use chronik::RecordView;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig};
use chronik::testing::{CountByKey, CountEncoding, InputRecord, Simulation};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts every record in a counter shared outside the store, and emits it.
struct SideChannel {
    seen: Arc<AtomicU64>,
}

impl Processor for SideChannel {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let seen = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        ctx.emit("totals", record.key(), &seen.to_le_bytes());
        Ok(())
    }
}

fn simulation(seeds: std::ops::Range<u64>) -> Simulation {
    let input = (0..300_u32)
        .map(|i| InputRecord::new(i % 3, Some(format!("user-{}", i % 11).into_bytes()), vec![1]))
        .collect();
    Simulation {
        config: ProcessorConfig::new("counter", "clicks").store("counts"),
        input_partitions: 3,
        outputs: vec![("totals".to_owned(), 2)],
        input,
        seeds,
        crashes_max: 5,
    }
}

#[test]
fn a_processor_that_keeps_its_state_in_stores_is_exactly_once_under_crashes() {
    // Counts per key in its store and emits each new count.
    let counter = |_| CountByKey::new("counts").emit("totals", CountEncoding::LittleEndian);
    let report = simulation(0..60).run(counter).unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{report:?}");
    assert_eq!(report.seeds, 60);
    assert!(report.crashes >= 60, "the seeds must crash the processor: {report:?}");
    assert!(report.records_processed > 0, "{report:?}");
}

#[test]
fn a_processor_that_counts_on_a_side_channel_is_caught_with_its_seed() {
    // Each restart creates the processor again, but the counter outlives it.
    let seen = Arc::new(AtomicU64::new(0));
    let simulation = simulation(0..60);
    let first = std::cell::Cell::new(true);
    let failure = simulation
        .run(|_| {
            if first.replace(false) {
                seen.store(0, Ordering::Relaxed);
            }
            SideChannel { seen: Arc::clone(&seen) }
        })
        .expect_err("the side channel breaks exactly once");
    let message = failure.to_string();
    assert!(message.contains("differs from the fault-free run"), "{message}");
    assert!(message.contains(&format!("CHRONIK_SIM_SEED={}", failure.seed)), "{message}");
}

/// Clicks joined with a users table (a second input, co-partitioned): each click is emitted
/// with the user's current name, or "unknown"; a user record with an empty value deletes it.
struct Join;

impl Processor for Join {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let key = record.key().unwrap_or_default();
        if ctx.input() == "users" {
            let users = ctx.store("users")?;
            if record.value().is_empty() {
                users.delete(key);
            } else {
                users.put(key, record.value());
            }
            return Ok(());
        }
        let name =
            ctx.store("users")?.get(key)?.map_or_else(|| b"unknown".to_vec(), |v| v.to_vec());
        let mut enriched = name;
        enriched.extend_from_slice(b" ");
        enriched.extend_from_slice(record.value());
        ctx.emit("enriched", Some(key), &enriched);
        Ok(())
    }
}

#[test]
fn a_stream_table_join_is_exactly_once_and_merges_inputs_by_timestamp() {
    let mut input = Vec::new();
    for i in 0..400_i64 {
        let user = format!("u{}", i % 9).into_bytes();
        let partition = u32::try_from(i % 9).unwrap() % 2;
        if i % 5 == 0 {
            // The table changes over time, and some users are deleted now and then.
            let value = if i % 35 == 0 { Vec::new() } else { format!("name{i}").into_bytes() };
            input.push(InputRecord::new(partition, Some(user.clone()), value).on(1).at(1_000 + i));
        }
        input.push(InputRecord::new(partition, Some(user), b"/page".to_vec()).at(1_000 + i));
    }
    let simulation = Simulation {
        config: ProcessorConfig::new("join", "clicks").input("users").store("users"),
        input_partitions: 2,
        outputs: vec![("enriched".to_owned(), 2)],
        input,
        seeds: 0..40,
        crashes_max: 4,
    };
    let report = simulation.run(|_| Join).unwrap_or_else(|failure| panic!("{failure}"));
    assert!(report.crashes > 20, "{report:?}");
}

/// Pages viewed per user in hopping windows, after a `group_by` (two stages, a repartition
/// topic between them), and a `map_values` that depends on its event alone.
fn pages_topology(side_channel: Option<Arc<AtomicU64>>) -> chronik::dsl::Topology {
    use chronik::dsl::{Topology, Windows};
    let topology = Topology::new("pages");
    topology
        .stream("views")
        .map_values(move |view| match &side_channel {
            // The bug: a count kept outside the stores survives the crashes in memory.
            Some(seen) => seen.fetch_add(1, Ordering::Relaxed).to_string().into_bytes(),
            None => view.value.clone(),
        })
        .group_by(|view| view.value.clone())
        .window(Windows::hopping(40, 20).grace(15))
        .emit_final()
        .late_to("late")
        .count()
        .to("views-per-page");
    topology
}

fn pages_simulation(seeds: std::ops::Range<u64>) -> Simulation {
    let input = (0..300_u32)
        .map(|i| {
            let user = format!("u{}", i % 7).into_bytes();
            let partition = chronik::partition_for_key(&user, 2);
            // Mostly in order; every ninth view 30 ms behind (some within grace, some not).
            let time = 1_000 + i64::from(i) * 3 - if i % 9 == 0 { 30 } else { 0 };
            InputRecord::new(partition, Some(user), format!("/p{}", i % 4).into_bytes()).at(time)
        })
        .collect();
    Simulation {
        config: ProcessorConfig::new("pages", "views"),
        input_partitions: 2,
        outputs: vec![("views-per-page".into(), 2), ("late".into(), 1)],
        input,
        seeds,
        crashes_max: 4,
    }
}

#[test]
fn a_topology_of_two_stages_with_windows_is_exactly_once_under_crashes() {
    let topology = pages_topology(None);
    assert!(topology.describe().contains("Stage 1"), "{}", topology.describe());
    let simulation = pages_simulation(0..40);
    let report = simulation
        .run_topology_checked(&topology, |outcome| {
            let results: usize = outcome
                .outputs
                .iter()
                .filter(|((topic, _), _)| topic == "views-per-page")
                .map(|(_, records)| records.len())
                .sum();
            let late: usize = outcome.outputs[&("late".to_owned(), 0)].len();
            // 300 views over 4 pages and 15 windows: some results, and some views too late.
            if results > 20 && late > 0 {
                Ok(())
            } else {
                Err(format!("{results} results, {late} late"))
            }
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert!(report.crashes > 20, "{report:?}");
}

#[test]
fn a_topology_whose_function_counts_on_a_side_channel_is_caught() {
    let topology = pages_topology(Some(Arc::new(AtomicU64::new(0))));
    let failure = pages_simulation(0..40).run_topology(&topology).expect_err("caught");
    assert!(failure.to_string().contains("replay: CHRONIK_SIM_SEED="), "{failure}");
}
