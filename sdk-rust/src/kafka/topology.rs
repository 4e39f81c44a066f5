//! Topologies on a Kafka-protocol cluster: each stage of a [`Topology`] run by the group
//! runner ([`group::run`]) as one processor application, all of them in the consumer group
//! named after the application, as the engine's runner does on one machine.
//!
//! - Repartition topics are created on the cluster with the partition count of the topic the
//!   stage writing them reads first; output and late topics must exist.
//! - Records written to repartition topics carry where they came from (the header
//!   `chronik.from`), and the stage reading them drops the ones its stores say it has taken:
//!   an upstream stage run at least once may write a record again after a crash, and the state
//!   downstream stays exact (but after a join of two streams, whose writes are unmarked: see
//!   `StageTask::new`). Outputs may repeat.

//! - Until caught up: the stages in order, each until it has read its input, again until a
//!   pass takes nothing. Until stopped: each stage on a thread of its own.
//! - Repartition topics are purged below what the group committed (DeleteRecords), where the
//!   cluster can; where it cannot, once a warning, and the topics' retention cleans them.
//!

// Kafka numbers partitions with i32, Chronik with u32 (see group.rs).
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use super::group;
use super::{ClusterError, KafkaClient, REQUEST_TIMEOUT, cluster};
use crate::dsl::{Prepared, StageTask, Topology};
use crate::processor::{Guarantee, ProcessorError, RunStats, Until};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often a run until stopped looks at the caller's stop flag.
const HALT_POLL: Duration = Duration::from_millis(10);

/// How often a run until stopped purges the repartition topics.
const PURGE_EVERY: Duration = Duration::from_secs(1);

/// Run `topology`'s stages in the consumer group named after its application until `until`.
pub(crate) fn run(
    client: &KafkaClient,
    topology: &Topology,
    guarantee: Guarantee,
    until: Until<'_>,
) -> Result<RunStats, ProcessorError> {
    let mut prepared =
        Prepared::new(&topology.lock(), |config| config).map_err(ProcessorError::Config)?;
    let mut repartitions = Vec::with_capacity(prepared.repartitions.len());
    for (topic, upstream) in &prepared.repartitions {
        let partitions = existing(client, upstream)?;
        match client.partition_count(topic).map_err(cluster)? {
            Some(count) if count == partitions => {}
            Some(count) => {
                return Err(ProcessorError::Config(format!(
                    "repartition topic {topic} has {count} partitions, the topic {upstream} it \
                     repartitions {partitions}"
                )));
            }
            None => match client.create_topic(topic, partitions, false) {
                Ok(()) | Err(ClusterError::TopicExists { .. }) => {}
                Err(error) => return Err(cluster(error)),
            },
        }
        repartitions.push((topic.clone(), partitions));
    }
    for topic in &prepared.outputs {
        existing(client, topic)?;
    }
    prepared.add_mark_stores();
    let late = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&late);
    let late_metric = Arc::new(move |n| {
        counter.fetch_add(n, Ordering::Relaxed);
    });
    let plan = prepared.plan(late_metric, true);
    let configs = std::mem::take(&mut prepared.configs);
    let mut purge = Purge::new(client, &prepared.application, repartitions)?;
    let mut total = RunStats::default();
    match until {
        Until::CaughtUp => loop {
            let mut pass = RunStats::default();
            for (stage, config) in configs.iter().enumerate() {
                let mut factory = |_| StageTask::new(Arc::clone(&plan), stage);
                pass.add(group::run(client, config, guarantee, &mut factory, Until::CaughtUp)?);
                purge.run();
            }
            total.add(pass);
            if pass.records == 0 {
                break;
            }
        },
        Until::Stopped(stop) => {
            // Set when `stop` is, or when a stage fails (the others then stop too).
            let halt = AtomicBool::new(false);
            let running = AtomicUsize::new(configs.len());
            let outcomes = std::thread::scope(|scope| {
                let workers: Vec<_> = configs
                    .iter()
                    .enumerate()
                    .map(|(stage, config)| {
                        let (plan, halt, running) = (Arc::clone(&plan), &halt, &running);
                        scope.spawn(move || {
                            // Counts the stage out and stops the others, even on a panic.
                            let _done = Done { halt, running };
                            let mut factory = |_| StageTask::new(Arc::clone(&plan), stage);
                            let until = Until::Stopped(halt);
                            group::run(client, config, guarantee, &mut factory, until)
                        })
                    })
                    .collect();
                let mut purged = Instant::now();
                while running.load(Ordering::Acquire) > 0 {
                    if stop.load(Ordering::Relaxed) {
                        halt.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(HALT_POLL);
                    if purged.elapsed() >= PURGE_EVERY {
                        purge.run();
                        purged = Instant::now();
                    }
                }
                let outcomes: Vec<Result<RunStats, ProcessorError>> = workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or(Err(ProcessorError::Panicked)))
                    .collect();
                outcomes
            });
            for outcome in outcomes {
                total.add(outcome?);
            }
            purge.run();
        }
    }
    total.late_records = late.load(Ordering::Relaxed);
    Ok(total)
}

