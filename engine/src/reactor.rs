//! The I/O reactor of the second engine design: it runs the operations of many partition
//! logs ([`crate::log::PartitionLog`]) through one [`Io`], every turn in one submission.
//!
//! A turn asks every partition's log for the operations it wants now, turns them into
//! [`Operation`]s on the partition's files (segment writes and fdatasyncs, checkpoint writes),
//! submits all of them with [`Io::submit_linked`] (on io_uring: one system call per round, a
//! partition's writes linked before its fdatasync), and hands every completion back to its log.
//! Sealing a segment and creating the next one are rare and involve namespace calls (index
//! files through renames, the new file, the directory fsync): the reactor runs them inline,
//! at once, and completes them before it asks that log again.
//!
//! The reactor holds no lock and reads no clock: `now_ms` is passed in, and a caller (a
//! thread of the runtime, or the simulator) decides when to turn it. It is being built: the
//! engine's partitions do not run on it yet.
//!
//! *Invariants:* every operation a log emitted is completed exactly once, in the turn that
//! submitted it; a log's linked chain is submitted whole and in order; a buffer stays owned by
//! its operation until the completion hands it back.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::checkpoint::{Checkpoint, CheckpointWriter};
use crate::error::IoError;
use crate::io::{self, Io, Linked, OpenMode, Operation};
use crate::log::{Ack, LogOp, OpId, OpKind, PartitionLog};
use crate::segment::{
    self, INDEX_SUFFIX, LOG_SUFFIX, SegmentFile, TIME_INDEX_SUFFIX, write_file_durably,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most partitions one reactor drives.
pub const PARTITIONS_MAX: usize = 1 << 16;

/// Names a partition of one reactor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionId(pub usize);

/// One partition as the reactor drives it.
#[derive(Debug)]
struct Driven<I: Io> {
    log: PartitionLog,
    directory: PathBuf,
    direct: bool,
    /// Every segment file the log may name, by base offset.
    files: BTreeMap<Offset, Arc<SegmentFile<I>>>,
    checkpoint: CheckpointWriter<I>,
}

/// What a submitted operation belongs to.
#[derive(Debug)]
struct Owner {
    partition: usize,
    id: OpId,
    /// A checkpoint write: recorded in the writer once it succeeded.
    checkpoint: Option<Checkpoint>,
}

/// Drives partition logs through one [`Io`]. See the module documentation.
#[derive(Debug)]
pub struct Reactor<I: Io> {
    io: Arc<I>,
    partitions: Vec<Driven<I>>,
    /// Scratch space for one log's operations, kept between turns.
    ops: Vec<LogOp>,
}

impl<I: Io> Reactor<I> {
    pub fn new(io: Arc<I>) -> Self {
        Reactor { io, partitions: Vec::new(), ops: Vec::new() }
    }

    /// Drive `log`, whose active segment is `active`, in the partition `directory`.
    pub fn add(
        &mut self,
        directory: PathBuf,
        log: PartitionLog,
        active: SegmentFile<I>,
        checkpoint: CheckpointWriter<I>,
    ) -> PartitionId {
        assert!(self.partitions.len() < PARTITIONS_MAX, "a reactor drives a bounded set");
        assert_eq!(
            active.path.file_name().and_then(|n| n.to_str()).and_then(segment::parse_log_file_name),
            Some(log.active_segment()),
            "the active file is the log's active segment"
        );
        let mut files = BTreeMap::new();
        let direct = active.direct;
        files.insert(log.active_segment(), Arc::new(active));
        self.partitions.push(Driven { log, directory, direct, files, checkpoint });
        PartitionId(self.partitions.len() - 1)
    }

    pub fn log(&self, partition: PartitionId) -> &PartitionLog {
        &self.partitions[partition.0].log
    }

    /// The log, to queue appends, flushes and transactions on.
    pub fn log_mut(&mut self, partition: PartitionId) -> &mut PartitionLog {
        &mut self.partitions[partition.0].log
    }

    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    /// One turn: every partition's ready operations in one submission, their completions
    /// handed back, and the acknowledgements decided appended to `acks`. Returns how many
    /// operations went to the [`Io`] (zero: nothing to do until a new request, a completion
    /// or a deadline).
    pub fn turn(&mut self, now_ms: i64, acks: &mut Vec<(PartitionId, Ack)>) -> usize {
        let mut batch: Vec<Linked> = Vec::new();
        let mut owners: Vec<Owner> = Vec::new();
        for index in 0..self.partitions.len() {
            self.gather(index, now_ms, &mut batch, &mut owners);
        }
        let submitted = batch.len();
        if submitted > 0 {
            let completions = self.io.submit_linked(batch);
            assert_eq!(completions.len(), owners.len(), "one completion per operation");
            for (owner, completion) in owners.into_iter().zip(completions) {
                let driven = &mut self.partitions[owner.partition];
                if let (Some(checkpoint), Ok(_)) = (owner.checkpoint, &completion.result) {
                    driven.checkpoint.written(checkpoint);
                }
                let result = completion.result.map(|_| ());
                driven.log.complete(owner.id, result, now_ms);
            }
        }
        for (index, driven) in self.partitions.iter_mut().enumerate() {
            while let Some(ack) = driven.log.poll_ack() {
                acks.push((PartitionId(index), ack));
            }
        }
        submitted
    }

    /// Take partition `index`'s operations into the batch, running seals and creates inline
    /// (and asking the log again after them).
    fn gather(
        &mut self,
        index: usize,
        now_ms: i64,
        batch: &mut Vec<Linked>,
        owners: &mut Vec<Owner>,
    ) {
        let unlinked = canary::active(Canary::ReactorUnlinkedSync);
        loop {
            let mut ops = std::mem::take(&mut self.ops);
            let driven = &mut self.partitions[index];
            driven.log.poll_ops(now_ms, &mut ops);
            if ops.is_empty() {
                self.ops = ops;
                return;
            }
            let mut ran_inline = false;
            for op in ops.drain(..) {
                let (id, link_next) = (op.id, op.link_next && !unlinked);
                let operation = match op.kind {
                    OpKind::Write { segment, position, buffer, .. } => {
                        let file = driven.files[&segment].handle;
                        Operation::Write { file, position, buffer }
                    }
                    OpKind::Fdatasync { segment } => {
                        Operation::Fdatasync { file: driven.files[&segment].handle }
                    }
                    OpKind::Checkpoint { segment, position, offset } => {
                        match driven.checkpoint.plan(segment, position, offset) {
                            Some((write, checkpoint)) => {
                                batch.push(Linked { operation: write, link_next: false });
                                owners.push(Owner {
                                    partition: index,
                                    id,
                                    checkpoint: Some(checkpoint),
                                });
                            }
                            None => driven.log.complete(id, Ok(()), now_ms),
                        }
                        continue;
                    }
                    OpKind::Seal { segment, length, offset_index, time_index } => {
                        let result = seal(driven, segment, length, offset_index, time_index);
                        driven.log.complete(id, result.map_err(|e| into_io(&e)), now_ms);
                        ran_inline = true;
                        continue;
                    }
                    OpKind::Create { segment } => {
                        let result = create(&self.io, driven, segment);
                        driven.log.complete(id, result.map_err(|e| into_io(&e)), now_ms);
                        ran_inline = true;
                        continue;
                    }
                };
                batch.push(Linked { operation, link_next });
                owners.push(Owner { partition: index, id, checkpoint: None });
            }
            self.ops = ops;
            if !ran_inline {
                return;
            }
        }
    }
}

/// Make a segment durable at exactly `length` bytes and write its index files. The directory
/// fsync of the next segment's create makes the index renames durable.
fn seal<I: Io>(
    driven: &Driven<I>,
    segment: Offset,
    length: u64,
    offset_index: Vec<u8>,
    time_index: Vec<u8>,
) -> Result<(), IoError> {
    let file = &driven.files[&segment];
    let handle = file.handle;
    if driven.direct {
        // The padding of the last block goes: every sealed segment ends at its last batch.
        file.run(Operation::Truncate { file: handle, length })?;
        file.run(Operation::Fsync { file: handle })?;
    } else {
        file.run(Operation::Fdatasync { file: handle })?;
    }
    for (suffix, bytes) in [(INDEX_SUFFIX, offset_index), (TIME_INDEX_SUFFIX, time_index)] {
        let path = driven.directory.join(segment::file_name(segment, suffix));
        write_file_durably(file.io(), &path, bytes)?;
    }
    Ok(())
}

/// Create the file of the segment based at `segment` and fsync the partition directory.
fn create<I: Io>(io: &Arc<I>, driven: &mut Driven<I>, segment: Offset) -> Result<(), IoError> {
    let path = driven.directory.join(segment::file_name(segment, LOG_SUFFIX));
    let file = SegmentFile::open(io, path, OpenMode::CreateNew.with_direct(driven.direct))?;
    let directory = &driven.directory;
    io::sync_directory(&**io, directory).map_err(|e| IoError::new("fsync", directory, e))?;
    driven.files.insert(segment, Arc::new(file));
    Ok(())
}

fn into_io(error: &IoError) -> std::io::Error {
    std::io::Error::new(error.source.kind(), error.to_string())
}

/// The path of a partition's directory from the data directory's root (for tests and tools).
pub fn partition_directory(root: &Path, topic: &str, partition: u32) -> PathBuf {
    root.join(crate::engine::TOPICS_DIRECTORY).join(topic).join(partition.to_string())
}
