//! The production runtime: the system clock, and the thread that drives background steps.
//! The only module of the engine that reads the clock or spawns threads.

use crate::io::Io;
use crate::{Clock, Durability, Engine};
use crossbeam_channel::{RecvTimeoutError, Sender, bounded};
use std::panic::{AssertUnwindSafe, catch_unwind};
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
}

/// Drives [`Engine::tick`] from a background thread. Stops (and joins the thread) on drop.
/// A panic in a step poisons the engine instead of dying silently.
#[derive(Debug)]
pub struct Runtime {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    /// Start the background thread that calls [`Engine::tick`]: interval fsyncs and
    /// retention. Once at start, then every `min(ms, 100)` ms in `interval` mode and every
    /// second otherwise; none for a read-only engine. Dropping the runtime waits for a tick in
    /// progress.
    pub fn start<I: Io>(engine: &Engine<I>) -> std::io::Result<Runtime> {
        let options = engine.options();
        if options.read_only {
            return Ok(Runtime { stop: None, thread: None });
        }
        let period = match options.durability {
            Durability::Interval { ms } => Duration::from_millis(ms.clamp(1, 100)),
            Durability::Sync | Durability::Os => Duration::from_secs(1),
        };
        let (stop, stopped) = bounded::<()>(1);
        let engine = engine.clone();
        let thread =
            std::thread::Builder::new().name("chronik-ticker".to_owned()).spawn(move || {
                // The first tick at once, so even a short-lived process (one command of the
                // CLI) applies retention; then one per period until stopped.
                loop {
                    match catch_unwind(AssertUnwindSafe(|| engine.tick())) {
                        Ok(Ok(())) => {}
                        // A failed flush already poisoned the engine; appenders see it.
                        Ok(Err(_)) => return,
                        Err(_) => {
                            engine.poison("the background ticker panicked".to_owned());
                            return;
                        }
                    }
                    match stopped.recv_timeout(period) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Runtime { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.try_send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
