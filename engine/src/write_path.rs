//! The second design's front door: callers on any thread queue requests for partition logs
//! and get a [`Pending`] answer back at once; whoever waits drives the [`Reactor`].
//!
//! A request goes into a bounded inbox under a short lock and never waits for I/O. Turning the
//! reactor is a role, not a thread: a caller that waits for an answer and finds nobody driving
//! takes the role, moves every queued request into the logs, runs one reactor turn (one
//! submission for every partition) and hands out the answers; it keeps the role until its own
//! answer is in, then lets go and wakes the others, one of whom takes over if work is left.
//! So one writer pays no hand-off, and sixteen writers share each turn's fdatasyncs (group
//! commit falls out of draining the inbox). A thread of the runtime can hold the role instead
//! ([`WritePath::drive_until_idle`]), which is what lets [`Pending`] be awaited as a
//! `Future` without anyone blocking.
//!
//! *Invariants:* at most one driver at a time, and only the driver locks the reactor; every
//! request is applied in inbox order (so a partition's offsets follow submission order); a
//! waiter sleeps only under the inbox lock a driver takes to hand out answers and to let go,
//! so no answer or hand-off is missed; a turn that moved nothing makes its driver sleep until a
//! new request arrives instead of spinning.

use crate::Clock;
use crate::io::Io;
use crate::log::{Acked, Batch, Refusal, Ticket};
use crate::reactor::{PartitionId, Reactor};
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

/// Most requests queued in the inbox; a caller that finds it full waits (or drives).
pub const REQUESTS_MAX: usize = 1 << 16;

/// Most times a waiter about to drive gives way ([`Clock::yield_now`]) to the waiters the
/// last turn answered, so that their next requests make this turn too. Sixteen writers with
/// one append in flight each otherwise split into two halves that alternate between turns
/// (measured: 8.3 appends per fdatasync; with the gathering, 14.8). Bounded, so a waiter
/// whose answered peers went elsewhere loses a few microseconds at most.
const GATHER_YIELDS_MAX: u32 = 32;

/// What a caller asks of one partition's log, answered through a [`Pending`].
#[derive(Debug)]
pub enum Request {
    Append(Batch),
    BeginTransaction(Batch),
    SyncTransaction,
    EndTransaction {
        committed: bool,
    },
    Flush,
    /// A flush answered once the checkpoint recording it is written too.
    Close,
}

/// The outcome of one request.
pub type Answer = Result<Acked, Refusal>;

/// Tickets are consecutive numbers the write path hands out, not input an attacker chooses:
/// they need no SipHash, only spreading over the table (a multiplicative hash).
#[derive(Default)]
struct TicketHasher(u64);

impl std::hash::Hasher for TicketHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type TicketMap<V> = HashMap<u64, V, BuildHasherDefault<TicketHasher>>;

#[derive(Debug, Default)]
struct Inbox {
    requests: Vec<(PartitionId, u64, Request)>,
    /// The driver's emptied request buffer, kept for the next turn's swap (no allocation).
    spare: Vec<(PartitionId, u64, Request)>,
    answers: TicketMap<Answer>,
    wakers: TicketMap<Waker>,
    /// Tickets whose `Pending` was dropped: their answers are thrown away.
    forgotten: HashSet<u64, BuildHasherDefault<TicketHasher>>,
    next_ticket: u64,
    driving: bool,
    /// Threads waiting for the driver to let go of the role itself (to change the reactor, or
    /// for room in the inbox), not for an answer: the end of every turn wakes them.
    role_waiters: usize,
    /// The tickets threads are blocked on in `wait`, each with whether its answer is in:
    /// those threads drive themselves, so a driver thread leaves the role to them (a hand-off
    /// between threads costs a wake-up per turn).
    waited: TicketMap<bool>,
    /// Threads whose answer is in but who have not woken to take it yet: writers on their way
    /// back, likely with their next request (see [`GATHER_YIELDS_MAX`]).
    returning: usize,
    /// Threads asleep in `wait` (for an answer, a driver, or a change after an empty turn).
    answer_sleepers: usize,
    /// Driver threads asleep in `drive_until_idle`. The end of a turn wakes them only for
    /// requests left queued: a driver thread woken after every turn of a blocking writer costs
    /// that writer a wake-up per append.
    driver_sleepers: usize,
    /// The last turn left operations in flight (only on a backend that defers completions):
    /// another turn hands them back.
    in_flight: bool,
}

