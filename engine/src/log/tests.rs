//! The partition log against a model of the disk: seeded runs that complete operations in
//! random order (links respected), fail some, and check every acknowledgement, the watermark
//! and the shape of what is in flight after every step.

use super::*;
use crate::format::{Record, encode_batch};
use std::collections::{BTreeMap, HashMap};

/// A small seeded generator: the workspace's one splitmix64, from the simulated disk's crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        chronik_simdisk::rng::splitmix64(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn batch(records: usize, value_bytes: usize) -> Batch {
    let value = vec![b'v'; value_bytes];
    let records: Vec<Record<'_>> = (0..records).map(|_| Record::new(None, &value)).collect();
    let mut bytes = Vec::new();
    let info = encode_batch(&mut bytes, Offset::ZERO, &records, 0, Offset::ZERO).expect("encodes");
    Batch { bytes, info }
}

fn config(durability: Durability, direct: bool) -> Config {
    let write_bytes_max = WRITE_BYTES_MAX;
    Config {
        durability,
        segment_bytes: 16 * 1024,
        segment_ms: 1_000_000,
        direct,
        write_bytes_max,
        recovery_point_bytes: 2048,
        recovery_point_ms: 50,
    }
}

/// Writes of at most one block on even seeds, so that one poll holds several writes (and a
/// direct write shares a block with the one before it).
fn config_for_seed(seed: u64, durability: Durability, direct: bool) -> Config {
    let write_bytes_max = if seed.is_multiple_of(2) { DIRECT_ALIGNMENT } else { WRITE_BYTES_MAX };
    Config { write_bytes_max, ..config(durability, direct) }
}

fn fresh(config: Config) -> PartitionLog {
    let recovered = Recovered {
        base_offset: Offset::ZERO,
        size: 0,
        next_offset: Offset::ZERO,
        created_ms: 0,
        tail: Vec::new(),
        max_timestamp: i64::MIN,
        recovery_point: 0,
    };
    PartitionLog::new(config, recovered, 0)
}

/// One segment file as the disk model sees it.
#[derive(Debug, Default)]
struct ModelFile {
    /// Completed writes, as byte ranges.
    completed: Vec<(u64, u64)>,
    /// Every byte below this is durable.
    durable: u64,
    sealed: bool,
}

impl ModelFile {
    /// The end of the completed bytes that start at zero, with `extra` ranges counted too.
    fn prefix(&self, extra: &[(u64, u64)]) -> u64 {
        let mut ranges: Vec<(u64, u64)> = self.completed.iter().chain(extra).copied().collect();
        ranges.sort_unstable();
        let mut end = 0;
        for (start, stop) in ranges {
            if start <= end {
                end = end.max(stop);
            }
        }
        end
    }
}

#[derive(Debug)]
struct InFlight {
    op: LogOp,
    /// The operation linked before this one, not yet completed (it must complete first).
    after: Option<OpId>,
    /// For an fdatasync: the durable prefix at its submission.
    covers_at_submit: u64,
    /// For an fdatasync: the writes linked before it.
    chain: Vec<(u64, u64)>,
    /// A predecessor in its chain failed: it completes with an error.
    cancelled: bool,
}

/// Drives one log through a seeded schedule and checks it against the disk model.
struct Harness {
    rng: Rng,
    log: PartitionLog,
    durability: Durability,
    now_ms: i64,
    files: BTreeMap<u64, ModelFile>,
    in_flight: Vec<InFlight>,
    /// Every batch written: base offset -> (segment, start, end, next offset).
    batches: BTreeMap<u64, (u64, u64, u64, u64)>,
    /// Tickets asked, with the record count of their batch (0 for a flush).
    asked: HashMap<u64, usize>,
    acked: HashMap<u64, Result<Acked, Refusal>>,
    next_ticket: u64,
    fail_percent: u64,
    failed: bool,
    ops_seen: u64,
    /// What the schedule reached, so a test can require that it reached it.
    reached: Reached,
}

#[derive(Clone, Copy, Debug, Default)]
struct Reached {
    creates: u64,
    linked_syncs: u64,
    unlinked_syncs: u64,
    coalesced_writes: u64,
    /// Writes linked behind a write of the same poll that shares a block with them.
    linked_overlapping_writes: u64,
}

