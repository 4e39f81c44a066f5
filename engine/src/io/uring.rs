//! The io_uring backend (Linux): reads, writes, fsyncs and fdatasyncs go through an io_uring
//! submission queue; namespace calls (open, rename, list, lock, ...), truncate and allocate
//! stay ordinary system calls through [`PreadIo`], which also owns the handle table.
//!
//! # How a batch runs
//!
//! A batch runs in *rounds* on one ring taken from a small pool (so threads never queue behind
//! each other's fsyncs; each thread in flight has its own ring). A round is the longest run of
//! pending operations, at most [`QUEUE_DEPTH`], in which a sync may only come last. A round
//! that ends in a sync is submitted as one linked chain, so the kernel starts the sync only after
//! every write before it completed: a write followed by its fdatasync costs one system call. A
//! round without a sync is submitted unlinked and its operations run concurrently. Every round
//! is waited for in full before the next, so operations keep the batch's order across rounds.
//!
//! A short read or write is resumed in the next round from where it stopped (a read that returns
//! zero bytes is at the end of the file); in a chain, the kernel cancels what follows a short
//! transfer (`ECANCELED`), and the cancelled operations simply run again in the next round. Each
//! round makes progress (its first operation completes, fails, or moves forward), so a batch
//! always ends. `EINTR` and `EAGAIN` are retried the same way.
//!
//! # What does not go through the ring
//!
//! A batch of one operation, or a `submit_linked` batch with at most one chain holding a sync,
//! runs inline on the calling thread (`pread`, `pwrite`, `fdatasync`),
//! as [`PreadIo`] would. Measured on this project's reference machine (ext4, kernel 6.18, 2
//! vCPUs, buffered I/O): the kernel cannot start a buffered write or an fsync without blocking,
//! so io_uring hands each one to an `io-wq` worker thread, and one 1000-byte write took 56-68 us
//! through the ring against 2 us inline; a 1000-byte read from the page cache 2.0 us against
//! 0.9 us; 4 MiB reads of a consumer, 0.6x of pread's rate. Alone, an operation gains nothing
//! from the ring and pays the hand-off; in a batch of several, one system call submits them all
//! and the workers run them in parallel. So the ring serves batches, and a caller that wants it
//! submits several operations at once.
//!
//! Buffers stay owned by their operations: the kernel gets a pointer into a `Vec` that is
//! neither moved nor resized until its round has completed, and the file (an `Arc<File>`) is
//! held for the round as well, so a concurrent `close` cannot recycle the descriptor under it.
//! A write to a direct handle goes through its `O_DIRECT` descriptor from an aligned copy of
//! its buffer, owned by the slot as long as the write runs (see [`PreadIo`]).

use super::aligned::AlignedBuffer;
use super::{
    Completion, DirectoryEntry, FileHandle, Io, Linked, Namespace, OpenMode, Operation, PreadIo,
};
use io_uring::{IoUring, opcode, squeue, types};
use parking_lot::{Condvar, Mutex};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

/// Entries per ring and most operations in one round.
pub const QUEUE_DEPTH: u32 = 64;
/// Most rings the pool creates: one per thread with a batch in flight, up to this bound.
pub const RINGS_MAX: usize = 64;
/// Largest transfer of one entry: the kernel takes a `u32` length.
const TRANSFER_MAX: usize = 1 << 30;

// The kernel sizes rings in powers of two; a round's entries must fit one ring; an entry's
// length is a `u32`.
const _: () = assert!(QUEUE_DEPTH.is_power_of_two() && QUEUE_DEPTH >= 2);
const _: () = assert!(TRANSFER_MAX <= u32::MAX as usize);
const _: () = assert!(RINGS_MAX >= 1);

/// The io_uring backend of [`Io`].
pub struct UringIo {
    files: PreadIo,
    pool: Mutex<Pool>,
    ring_free: Condvar,
}

struct Pool {
    idle: Vec<IoUring>,
    created: usize,
}

impl std::fmt::Debug for UringIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = self.pool.lock();
        f.debug_struct("UringIo")
            .field("rings_created", &pool.created)
            .field("rings_idle", &pool.idle.len())
            .finish_non_exhaustive()
    }
}

impl UringIo {
    /// Set up the first ring; fails where io_uring is unavailable (an old kernel, a seccomp
    /// filter, `kernel.io_uring_disabled`), so the caller can fall back to [`PreadIo`].
    pub fn new() -> io::Result<UringIo> {
        let ring = IoUring::new(QUEUE_DEPTH)?;
        Ok(UringIo {
            files: PreadIo::new(),
            pool: Mutex::new(Pool { idle: vec![ring], created: 1 }),
            ring_free: Condvar::new(),
        })
    }