/// A stage thread's end, by return or panic: the other stages are told to stop (one that
/// ends ends the run), and the control loop counts one fewer running.
struct Done<'a> {
    halt: &'a AtomicBool,
    running: &'a AtomicUsize,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.halt.store(true, Ordering::Relaxed);
        self.running.fetch_sub(1, Ordering::Release);
    }
}

/// The partition count of `topic`, which must exist.
fn existing(client: &KafkaClient, topic: &str) -> Result<u32, ProcessorError> {
    client
        .partition_count(topic)
        .map_err(cluster)?
        .ok_or_else(|| cluster(ClusterError::TopicNotFound { topic: topic.to_owned() }))
}

/// Deletes what the group committed past in each repartition topic.
struct Purge<'c> {
    client: &'c KafkaClient,
    /// The group's committed offsets are read through it (it never joins the group).
    offsets: BaseConsumer,
    repartitions: Vec<(String, u32)>,
    /// Set once the cluster refused a deletion: purging stops.
    refused: bool,
}

impl<'c> Purge<'c> {
    fn new(
        client: &'c KafkaClient,
        application: &str,
        repartitions: Vec<(String, u32)>,
    ) -> Result<Purge<'c>, ProcessorError> {
        let mut settings = client.config().client_config().map_err(cluster)?;
        let offsets = settings
            .set("group.id", application)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| cluster(client.config().client_error("create consumer", &e)))?;
        Ok(Purge { client, offsets, repartitions, refused: false })
    }

    /// Purge every repartition topic once. A failure is not the run's: the records stay
    /// until the next purge, or the topic's retention.
    fn run(&mut self) {
        if self.refused || self.repartitions.is_empty() {
            return;
        }
        if let Err(error) = self.purge() {
            self.refused = true;
            tracing::warn!(
                target: "chronik::kafka",
                "repartition topics are not purged ({error}): they grow until their retention \
                 deletes them"
            );
        }
    }

    fn purge(&self) -> Result<(), ClusterError> {
        let mut wanted = TopicPartitionList::new();
        for (topic, partitions) in &self.repartitions {
            for partition in 0..*partitions {
                wanted.add_partition(topic, partition as i32);
            }
        }
        let committed = self
            .offsets
            .committed_offsets(wanted, REQUEST_TIMEOUT)
            .map_err(|e| ClusterError::kafka("fetch committed offsets", e))?;
        for element in committed.elements() {
            if let KafkaOffset::Offset(at) = element.offset()
                && let Ok(before) = u64::try_from(at)
                && before > 0
            {
                let partition = element.partition() as u32;
                self.client.delete_records(element.topic(), partition, before)?;
            }
        }
        Ok(())
    }
}