impl Harness {
    fn new(seed: u64, durability: Durability, direct: bool, fail_percent: u64) -> Self {
        let mut files = BTreeMap::new();
        files.insert(0, ModelFile::default());
        Harness {
            rng: Rng(seed),
            log: fresh(config_for_seed(seed, durability, direct)),
            durability,
            now_ms: 0,
            files,
            in_flight: Vec::new(),
            batches: BTreeMap::new(),
            asked: HashMap::new(),
            acked: HashMap::new(),
            next_ticket: 0,
            fail_percent,
            failed: false,
            ops_seen: 0,
            reached: Reached::default(),
        }
    }

    fn ticket(&mut self, records: usize) -> Ticket {
        self.next_ticket += 1;
        self.asked.insert(self.next_ticket, records);
        Ticket(self.next_ticket)
    }

    fn step(&mut self) {
        match self.rng.below(10) {
            0..=2 => {
                let records = 1 + self.rng.below(20) as usize;
                let value = self.rng.below(300) as usize;
                let ticket = self.ticket(records);
                self.refused_or_queued(ticket, |log| log.append(ticket, batch(records, value)));
            }
            3 if self.rng.chance(20) => {
                let ticket = self.ticket(0);
                self.refused_or_queued(ticket, |log| log.flush(ticket));
            }
            4 => self.now_ms += i64::try_from(self.rng.below(50)).expect("small"),
            5..=6 => self.poll(),
            _ => self.complete_one(),
        }
        self.drain_acks();
        self.check();
    }

    fn refused_or_queued(
        &mut self,
        ticket: Ticket,
        call: impl FnOnce(&mut PartitionLog) -> Result<(), Refusal>,
    ) {
        if let Err(refusal) = call(&mut self.log) {
            assert!(self.failed, "only a poisoned log refuses: {refusal:?}");
            self.acked.insert(ticket.0, Err(refusal));
        }
    }

    fn poll(&mut self) {
        let mut ops = Vec::new();
        self.log.poll_ops(self.now_ms, &mut ops);
        let mut previous: Option<(OpId, bool)> = None;
        let mut chain = Vec::new();
        let mut chain_ids = Vec::new();
        for op in ops {
            self.ops_seen += 1;
            let after = previous.filter(|&(_, linked)| linked).map(|(id, _)| id);
            if after.is_none() {
                chain.clear();
                chain_ids.clear();
            }
            let mut covers_at_submit = 0;
            match &op.kind {
                OpKind::Write { segment, position, batches_position, buffer } => {
                    let (segment, position, batches) = (*segment, *position, *batches_position);
                    self.on_write_submitted(segment, position, batches, buffer, &chain_ids);
                    chain.push((position, position + buffer.len() as u64));
                }
                OpKind::Fdatasync { segment } => {
                    if after.is_some() {
                        self.reached.linked_syncs += 1;
                    } else {
                        self.reached.unlinked_syncs += 1;
                    }
                    self.assert_alone(*segment, "fdatasync");
                    covers_at_submit = self.files[&segment.get()].prefix(&[]);
                }
                OpKind::Seal { segment, length, .. } => {
                    self.assert_alone(*segment, "seal");
                    let file = &self.files[&segment.get()];
                    assert!(
                        self.in_flight.iter().all(|f| !matches!(
                            f.op.kind,
                            OpKind::Write { segment: s, .. } if s == *segment
                        )),
                        "a seal waits for the segment's writes"
                    );
                    assert!(file.prefix(&[]) >= *length, "a seal covers completed writes");
                }
                OpKind::Create { segment } => {
                    self.reached.creates += 1;
                    let last = self.files.iter().next_back().expect("a file");
                    assert!(last.1.sealed, "the previous segment is sealed before the next");
                    assert!(*last.0 < segment.get(), "segments grow");
                }
                OpKind::Checkpoint { .. } => {}
                OpKind::RecoveryPoint { segment, position, .. } => {
                    let durable = self.files[&segment.get()].durable;
                    assert!(*position <= durable, "a recovery point covers only durable bytes");
                }
            }
            let linked = op.link_next;
            let id = op.id;
            chain_ids.push(id);
            let chain_now = if matches!(op.kind, OpKind::Fdatasync { .. }) && after.is_some() {
                chain.clone()
            } else {
                Vec::new()
            };
            self.in_flight.push(InFlight {
                op,
                after,
                covers_at_submit,
                chain: chain_now,
                cancelled: false,
            });
            previous = Some((id, linked));
        }
    }