    fn take_ring(&self) -> io::Result<IoUring> {
        let mut pool = self.pool.lock();
        loop {
            if let Some(ring) = pool.idle.pop() {
                return Ok(ring);
            }
            assert!(pool.created <= RINGS_MAX, "the pool never grows past its bound");
            assert!(pool.idle.len() <= pool.created, "every idle ring was created here");
            if pool.created < RINGS_MAX {
                pool.created += 1;
                drop(pool);
                return IoUring::new(QUEUE_DEPTH).inspect_err(|_| self.pool.lock().created -= 1);
            }
            self.ring_free.wait(&mut pool);
        }
    }

    fn put_ring(&self, ring: IoUring) {
        let mut pool = self.pool.lock();
        assert!(pool.idle.len() < pool.created, "a ring is put back once, after it was taken");
        pool.idle.push(ring);
        drop(pool);
        self.ring_free.notify_one();
    }
}

/// What one operation of a batch is, while it runs.
enum Kind {
    Read,
    Write,
    Sync { data_only: bool },
}

/// One operation of a batch that goes through the ring.
struct Slot {
    kind: Kind,
    file: Arc<File>,
    position: u64,
    buffer: Vec<u8>,
    /// For a write to a direct handle: the aligned copy of `buffer` the kernel writes from.
    aligned: Option<AlignedBuffer>,
    /// Bytes transferred so far.
    done: usize,
    /// The outcome, once there is one.
    result: Option<io::Result<usize>>,
}

impl Slot {
    fn is_sync(&self) -> bool {
        matches!(self.kind, Kind::Sync { .. })
    }