/// Queues requests for a reactor's partitions and drives it. See the module documentation.
pub struct WritePath<I: Io> {
    inbox: Mutex<Inbox>,
    /// Notified whenever answers arrive, a driver lets go, or a request is queued.
    wake: Condvar,
    reactor: Mutex<Reactor<I>>,
    clock: Arc<dyn Clock>,
    /// Whether the engine around it is poisoned: then every log is failed before the next
    /// turn, so nothing more is called done.
    poisoned: Box<dyn Fn() -> bool + Send + Sync>,
    /// Requests submitted so far (for tests that line threads up behind a turn).
    submitted: Arc<AtomicU64>,
}

impl<I: Io> std::fmt::Debug for WritePath<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePath").finish_non_exhaustive()
    }
}

impl<I: Io> WritePath<I> {
    pub fn new(reactor: Reactor<I>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_poison(reactor, clock, Box::new(|| false), Arc::default())
    }

    /// As [`WritePath::new`], failing every log once `poisoned` says so, and counting the
    /// requests submitted in `submitted` (shared by an engine's shards).
    pub fn with_poison(
        reactor: Reactor<I>,
        clock: Arc<dyn Clock>,
        poisoned: Box<dyn Fn() -> bool + Send + Sync>,
        submitted: Arc<AtomicU64>,
    ) -> Arc<Self> {
        Arc::new(WritePath {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            reactor: Mutex::new(reactor),
            clock,
            poisoned,
            submitted,
        })
    }

    /// Queue `request` for `partition`; the answer comes through the returned [`Pending`],
    /// which may be awaited without anyone blocking: a driver thread is woken for it.
    pub fn submit(self: &Arc<Self>, partition: PartitionId, request: Request) -> Pending<I> {
        self.queue(partition, request, true)
    }

    /// [`WritePath::submit`] for a caller that waits for the answer next ([`Pending::wait`]),
    /// driving the reactor itself when nobody else does: it wakes no one, so a blocking append
    /// costs no wake-up of a driver thread that would only find the caller waiting.
    pub fn submit_then_wait(
        self: &Arc<Self>,
        partition: PartitionId,
        request: Request,
    ) -> Pending<I> {
        self.queue(partition, request, false)
    }

    fn queue(self: &Arc<Self>, partition: PartitionId, request: Request, wake: bool) -> Pending<I> {
        let mut inbox = self.room_for_one();
        assert!(inbox.next_ticket < u64::MAX, "tickets never wrap");
        inbox.next_ticket += 1;
        let ticket = inbox.next_ticket;
        // Pair with `drive_one`: the inbox holds tickets in increasing order, which is the
        // order the driver applies them in.
        assert!(inbox.requests.last().is_none_or(|r| r.1 < ticket), "tickets queue in order");
        inbox.requests.push((partition, ticket, request));
        assert!(inbox.requests.len() <= REQUESTS_MAX, "the inbox is bounded");
        self.submitted.fetch_add(1, Ordering::SeqCst);
        // With a driver at work, the end of its turn wakes the sleepers (it finds this request
        // queued); waking them now would only have every waiter for an answer look and sleep
        // again, sixteen writers waking each other sixteen times a turn.
        let wake = wake && !inbox.driving;
        drop(inbox);
        if wake {
            self.wake.notify_all();
        }
        Pending { path: Arc::clone(self), ticket: Some(ticket) }
    }