    fn assert_alone(&self, segment: Offset, what: &str) {
        assert!(
            self.in_flight.iter().all(|f| !matches!(
                f.op.kind,
                OpKind::Fdatasync { segment: s } | OpKind::Seal { segment: s, .. } if s == segment
            )),
            "a {what} while another sync of the file is in flight"
        );
        assert!(!self.files[&segment.get()].sealed, "no {what} of a sealed segment");
    }

    /// `chain`: the operations linked before this write, which complete before it starts.
    fn on_write_submitted(
        &mut self,
        segment: Offset,
        position: u64,
        batches: u64,
        buffer: &[u8],
        chain: &[OpId],
    ) {
        let file = self.files.get(&segment.get()).expect("writes go to created segments");
        assert!(!file.sealed, "no write to a sealed segment");
        let end = position + buffer.len() as u64;
        for other in &self.in_flight {
            if let OpKind::Write { segment: s, position: p, buffer: b, .. } = &other.op.kind
                && *s == segment
            {
                let other_end = *p + b.len() as u64;
                if end <= *p || other_end <= position {
                    continue;
                }
                assert!(chain.contains(&other.op.id), "writes in flight overlap, unlinked");
                self.reached.linked_overlapping_writes += 1;
            }
        }
        let mut at = usize::try_from(batches - position).expect("small");
        let first = at;
        while let Some(view) = buffer.get(at..).and_then(format::view_validated_batch) {
            let start = position + at as u64;
            let stop = start + view.len() as u64;
            let base = view.base_offset().get();
            let previous =
                self.batches.insert(base, (segment.get(), start, stop, view.next_offset().get()));
            assert!(previous.is_none(), "offset {base} given twice");
            at += view.len();
        }
        if at > first && view_count(&buffer[first..]) > 1 {
            self.reached.coalesced_writes += 1;
        }
    }

