//! Scoped worker threads for work an open or a close spreads over partitions: the one place
//! besides `runtime.rs` (and the I/O backends) that starts threads, and only for the length
//! of one call. With one thread it starts none, so the simulator's opens stay deterministic.

/// Run `work` over `items` on up to `threads` threads (the caller's among them) and return
/// the results in the order of `items`. With one thread (or one item) everything runs on the
/// calling thread, in order, so that an engine opened in the simulator stays deterministic.
/// Used by [`Engine::open`] to recover a topic's partitions in parallel.
pub fn map_parallel<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().map(work).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<R>>> =
        std::sync::Mutex::new(items.iter().map(|_| None).collect());
    let run = || {
        loop {
            let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(item) = items.get(index) else { break };
            let result = work(item);
            results.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[index] = Some(result);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(run);
        }
        run();
    });
    let results = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(results.iter().all(Option::is_some), "every item was worked on");
    results.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::map_parallel;
    use std::collections::BTreeSet;

    #[test]
    fn map_parallel_keeps_the_order_and_spreads_the_work() {
        let items: Vec<u64> = (0..200).collect();
        for threads in [0, 1, 3, 500] {
            let results = map_parallel(threads, &items, |&i| {
                std::thread::sleep(std::time::Duration::from_micros(200));
                (i * i, std::thread::current().id())
            });
            let squares: Vec<u64> = results.iter().map(|&(square, _)| square).collect();
            assert_eq!(squares, items.iter().map(|i| i * i).collect::<Vec<_>>(), "{threads}");
            let workers: BTreeSet<String> =
                results.iter().map(|(_, id)| format!("{id:?}")).collect();
            if threads <= 1 {
                assert_eq!(workers.len(), 1, "one thread runs everything on the caller");
            } else {
                assert!(workers.len() > 1, "{threads} threads: the work was spread");
            }
        }
        assert!(map_parallel(4, &[] as &[u8], |_| 0).is_empty());
    }
}