    /// The inbox lock, with room for one more request (waiting, or driving, until there is).
    fn room_for_one(&self) -> MutexGuard<'_, Inbox> {
        let mut inbox = self.inbox.lock();
        while inbox.requests.len() >= REQUESTS_MAX {
            if inbox.driving {
                inbox.role_waiters += 1;
                self.wake.wait(&mut inbox);
                inbox.role_waiters -= 1;
            } else {
                inbox = self.drive_one(inbox).0;
            }
        }
        assert!(inbox.requests.len() < REQUESTS_MAX, "room for one more request");
        inbox
    }

    /// The count of requests submitted so far, shared.
    pub fn submitted(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.submitted)
    }

    /// Run `f` on the reactor with nobody driving (to add partitions, or to look).
    pub fn with_reactor<T>(&self, f: impl FnOnce(&mut Reactor<I>) -> T) -> T {
        let mut inbox = self.inbox.lock();
        while inbox.driving {
            inbox.role_waiters += 1;
            self.wake.wait(&mut inbox);
            inbox.role_waiters -= 1;
        }
        inbox.driving = true;
        drop(inbox);
        let result = f(&mut self.reactor.lock());
        let mut inbox = self.inbox.lock();
        assert!(inbox.driving, "nobody took the role while it was held");
        inbox.driving = false;
        drop(inbox);
        self.wake.notify_all();
        result
    }

    /// Stop driving `partition`: whatever still waits on it is answered
    /// [`Refusal::Removed`]; its checkpoint writer is handed back.
    pub fn remove(&self, partition: PartitionId) -> Option<crate::checkpoint::CheckpointWriter<I>> {
        let mut acks = Vec::new();
        let checkpoint = self.with_reactor(|reactor| {
            // What is still in flight completes first, as in a turn: its answers (of any
            // partition) go out with the removal's.
            let mut settled = Vec::new();
            reactor.settle(partition, self.clock.now_ms(), &mut settled);
            acks.extend(settled.into_iter().map(|(_, ack)| (ack.ticket.0, ack.result)));
            let log = reactor.log_mut(partition)?;
            log.abandon();
            while let Some(ack) = log.poll_ack() {
                acks.push((ack.ticket.0, ack.result));
            }
            let checkpoint = reactor.remove(partition);
            assert!(reactor.log(partition).is_none(), "a removed partition is not driven");
            checkpoint
        });
        // Requests still in the inbox for it are refused when the driver applies them.
        let inbox = self.inbox.lock();
        let issued = inbox.next_ticket;
        assert!(acks.iter().all(|(t, _)| (1..=issued).contains(t)), "answers are for tickets");
        self.hand_out(inbox, acks);
        checkpoint
    }

    /// One turn if nobody is driving (the interval flushes of a ticker); whoever drives now
    /// runs them otherwise.
    pub fn turn_once(&self) {
        let mut inbox = self.inbox.lock();
        // On a backend that defers completions, until a turn starts and ends with nothing in
        // flight: then a due fdatasync was not held back by one in flight, and completed
        // within the tick, as on the backends that complete every batch in its turn.
        while !inbox.driving {
            let started_in_flight = inbox.in_flight;
            let progressed;
            (inbox, progressed) = self.drive_one(inbox);
            if !started_in_flight && !inbox.in_flight {
                break;
            }
            assert!(progressed || !inbox.in_flight, "a turn with operations in flight moves");
        }
    }

    /// Give `answers` to their waiters.
    fn hand_out(&self, mut inbox: MutexGuard<'_, Inbox>, answers: Vec<(u64, Answer)>) {
        Self::hand_out_waking(&mut inbox, answers);
        drop(inbox);
        self.wake_all();
    }

    /// Give `answers` to their waiters (the caller wakes the sleepers).
    fn hand_out_waking(inbox: &mut Inbox, answers: Vec<(u64, Answer)>) {
        for (ticket, answer) in answers {
            assert!(ticket >= 1 && ticket <= inbox.next_ticket, "an answer is for a ticket issued");
            if inbox.forgotten.remove(&ticket) {
                continue;
            }
            if let Some(waker) = inbox.wakers.remove(&ticket) {
                waker.wake();
            }
            if let Some(answered) = inbox.waited.get_mut(&ticket) {
                *answered = true;
                inbox.returning += 1;
            }
            let previous = inbox.answers.insert(ticket, answer);
            assert!(previous.is_none(), "a ticket is answered once");
        }
        assert!(inbox.returning <= inbox.waited.len(), "the returning are among the waiting");
    }

    fn wake_all(&self) {
        #[cfg(loom)]
        if crate::sync::bugs::active(crate::sync::bugs::Bug::DriverWakesNobody) {
            return;
        }
        self.wake.notify_all();
    }

    /// Wait for `ticket`'s answer, driving the reactor whenever nobody else does.
    fn wait(&self, ticket: u64) -> Answer {
        let mut inbox = self.inbox.lock();
        assert!(ticket >= 1 && ticket <= inbox.next_ticket, "a waiter waits for a ticket issued");
        let previous = inbox.waited.insert(ticket, false);
        assert!(previous.is_none(), "a ticket is waited for once");
        loop {
            if let Some(answer) = inbox.answers.remove(&ticket) {
                if inbox.waited.remove(&ticket) == Some(true) {
                    assert!(inbox.returning > 0, "a returning waiter was counted");
                    inbox.returning -= 1;
                }
                assert!(inbox.returning <= inbox.waited.len(), "the returning are waiting");
                if inbox.waited.is_empty() && !inbox.requests.is_empty() && !inbox.driving {
                    // A driver thread that left the role to the waiters takes it back.
                    drop(inbox);
                    self.wake.notify_all();
                }
                return answer;
            }
            if inbox.driving {
                inbox.answer_sleepers += 1;
                self.wake.wait(&mut inbox);
                inbox.answer_sleepers -= 1;
                continue;
            }
            // Group commit: let the writers the last turn answered queue again first.
            let mut yields = 0;
            while inbox.returning > 0 && yields < GATHER_YIELDS_MAX && !inbox.driving {
                drop(inbox);
                self.clock.yield_now();
                inbox = self.inbox.lock();
                yields += 1;
            }
            if inbox.driving {
                continue;
            }
            let progressed;
            (inbox, progressed) = self.drive_one(inbox);
            let answered = inbox.answers.contains_key(&ticket);
            if !progressed && !answered && inbox.requests.is_empty() && !inbox.driving {
                // The turn moved nothing (a fence holds the partition, say): sleep until a
                // request or another driver changes that, rather than spin.
                inbox.answer_sleepers += 1;
                self.wake.wait(&mut inbox);
                inbox.answer_sleepers -= 1;
            }
        }
    }

    /// As the driver: apply the queued requests, run one turn, hand out the answers. Takes
    /// and gives back the inbox lock; holds no lock but the reactor's during the I/O. Returns
    /// whether anything moved (an operation ran or an answer came).
    fn drive_one<'a>(&'a self, mut inbox: MutexGuard<'a, Inbox>) -> (MutexGuard<'a, Inbox>, bool) {
        assert!(!inbox.driving, "one driver at a time");
        inbox.driving = true;
        let spare = std::mem::take(&mut inbox.spare);
        assert!(spare.is_empty(), "the spare request buffer was drained");
        let mut requests = std::mem::replace(&mut inbox.requests, spare);
        let issued = inbox.next_ticket;
        drop(inbox);
        // Pair with `queue`: applied in inbox order, so a partition's offsets follow it.
        assert!(requests.windows(2).all(|pair| pair[0].1 < pair[1].1), "requests in order");
        assert!(requests.last().is_none_or(|r| r.1 <= issued), "requests carry issued tickets");
        if requests.len() >= REQUESTS_MAX {
            self.wake.notify_all(); // submitters waiting for room in the inbox
        }
        let mut answers = Vec::new();
        let (operations, in_flight) = {
            let mut reactor = self.reactor.lock();
            if (self.poisoned)() {
                reactor.fail_all("the engine is poisoned");
            }
            for (partition, ticket, request) in requests.drain(..) {
                if let Err(refusal) = apply(&mut reactor, partition, ticket, request) {
                    answers.push((ticket, Err(refusal)));
                }
            }
            let mut acks = Vec::new();
            let operations = reactor.turn(self.clock.now_ms(), &mut acks);
            for (_, ack) in &acks {
                if let Ok(Acked::Appended { base_offset, next_offset }) = &ack.result {
                    assert!(next_offset > base_offset, "an acknowledged append holds an offset");
                }
            }
            answers.extend(acks.into_iter().map(|(_, ack)| (ack.ticket.0, ack.result)));
            (operations, reactor.in_flight() > 0)
        };
        let progressed = operations > 0 || !answers.is_empty();
        let mut inbox = self.inbox.lock();
        assert!(inbox.driving, "the driver held the role through its turn");
        inbox.driving = false;
        inbox.in_flight = in_flight;
        if requests.capacity() <= REQUESTS_MAX {
            inbox.spare = requests;
        }
        Self::hand_out_waking(&mut inbox, answers);
        // Wake the sleepers only when something changed for them: answers, requests that came
        // during the turn (their submitters saw a driver and slept), or the role itself, for
        // those waiting for it. A turn that moved nothing wakes no waiter for an answer, or
        // two of them stuck behind a fence would take turns driving empty turns forever.
        let queued = !inbox.requests.is_empty();
        let waiters = inbox.answer_sleepers > 0 && (progressed || queued);
        // A turn that left operations in flight (a backend that defers completions) needs a
        // next one to hand them back, whether or not anyone waits for them.
        let driver = inbox.driver_sleepers > 0 && (queued || in_flight);
        if waiters || driver || inbox.role_waiters > 0 {
            self.wake_all();
        }
        (inbox, progressed)
    }

    /// For a driver thread: take the role whenever there is work, drive while turns move
    /// something, sleep otherwise; return once `stop()` holds (call [`WritePath::notify`]
    /// after setting what it reads).
    pub fn drive_until_idle(&self, stop: &dyn Fn() -> bool) {
        let mut inbox = self.inbox.lock();
        let mut busy = false;
        while !stop() {
            let idle = inbox.requests.is_empty() && !busy && !inbox.in_flight;
            if inbox.driving || !inbox.waited.is_empty() || idle {
                // A request queued with nobody driving, the end of a turn that left requests
                // queued, or the last waiter for an answer leaving wakes it.
                inbox.driver_sleepers += 1;
                self.wake.wait(&mut inbox);
                inbox.driver_sleepers -= 1;
                continue;
            }
            (inbox, busy) = self.drive_one(inbox);
            // `drive_one` clears the role and hands back the same guard: nobody took it since.
            assert!(!inbox.driving, "the driver let go of the role");
        }
    }

    /// Wake every sleeper (a driver thread told to stop, say).
    pub fn notify(&self) {
        let _inbox = self.inbox.lock();
        self.wake.notify_all();
    }
}

