//! A processor whose output fills the disk: the error names the partition whose write failed
//! (an output partition), not the task's input partition. A 4 MiB tmpfs; needs root and
//! mount(8), elsewhere the test says why and passes.

use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig, Runner};
use chronik::{Chronik, Durability, Options, Record, RecordView, TopicConfig};
use std::process::Command;

/// Unmounts the tmpfs when the test ends, whatever happens.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Emits each input record four times over, 1 KiB each, to "pout".
struct Amplify;

impl Processor for Amplify {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let value = vec![b'x'; 1024];
        for _ in 0..4 {
            ctx.emit("pout", record.key(), &value);
        }
        Ok(())
    }
}

#[test]
fn a_full_disk_under_a_processor_names_the_output_partition() {
    let directory = tempfile::tempdir().unwrap();
    let point = directory.path().join("full");
    std::fs::create_dir(&point).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&point)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        println!("full_disk_processor: skipped: cannot mount a tmpfs here (needs root and mount)");
        return;
    }
    let _unmount = Mount(point.clone());
    let options = Options { durability: Durability::Sync, ..Options::default() };
    let chronik = Chronik::open(point.join("data"), options).unwrap();
    chronik.create_topic("in", TopicConfig::default()).unwrap();
    chronik.create_topic("pout", TopicConfig::default()).unwrap();
    for i in 0..2000u32 {
        chronik.engine().append("in", 0, &[Record::new(None, &i.to_le_bytes())]).unwrap();
    }
    let config = ProcessorConfig::new("amplify", "in");
    let mut runner = Runner::new(chronik.engine(), config, |_| Amplify).unwrap();
    let error = runner.run_until_caught_up().expect_err("the disk fills");
    let message = error.to_string();
    println!("{message}");
    assert!(message.contains("No space left on device"), "{message}");
    assert!(message.contains("pout"), "the error names the output topic: {message}");
}