    /// The submission entry for what is left of this operation.
    fn entry(&mut self, index: usize) -> squeue::Entry {
        assert!(self.result.is_none(), "only an operation still running is submitted");
        assert!(self.done <= self.buffer.len(), "never past the end of the buffer");
        if let Some(aligned) = &self.aligned {
            assert!(matches!(self.kind, Kind::Write), "only writes have an aligned copy");
            assert!(aligned.as_slice().len() >= self.buffer.len(), "the copy holds the buffer");
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match self.kind {
            Kind::Read | Kind::Write => {
                let left = (self.buffer.len() - self.done).min(TRANSFER_MAX);
                let position = self.position + self.done as u64;
                // In bounds: `done <= buffer.len()`, and `left` bytes from there fit.
                let pointer = match &self.aligned {
                    Some(aligned) => aligned.as_slice()[self.done..].as_ptr(),
                    None => self.buffer[self.done..].as_ptr(),
                };
                match self.kind {
                    Kind::Read => {
                        let pointer = self.buffer[self.done..].as_mut_ptr();
                        opcode::Read::new(fd, pointer, left as u32).offset(position).build()
                    }
                    _ => opcode::Write::new(fd, pointer, left as u32).offset(position).build(),
                }
            }
            Kind::Sync { data_only } => {
                let flags = if data_only {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                opcode::Fsync::new(fd).flags(flags).build()
            }
        };
        entry.user_data(index as u64)
    }

    /// Take in one completion result (bytes transferred, or a negative errno).
    fn complete(&mut self, result: i32) {
        assert!(self.result.is_none(), "an operation completes once");
        if result < 0 {
            let errno = -result;
            if errno == libc::ECANCELED || errno == libc::EINTR || errno == libc::EAGAIN {
                return; // Runs again in the next round.
            }
            self.result = Some(Err(io::Error::from_raw_os_error(errno)));
            return;
        }
        let transferred = result.unsigned_abs() as usize;
        // The kernel transfers at most what the entry asked for.
        assert!(transferred <= self.buffer.len() - self.done, "a transfer past the buffer");
        match self.kind {
            Kind::Sync { .. } => self.result = Some(Ok(0)),
            Kind::Read => {
                self.done += transferred;
                if transferred == 0 || self.done == self.buffer.len() {
                    self.result = Some(Ok(self.done));
                }
            }
            Kind::Write => {
                self.done += transferred;
                if transferred == 0 && self.done < self.buffer.len() {
                    let error = io::Error::new(io::ErrorKind::WriteZero, "write returned zero");
                    self.result = Some(Err(error));
                } else if self.done == self.buffer.len() {
                    self.result = Some(Ok(self.done));
                }
            }
        }
    }
}

impl Slot {
    /// The completion of a finished slot, its buffer handed back.
    fn into_completion(self) -> Completion {
        let mut buffer = self.buffer;
        let result = self.result.expect("every ring operation has an outcome");
        if matches!(self.kind, Kind::Read) {
            buffer.truncate(self.done);
        }
        Completion { buffer, result }
    }
}

/// What a ring slot is made of, for an operation the ring runs.
fn ring_parts(operation: Operation) -> (Kind, FileHandle, u64, Vec<u8>) {
    match operation {
        Operation::Read { file, position, buffer } => (Kind::Read, file, position, buffer),
        Operation::Write { file, position, buffer } => (Kind::Write, file, position, buffer),
        Operation::Fsync { file } => (Kind::Sync { data_only: false }, file, 0, Vec::new()),
        Operation::Fdatasync { file } => (Kind::Sync { data_only: true }, file, 0, Vec::new()),
        Operation::Truncate { .. } | Operation::Allocate { .. } => {
            unreachable!("truncate and allocate are not ring operations")
        }
    }
}

/// Run the ring operations of one batch, in rounds (see the module documentation).
fn run_rounds(ring: &mut IoUring, slots: &mut [Option<Slot>]) -> io::Result<()> {
    loop {
        let pending: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.as_ref().is_some_and(|s| s.result.is_none()))
            .map(|(index, _)| index)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let mut round = Vec::new();
        for &index in &pending {
            if round.len() == QUEUE_DEPTH as usize {
                break;
            }
            let is_sync = slots[index].as_ref().is_some_and(Slot::is_sync);
            round.push(index);
            if is_sync {
                break;
            }
        }
        assert!(!round.is_empty() && round.len() <= QUEUE_DEPTH as usize);
        assert!(
            round[..round.len() - 1].iter().all(|&i| !slots[i].as_ref().is_some_and(Slot::is_sync)),
            "a sync only ends a round, so it starts after every operation before it"
        );
        let chained = round.len() > 1
            && round.last().is_some_and(|&i| slots[i].as_ref().is_some_and(Slot::is_sync));
        for (position, &index) in round.iter().enumerate() {
            let slot = slots[index].as_mut().expect("pending slots are ring slots");
            let mut entry = slot.entry(index);
            if chained && position + 1 < round.len() {
                entry = entry.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the entry points into `slot.buffer` and names `slot.file`'s descriptor;
            // both live in `slots`, which is neither moved nor resized, and every entry of
            // the round is waited for below before this function returns or reuses them.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        let round: Vec<(usize, bool)> = round.into_iter().map(|index| (index, false)).collect();
        wait_round(ring, slots, &round)?;
    }
}

/// After `submit_and_wait` failed, keep reaping until `outstanding` completions arrived, so no
/// entry can still write into a buffer that is about to be freed.
fn drain_after_error(ring: &mut IoUring, mut outstanding: usize) {
    while outstanding > 0 {
        let _ = ring.submitter().submit_and_wait(1);
        outstanding -= ring.completion().count();
    }
}

/// Run chains of ring operations ([`Io::submit_linked`]) in rounds: each round submits, for
/// every chain not finished, what is left of it (as one linked run of entries), all chains in
/// one system call, and waits for the round. A chain whose operation failed ends there: the
/// rest of it fails as cancelled. A short transfer, or `EINTR`/`EAGAIN`, makes the kernel
/// cancel the rest of that chain's round; it all runs again, resumed, in the next round. Each
/// round moves the first unfinished operation of every chain it holds (it completes, fails, or
/// transfers more), so the batch ends.
fn run_chains(
    ring: &mut IoUring,
    slots: &mut [Option<Slot>],
    chains: &[std::ops::Range<usize>],
) -> io::Result<()> {
    loop {
        let mut round: Vec<(usize, bool)> = Vec::new();
        for chain in chains {
            let Some(first) = chain.clone().find(|&i| ring_slot(slots, i).result.is_none()) else {
                continue;
            };
            let room = QUEUE_DEPTH as usize - round.len();
            if room == 0 {
                break;
            }
            let end = chain.end.min(first + room);
            for index in first..end {
                round.push((index, index + 1 < end));
            }
        }
        if round.is_empty() {
            return Ok(());
        }
        assert!(round.len() <= QUEUE_DEPTH as usize, "a round fits the ring");
        for &(index, link) in &round {
            let slot = slots[index].as_mut().expect("chains hold ring slots");
            let mut entry = slot.entry(index);
            if link {
                entry = entry.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: as in `run_rounds`: the entry points into `slot.buffer` (or its aligned
            // copy) and names `slot.file`; `slots` is neither moved nor resized, and every
            // entry of the round is waited for below before they are touched again.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        wait_round(ring, slots, &round)?;
        cancel_after_failures(slots, chains);
    }
}

fn ring_slot(slots: &[Option<Slot>], index: usize) -> &Slot {
    slots[index].as_ref().expect("chains hold ring slots")
}

/// Submit what is queued and take in one completion per entry of `round`.
fn wait_round(
    ring: &mut IoUring,
    slots: &mut [Option<Slot>],
    round: &[(usize, bool)],
) -> io::Result<()> {
    let mut completed = 0;
    while completed < round.len() {
        match ring.submit_and_wait(round.len() - completed) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                drain_after_error(ring, round.len() - completed);
                return Err(error);
            }
        }
        for entry in ring.completion() {
            let index = entry.user_data() as usize;
            assert!(round.iter().any(|&(i, _)| i == index), "a completion of this round");
            slots[index].as_mut().expect("completions name ring slots").complete(entry.result());
            completed += 1;
        }
        assert!(completed <= round.len(), "one completion per entry");
    }
    Ok(())
}

/// In every chain, the operations after a failed one fail too, without running.
fn cancel_after_failures(slots: &mut [Option<Slot>], chains: &[std::ops::Range<usize>]) {
    for chain in chains {
        let failed = chain
            .clone()
            .find(|&i| ring_slot(slots, i).result.as_ref().is_some_and(Result::is_err));
        if let Some(failed) = failed {
            for slot in &mut slots[failed + 1..chain.end] {
                let slot = slot.as_mut().expect("chains hold ring slots");
                if slot.result.is_none() {
                    slot.result = Some(Err(super::canceled()));
                }
            }
        }
    }
}

impl UringIo {
    /// Run `slots` with `run` on a ring of the pool; if the ring itself fails, every
    /// operation without an outcome fails with its error.
    fn on_a_ring(
        &self,
        slots: &mut [Option<Slot>],
        run: impl FnOnce(&mut IoUring, &mut [Option<Slot>]) -> io::Result<()>,
    ) {
        let outcome = self.take_ring().and_then(|mut ring| {
            let outcome = run(&mut ring, slots);
            self.put_ring(ring);
            outcome
        });
        if let Err(error) = outcome {
            for slot in slots.iter_mut().flatten() {
                if slot.result.is_none() {
                    let message = format!("io_uring: {error}");
                    slot.result = Some(Err(io::Error::new(error.kind(), message)));
                }
            }
        }
    }

    /// The slot of one ring operation; a write to a direct handle gets its aligned copy here.
    fn slot(
        &self,
        kind: Kind,
        handle: FileHandle,
        position: u64,
        buffer: Vec<u8>,
    ) -> Result<Slot, (Vec<u8>, io::Error)> {
        let found = match kind {
            Kind::Write => self.files.writer(handle),
            _ => self.files.file(handle).map(|file| (file, false)),
        };
        let (file, direct) = match found {
            Ok(found) => found,
            Err(error) => return Err((buffer, error)),
        };
        let mut aligned = None;
        if direct {
            if !super::is_direct_aligned(position, buffer.len()) {
                let error = super::misaligned_direct_write(position, buffer.len());
                return Err((buffer, error));
            }
            aligned = (!buffer.is_empty()).then(|| AlignedBuffer::copy_of(&buffer));
        }
        Ok(Slot { kind, file, position, buffer, aligned, done: 0, result: None })
    }
}

impl Io for UringIo {
    fn submit(&self, mut operations: Vec<Operation>) -> Vec<Completion> {
        let count = operations.len();
        if count == 1 {
            let operation = operations.pop().expect("one operation");
            return vec![self.files.execute(operation)];
        }
        let mut completions: Vec<Option<Completion>> = Vec::with_capacity(operations.len());
        let mut slots: Vec<Option<Slot>> = Vec::with_capacity(operations.len());
        for operation in operations {
            if matches!(operation, Operation::Truncate { .. } | Operation::Allocate { .. }) {
                completions.push(Some(self.files.execute(operation)));
                slots.push(None);
                continue;
            }
            let (kind, file, position, buffer) = ring_parts(operation);
            match self.slot(kind, file, position, buffer) {
                Ok(slot) => {
                    completions.push(None);
                    slots.push(Some(slot));
                }
                Err((buffer, error)) => {
                    completions.push(Some(Completion { buffer, result: Err(error) }));
                    slots.push(None);
                }
            }
        }
        if slots.iter().any(Option::is_some) {
            self.on_a_ring(&mut slots, run_rounds);
        }
        assert_eq!(completions.len(), count, "one entry per operation");
        assert_eq!(slots.len(), count, "one entry per operation");
        let completions: Vec<Completion> = completions
            .into_iter()
            .zip(slots)
            .map(|(completion, slot)| match (completion, slot) {
                (Some(completion), _) => completion,
                (None, Some(slot)) => slot.into_completion(),
                (None, None) => unreachable!("every operation is a completion or a slot"),
            })
            .collect();
        assert_eq!(completions.len(), count, "a completion per operation, in order");
        completions
    }

    fn submit_linked(&self, operations: Vec<Linked>) -> Vec<Completion> {
        let chains = super::chains(&operations);
        let is_sync = |o: &Linked| {
            matches!(o.operation, Operation::Fsync { .. } | Operation::Fdatasync { .. })
        };
        let syncing =
            chains.iter().filter(|chain| operations[(*chain).clone()].iter().any(is_sync));
        if syncing.count() <= 1 {
            // At most one chain waits for the device: running the chains one after another
            // costs no more than running them side by side, and the ring would only add the
            // hand-off of each buffered write and fsync to an io-wq worker (see the module
            // documentation). So they run inline, as pread/pwrite would; the ring serves
            // batches in which several fsyncs can overlap.
            return super::submit_linked_in_order(&self.files, operations);
        }
        let count = operations.len();
        let mut completions: Vec<Option<Completion>> = (0..count).map(|_| None).collect();
        let mut slots: Vec<Option<Slot>> = (0..count).map(|_| None).collect();
        let mut ring_chains = Vec::new();
        let mut operations: Vec<Option<Operation>> =
            operations.into_iter().map(|linked| Some(linked.operation)).collect();
        for chain in chains {
            let on_ring = chain.clone().all(|i| {
                !matches!(
                    operations[i],
                    Some(Operation::Truncate { .. } | Operation::Allocate { .. })
                )
            });
            if !on_ring {
                // Truncate and allocate are plain system calls: such a chain runs in order here.
                let linked = chain
                    .clone()
                    .map(|i| Linked {
                        operation: operations[i].take().expect("each operation once"),
                        link_next: i + 1 < chain.end,
                    })
                    .collect();
                let done = super::submit_linked_in_order(&self.files, linked);
                for (i, completion) in chain.clone().zip(done) {
                    completions[i] = Some(completion);
                }
                continue;
            }
            let mut failed = false;
            for i in chain.clone() {
                let operation = operations[i].take().expect("each operation once");
                if failed {
                    let buffer = super::operation_buffer(operation);
                    completions[i] = Some(Completion { buffer, result: Err(super::canceled()) });
                    continue;
                }
                let (kind, file, position, buffer) = ring_parts(operation);
                match self.slot(kind, file, position, buffer) {
                    Ok(slot) => slots[i] = Some(slot),
                    Err((buffer, error)) => {
                        completions[i] = Some(Completion { buffer, result: Err(error) });
                        failed = true;
                    }
                }
            }
            // The ring runs the part of the chain before a slot that could not be set up.
            let ring_end = chain.clone().find(|&i| slots[i].is_none()).unwrap_or(chain.end);
            if ring_end > chain.start {
                ring_chains.push(chain.start..ring_end);
            }
        }
        if !ring_chains.is_empty() {
            self.on_a_ring(&mut slots, |ring, slots| run_chains(ring, slots, &ring_chains));
        }
        let completions: Vec<Completion> = completions
            .into_iter()
            .zip(slots)
            .map(|(completion, slot)| match (completion, slot) {
                (Some(completion), None) => completion,
                (None, Some(slot)) => slot.into_completion(),
                _ => unreachable!("every operation is a completion or a slot, not both"),
            })
            .collect();
        assert_eq!(completions.len(), count, "a completion per operation, in order");
        completions
    }
}

impl Namespace for UringIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        self.files.open(path, mode)
    }

    fn close(&self, file: FileHandle) {
        self.files.close(file);
    }

    fn file_size(&self, file: FileHandle) -> io::Result<u64> {
        self.files.file_size(file)
    }

    fn create_directory(&self, path: &Path) -> io::Result<()> {
        self.files.create_directory(path)
    }

    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>> {
        self.files.list(directory)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.files.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.files.remove_file(path)
    }

    fn remove_directory(&self, path: &Path) -> io::Result<()> {
        self.files.remove_directory(path)
    }

    fn lock(&self, path: &Path) -> io::Result<FileHandle> {
        self.files.lock(path)
    }
}