/// Hand one queued request to its log; a refusal is answered at once.
fn apply<I: Io>(
    reactor: &mut Reactor<I>,
    partition: PartitionId,
    ticket: u64,
    request: Request,
) -> Result<(), Refusal> {
    assert!(ticket >= 1, "tickets start at one");
    let log = reactor.log_mut(partition).ok_or(Refusal::Removed)?;
    let ticket = Ticket(ticket);
    match request {
        Request::Append(batch) => log.append(ticket, batch),
        Request::BeginTransaction(batch) => log.begin_transaction(ticket, batch),
        Request::SyncTransaction => log.sync_transaction(ticket),
        Request::EndTransaction { committed } => {
            log.end_transaction(ticket, committed);
            Ok(())
        }
        Request::Flush => log.flush(ticket),
        Request::Close => log.close(ticket),
    }
}

/// The answer to a request, to wait for, poll, or await. Dropped unanswered, its answer is
/// thrown away when it comes.
#[derive(Debug)]
pub struct Pending<I: Io> {
    path: Arc<WritePath<I>>,
    ticket: Option<u64>,
}

impl<I: Io> Pending<I> {
    /// Block until answered, driving the reactor when nobody else does.
    pub fn wait(mut self) -> Answer {
        let ticket = self.ticket.take().expect("a pending answer is taken once");
        self.path.wait(ticket)
    }