    fn complete_one(&mut self) {
        let ready: Vec<usize> = (0..self.in_flight.len())
            .filter(|&i| {
                let after = self.in_flight[i].after;
                after.is_none_or(|id| self.in_flight.iter().all(|f| f.op.id != id))
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        let index = ready[self.rng.below(ready.len() as u64) as usize];
        let flight = self.in_flight.remove(index);
        let fail = flight.cancelled || self.rng.chance(self.fail_percent);
        if fail {
            self.failed = true;
            for other in &mut self.in_flight {
                if other.after == Some(flight.op.id) {
                    other.cancelled = true;
                }
            }
            let error = io::Error::other("injected");
            self.log.complete(flight.op.id, Err(error), self.now_ms);
            return;
        }
        match &flight.op.kind {
            OpKind::Write { segment, position, buffer, .. } => {
                let file = self.files.get_mut(&segment.get()).expect("created");
                file.completed.push((*position, *position + buffer.len() as u64));
            }
            OpKind::Fdatasync { segment } => {
                let file = self.files.get_mut(&segment.get()).expect("created");
                // What completed before its submission, and the writes linked before it.
                let covered = prefix_of(&flight.chain, flight.covers_at_submit);
                file.durable = file.durable.max(covered);
            }
            OpKind::Seal { segment, length, .. } => {
                let file = self.files.get_mut(&segment.get()).expect("created");
                file.durable = file.durable.max(*length);
                file.sealed = true;
            }
            OpKind::Create { segment } => {
                self.files.insert(segment.get(), ModelFile::default());
            }
            OpKind::Checkpoint { .. } | OpKind::RecoveryPoint { .. } => {}
        }
        self.log.complete(flight.op.id, Ok(()), self.now_ms);
    }

    fn drain_acks(&mut self) {
        while let Some(ack) = self.log.poll_ack() {
            assert!(self.asked.contains_key(&ack.ticket.0), "an ack for an unknown ticket");
            let previous = self.acked.insert(ack.ticket.0, ack.result.clone());
            assert!(previous.is_none(), "ticket {} acknowledged twice", ack.ticket.0);
            match ack.result {
                Ok(Acked::Appended { base_offset, next_offset }) => {
                    let records = self.asked[&ack.ticket.0] as u64;
                    assert_eq!(
                        next_offset.get() - base_offset.get(),
                        records,
                        "offsets per record"
                    );
                    let (segment, _, end, next) = self.batches[&base_offset.get()];
                    assert_eq!(next, next_offset.get());
                    let file = &self.files[&segment];
                    if self.durability == Durability::Sync {
                        assert!(
                            file.durable >= end,
                            "acknowledged before durable: {base_offset:?}"
                        );
                    } else {
                        assert!(file.prefix(&[]) >= end, "acknowledged before written");
                    }
                }
                Ok(Acked::Flushed { end }) => {
                    assert!(self.durable_offset() >= end.get(), "flushed before durable");
                }
                Ok(_) => panic!("no transactions in this schedule"),
                Err(_) => assert!(self.failed, "refused without a failure"),
            }
        }
    }

    /// The end of the offsets whose batches are all durable, from zero.
    fn durable_offset(&self) -> u64 {
        self.prefix_offset(|file, end| file.durable >= end)
    }

    fn written_offset(&self) -> u64 {
        self.prefix_offset(|file, end| file.prefix(&[]) >= end)
    }

    fn prefix_offset(&self, holds: impl Fn(&ModelFile, u64) -> bool) -> u64 {
        let mut offset = 0;
        for (&base, &(segment, _, end, next)) in &self.batches {
            if base != offset || !holds(&self.files[&segment], end) {
                break;
            }
            offset = next;
        }
        offset
    }

    fn check(&self) {
        let watermark = self.log.watermark().get();
        match self.durability {
            Durability::Os => assert!(watermark <= self.written_offset(), "shown before written"),
            _ => assert!(watermark <= self.durable_offset(), "shown before durable"),
        }
        assert!(self.log.synced().get() <= self.durable_offset(), "synced before durable");
        if self.failed {
            assert!(self.log.poisoned().is_some() || self.in_flight.iter().any(|f| f.cancelled));
        }
    }

    /// Complete everything, with no more failures, until the log is idle.
    fn settle(&mut self) {
        self.fail_percent = 0;
        for _ in 0..100_000 {
            self.poll();
            if self.in_flight.is_empty() {
                break;
            }
            while !self.in_flight.is_empty() {
                self.complete_one();
                self.drain_acks();
                self.check();
            }
        }
        self.drain_acks();
        assert!(self.in_flight.is_empty(), "the log went quiet with operations in flight");
    }
}

/// The end of the contiguous ranges of `chain` that continue from `from`.
fn prefix_of(chain: &[(u64, u64)], from: u64) -> u64 {
    let mut end = from;
    let mut ranges = chain.to_vec();
    ranges.sort_unstable();
    for (start, stop) in ranges {
        if start <= end {
            end = end.max(stop);
        }
    }
    end
}

fn view_count(mut bytes: &[u8]) -> usize {
    let mut count = 0;
    while let Some(view) = format::view_validated_batch(bytes) {
        count += 1;
        bytes = &bytes[view.len()..];
    }
    count
}

fn run_seed(seed: u64, durability: Durability, direct: bool, fail_percent: u64) -> Reached {
    let mut harness = Harness::new(seed, durability, direct, fail_percent);
    for _ in 0..400 {
        harness.step();
    }
    let flush = harness.ticket(0);
    harness.refused_or_queued(flush, |log| log.flush(flush));
    harness.settle();
    // Liveness: every ticket got exactly one answer.
    for ticket in harness.asked.keys() {
        assert!(harness.acked.contains_key(ticket), "seed {seed}: ticket {ticket} never answered");
    }
    if !harness.failed {
        assert!(harness.log.is_idle(), "seed {seed}: idle after settling");
        assert!(harness.acked.values().all(Result::is_ok), "seed {seed}: no failure, no refusal");
        let end = harness.log.next_offset();
        assert_eq!(harness.log.watermark(), end, "seed {seed}: everything shown after a flush");
        assert_eq!(harness.durable_offset(), end.get(), "seed {seed}: everything durable");
    }
    assert!(harness.ops_seen > 0);
    harness.reached
}

/// Every path the schedules are meant to reach, reached in some seed.
fn assert_reached(all: &[Reached], linked: bool) {
    let sum = |f: fn(&Reached) -> u64| all.iter().map(f).sum::<u64>();
    assert!(sum(|r| r.creates) > 0, "no roll reached");
    assert!(sum(|r| r.unlinked_syncs) > 0, "no unlinked fdatasync reached");
    assert!(sum(|r| r.coalesced_writes) > 0, "no coalesced write reached");
    if linked {
        assert!(sum(|r| r.linked_syncs) > 0, "no linked fdatasync reached");
    }
}

const SEEDS: u64 = 300;

#[test]
fn sync_mode_without_failures() {
    let reached: Vec<Reached> =
        (0..SEEDS).map(|seed| run_seed(seed, Durability::Sync, false, 0)).collect();
    assert_reached(&reached, true);
}

#[test]
fn sync_mode_with_failures() {
    let reached: Vec<Reached> =
        (0..SEEDS).map(|seed| run_seed(seed, Durability::Sync, false, 2)).collect();
    assert_reached(&reached, true);
}

#[test]
fn sync_mode_direct_writes() {
    let mut reached = Vec::new();
    for seed in 0..SEEDS {
        reached.push(run_seed(seed, Durability::Sync, true, 0));
        reached.push(run_seed(seed, Durability::Sync, true, 2));
    }
    assert_reached(&reached, true);
    assert!(reached.iter().any(|r| r.linked_overlapping_writes > 0), "no linked direct writes");
}

/// Two direct writes in one poll share the block where the first ends: the second is linked
/// behind the first, so they go out together and the kernel keeps their order.
#[test]
fn direct_writes_sharing_a_block_go_out_linked() {
    let config = Config { write_bytes_max: DIRECT_ALIGNMENT, ..config(Durability::Os, true) };
    let mut log = fresh(config);
    for ticket in 0..3 {
        log.append(Ticket(ticket), batch(10, 300)).expect("queued");
    }
    let mut ops = Vec::new();
    log.poll_ops(0, &mut ops);
    let writes: Vec<&LogOp> =
        ops.iter().filter(|op| matches!(op.kind, OpKind::Write { .. })).collect();
    assert!(writes.len() >= 2, "one block per write makes several writes: {ops:?}");
    for pair in writes.windows(2) {
        let (OpKind::Write { position: p, buffer: b, .. }, OpKind::Write { position: q, .. }) =
            (&pair[0].kind, &pair[1].kind)
        else {
            unreachable!("filtered to writes")
        };
        assert!(*q < p + b.len() as u64, "the next write rewrites the shared block");
        assert!(pair[0].link_next, "a write sharing a block with the next is linked to it");
    }
    assert!(!writes.last().expect("writes").link_next, "nothing follows the last write");
}

#[test]
fn os_and_interval_modes() {
    let mut reached = Vec::new();
    for seed in 0..SEEDS {
        reached.push(run_seed(seed, Durability::Os, seed % 2 == 0, 0));
        reached.push(run_seed(seed, Durability::Interval { ms: 20 }, seed % 2 == 0, 0));
        reached.push(run_seed(seed, Durability::Interval { ms: 20 }, false, 2));
    }
    assert_reached(&reached, false);
    assert!(reached.iter().any(|r| r.linked_overlapping_writes > 0), "no linked direct writes");
}

/// Completes every operation in flight, in order, successfully.
fn run_all(log: &mut PartitionLog, now_ms: i64) -> Vec<LogOp> {
    let mut all = Vec::new();
    loop {
        let mut ops = Vec::new();
        log.poll_ops(now_ms, &mut ops);
        if ops.is_empty() {
            return all;
        }
        for op in ops {
            log.complete(op.id, Ok(()), now_ms);
            all.push(op);
        }
    }
}

fn acks(log: &mut PartitionLog) -> Vec<(u64, Acked)> {
    std::iter::from_fn(|| log.poll_ack())
        .map(|ack| (ack.ticket.0, ack.result.expect("no failure here")))
        .collect()
}

#[test]
fn a_transaction_holds_a_fence_until_it_ends() {
    for committed in [true, false] {
        let mut log = fresh(config(Durability::Sync, false));
        log.append(Ticket(1), batch(2, 10)).expect("queued");
        run_all(&mut log, 0);
        let first = Acked::Appended { base_offset: Offset::new(0), next_offset: Offset::new(2) };
        assert_eq!(acks(&mut log), vec![(1, first)]);

        log.begin_transaction(Ticket(2), batch(3, 10)).expect("queued");
        log.append(Ticket(3), batch(1, 10)).expect("queued");
        let ops = run_all(&mut log, 0);
        assert_eq!(ops.len(), 1, "only the transaction's batch is written: {ops:?}");
        let written =
            Acked::TransactionWritten { base_offset: Offset::new(2), next_offset: Offset::new(5) };
        assert_eq!(acks(&mut log), vec![(2, written)]);
        assert_eq!(log.watermark(), Offset::new(2), "the batch is not shown");

        log.sync_transaction(Ticket(4)).expect("no failure");
        let ops = run_all(&mut log, 0);
        assert!(matches!(ops[0].kind, OpKind::Fdatasync { .. }), "{ops:?}");
        assert_eq!(acks(&mut log), vec![(4, Acked::TransactionSynced)]);
        assert_eq!(log.watermark(), Offset::new(2), "durable, still not shown");
        assert_eq!(log.synced(), Offset::new(2));

        log.end_transaction(Ticket(5), committed);
        assert_eq!(acks(&mut log), vec![(5, Acked::TransactionEnded)]);
        let shown = if committed { Offset::new(5) } else { Offset::new(2) };
        assert_eq!(log.watermark(), shown);
        run_all(&mut log, 0);
        let last = Acked::Appended { base_offset: Offset::new(5), next_offset: Offset::new(6) };
        assert_eq!(acks(&mut log), vec![(3, last)], "the append waited behind the fence");
        assert_eq!(log.watermark(), Offset::new(6));
        assert!(log.is_idle());
    }
}

#[test]
fn a_failed_fdatasync_fails_every_waiter_and_is_never_retried() {
    let mut log = fresh(config(Durability::Sync, false));
    log.append(Ticket(1), batch(1, 10)).expect("queued");
    log.append(Ticket(2), batch(1, 10)).expect("queued");
    let mut ops = Vec::new();
    log.poll_ops(0, &mut ops);
    assert_eq!(ops.len(), 2, "one coalesced write linked to one fdatasync: {ops:?}");
    assert!(ops[0].link_next && !ops[1].link_next);
    log.complete(ops[0].id, Ok(()), 0);
    log.complete(ops[1].id, Err(io::Error::other("EIO")), 0);
    let answers: Vec<Ack> = std::iter::from_fn(|| log.poll_ack()).collect();
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(|a| matches!(a.result, Err(Refusal::Poisoned(_)))));
    assert_eq!(log.watermark(), Offset::ZERO);
    let mut again = Vec::new();
    log.poll_ops(0, &mut again);
    assert!(again.is_empty(), "no fdatasync after a failed one");
    assert!(matches!(log.append(Ticket(3), batch(1, 1)), Err(Refusal::Poisoned(_))));
}

#[test]
fn an_interval_flush_waits_for_its_deadline() {
    let mut log = fresh(config(Durability::Interval { ms: 100 }, false));
    log.append(Ticket(1), batch(1, 10)).expect("queued");
    let ops = run_all(&mut log, 10);
    assert_eq!(ops.len(), 1, "a write, no fdatasync before the deadline");
    assert_eq!(acks(&mut log).len(), 1, "acknowledged when written");
    assert_eq!(log.watermark(), Offset::ZERO, "shown only when durable");
    assert_eq!(log.poll_timeout(), Some(100));
    let ops = run_all(&mut log, 100);
    assert!(matches!(ops[0].kind, OpKind::Fdatasync { .. }), "{ops:?}");
    assert_eq!(log.watermark(), Offset::new(1));
    assert_eq!(log.poll_timeout(), None);
}
