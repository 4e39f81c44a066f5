//! Recovery and compaction run inside `tracing` spans named for them, with an event saying
//! what they did: a subscriber sees a `recovery` span per partition at open (a warning when
//! it repaired something) and a `compaction` span per pass.

mod common;

use chronik_engine::{Cleanup, Durability, Record, TopicConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::span::{Attributes, Id, Record as Values};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records span names and the level of each event.
#[derive(Default)]
struct Collector {
    next: AtomicU64,
    spans: Mutex<Vec<String>>,
    events: Mutex<Vec<(Level, String)>>,
}

struct Shared(Arc<Collector>);

impl Subscriber for Shared {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.0.spans.lock().unwrap().push(span.metadata().name().to_owned());
        Id::from_u64(self.0.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, _: &Values<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        self.0.events.lock().unwrap().push((*meta.level(), meta.target().to_owned()));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn recovery_and_compaction_have_spans_and_events() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (engine, _) = common::open(directory.path(), Durability::Sync);
        let config = TopicConfig { cleanup: Cleanup::Compact, ..common::small_segments(2) };
        engine.create_topic("t", config).unwrap();
        for i in 0..200_u32 {
            let key = format!("k{}", i % 5);
            engine.append("t", i % 2, &[Record::new(Some(key.as_bytes()), &[1; 200])]).unwrap();
        }
    }
    // A torn tail on partition 1: recovery cuts it and says so.
    let logs = std::fs::read_dir(directory.path().join("topics/t/1")).unwrap();
    let mut logs: Vec<_> = logs
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let active = logs.last().unwrap();
    let mut bytes = std::fs::read(active).unwrap();
    bytes.extend_from_slice(&[0x55; 64]);
    std::fs::write(active, bytes).unwrap();

    let collector = Arc::new(Collector::default());
    tracing::subscriber::with_default(Shared(Arc::clone(&collector)), || {
        let (engine, report) = common::open(directory.path(), Durability::Sync);
        assert!(!report.is_clean());
        engine.compact_partition("t", 0).unwrap().expect("a pass");
    });
    let spans = collector.spans.lock().unwrap().clone();
    let recoveries = spans.iter().filter(|s| *s == "recovery").count();
    assert!(recoveries >= 2, "{spans:?}"); // t/0 and t/1 (and the offsets topic if present)
    assert_eq!(spans.iter().filter(|s| *s == "compaction").count(), 1, "{spans:?}");
    let events = collector.events.lock().unwrap().clone();
    assert!(events.iter().any(|(level, _)| *level == Level::WARN), "{events:?}");
    assert!(events.iter().any(|(level, _)| *level == Level::INFO), "{events:?}");
}