    /// The answer, if it is in (never drives).
    pub fn try_take(&mut self) -> Option<Answer> {
        let ticket = self.ticket?;
        let mut inbox = self.path.inbox.lock();
        assert!(ticket <= inbox.next_ticket, "a pending answer is for a ticket issued");
        let answer = inbox.answers.remove(&ticket)?;
        assert!(!inbox.forgotten.contains(&ticket), "a ticket still awaited is not forgotten");
        drop(inbox);
        self.ticket = None;
        Some(answer)
    }
}

impl<I: Io> Drop for Pending<I> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            let mut inbox = self.path.inbox.lock();
            inbox.wakers.remove(&ticket);
            if inbox.answers.remove(&ticket).is_none() {
                let new = inbox.forgotten.insert(ticket);
                assert!(new, "a ticket is forgotten once");
            }
        }
    }
}

/// Awaiting never drives: it needs a driver thread ([`WritePath::drive_until_idle`]), or
/// another caller waiting.
impl<I: Io> Future for Pending<I> {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let Some(ticket) = self.ticket else {
            panic!("a pending answer polled after it was taken");
        };
        let mut inbox = self.path.inbox.lock();
        assert!(ticket <= inbox.next_ticket, "a pending answer is for a ticket issued");
        if let Some(answer) = inbox.answers.remove(&ticket) {
            inbox.wakers.remove(&ticket);
            drop(inbox);
            self.ticket = None;
            return Poll::Ready(answer);
        }
        inbox.wakers.insert(ticket, cx.waker().clone());
        Poll::Pending
    }
}
