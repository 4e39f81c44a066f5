//! The production runtime: the system clock, and the thread that drives background steps.
//! The only module of the engine that reads the clock or spawns threads.

use crate::io::Io;
use crate::{AppendError, Clock, Durability, Engine};
use crossbeam_channel::{RecvTimeoutError, Sender, bounded};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }

    fn monotonic_us(&self) -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn yield_now(&self) {
        std::thread::yield_now();
    }
}

/// Drives the engine's background work from its own threads: a flusher that runs
/// [`Engine::flush_due`] (only in `interval` mode), a maintainer that runs
/// [`Engine::maintain`] (retention and compaction), and a driver per write shard that turns
/// its write path whenever requests are queued (so [`Engine::append_nowait`]'s answers come,
/// and their futures wake, without a caller blocking on them). The flusher and the maintainer
/// are two, so that a compaction pass, which may read and rewrite gigabytes, never delays an
/// interval flush: the loss window of `interval:MS` stays MS plus one flusher period whatever
/// maintenance does. Stops (and joins every thread) on drop. A panic in a step poisons the engine instead of dying silently.
#[derive(Debug)]
pub struct Runtime {
    workers: Vec<Worker>,
    drivers: Vec<Driver>,
}

/// The thread that turns the write path whenever requests are queued, so appends queued with
/// `append_nowait` complete, and their futures wake, without anyone blocking on them.
struct Driver {
    stop: Arc<AtomicBool>,
    wake: Box<dyn Fn() + Send + Sync>,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("stop", &self.stop).finish_non_exhaustive()
    }
}

/// One background thread and the channel that stops it.
#[derive(Debug)]
struct Worker {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

/// How often the maintainer looks for retention and compaction work.
const MAINTENANCE_PERIOD: Duration = Duration::from_secs(1);

/// The flusher's period is at most this, so a flush is never more than 100 ms late.
const FLUSH_PERIOD_MAX_MS: u64 = 100;

impl Runtime {
    /// Start the background threads. The maintainer runs at once (so even a short-lived
    /// process, one command of the CLI, applies retention), then every second. In `interval`
    /// mode the flusher runs every `min(ms, 100)` ms. None for a read-only engine. Dropping
    /// the runtime waits for the steps in progress.
    pub fn start<I: Io>(engine: &Engine<I>) -> std::io::Result<Runtime> {
        let options = engine.options();
        let mut runtime = Runtime { workers: Vec::new(), drivers: Vec::new() };
        if options.read_only {
            return Ok(runtime);
        }
        if let Durability::Interval { ms } = options.durability {
            let period = Duration::from_millis(ms.clamp(1, FLUSH_PERIOD_MAX_MS));
            let flusher =
                Worker::spawn("chronik-flusher", engine.clone(), period, Engine::flush_due)?;
            runtime.workers.push(flusher);
        }
        let maintainer = Worker::spawn(
            "chronik-maintainer",
            engine.clone(),
            MAINTENANCE_PERIOD,
            Engine::maintain,
        )?;
        runtime.workers.push(maintainer);
        assert!(!runtime.workers.is_empty() && runtime.workers.len() <= 2);
        for shard in 0..engine.write_shards() {
            runtime.drivers.push(Driver::spawn(engine.clone(), shard)?);
        }
        Ok(runtime)
    }
}

impl Worker {
    /// A thread that runs `work` on `engine` at once and then once per `period` until stopped,
    /// its first error (the engine is then poisoned, and appenders see it), or a panic (which
    /// poisons the engine here, with the worker's name).
    fn spawn<I: Io>(
        name: &'static str,
        engine: Engine<I>,
        period: Duration,
        work: fn(&Engine<I>) -> Result<(), AppendError>,
    ) -> std::io::Result<Worker> {
        assert!(!period.is_zero(), "a worker never spins");
        let (stop, stopped) = bounded::<()>(1);
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            loop {
                match catch_unwind(AssertUnwindSafe(|| work(&engine))) {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        engine.poison(format!("the background thread {name} panicked"));
                        return;
                    }
                }
                match stopped.recv_timeout(period) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
        Ok(Worker { stop, thread })
    }
}

impl Driver {
    fn spawn<I: Io>(engine: Engine<I>, shard: usize) -> std::io::Result<Driver> {
        let stop = Arc::new(AtomicBool::new(false));
        let waker = engine.clone();
        let wake: Box<dyn Fn() + Send + Sync> = Box::new(move || waker.wake_write_path());
        let stopped = Arc::clone(&stop);
        let name = format!("chronik-driver-{shard}");
        let thread = std::thread::Builder::new().name(name.clone()).spawn(move || {
            let stop = || stopped.load(Ordering::SeqCst);
            if catch_unwind(AssertUnwindSafe(|| engine.drive_write_path(shard, &stop))).is_err() {
                engine.poison(format!("the background thread {name} panicked"));
            }
        })?;
        Ok(Driver { stop, wake, thread })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for driver in &self.drivers {
            driver.stop.store(true, Ordering::SeqCst);
            (driver.wake)();
        }
        for driver in self.drivers.drain(..) {
            let _ = driver.thread.join();
        }
        for worker in &self.workers {
            let _ = worker.stop.try_send(());
        }
        for worker in self.workers.drain(..) {
            let _ = worker.thread.join();
        }
    }
}
