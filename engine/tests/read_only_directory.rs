//! A data directory the process may read but not change (a read-only mount, or permissions the
//! test machines cannot show, since they run as root): an `Io` that refuses every change with
//! `EROFS`, as the kernel does. A writer's open fails with a typed error and changes nothing; a
//! read-only open reads every record; the directory opens normally afterwards.

use chronik_engine::io::Completion;
use chronik_engine::io::{DirectoryEntry, FileHandle, Io, Namespace, OpenMode, Operation, PreadIo};
use chronik_engine::runtime::SystemClock;
use chronik_engine::{Engine, OpenError, Options, Record, TopicConfig};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Reads pass through; every change is refused.
#[derive(Default)]
struct ReadOnlyFs(PreadIo);

fn refused() -> io::Error {
    io::Error::from_raw_os_error(30) // EROFS
}

impl Io for ReadOnlyFs {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        operations
            .into_iter()
            .map(|operation| match operation {
                Operation::Read { .. } => self.0.submit(vec![operation]).remove(0),
                Operation::Write { buffer, .. } => Completion { buffer, result: Err(refused()) },
                _ => Completion { buffer: Vec::new(), result: Err(refused()) },
            })
            .collect()
    }
}

impl Namespace for ReadOnlyFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        if mode == OpenMode::Read { self.0.open(path, mode) } else { Err(refused()) }
    }
    fn close(&self, file: FileHandle) {
        self.0.close(file);
    }
    fn file_size(&self, file: FileHandle) -> io::Result<u64> {
        self.0.file_size(file)
    }
    fn create_directory(&self, _: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>> {
        self.0.list(directory)
    }
    fn rename(&self, _: &Path, _: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn remove_file(&self, _: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn remove_directory(&self, _: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn lock(&self, _: &Path) -> io::Result<FileHandle> {
        Err(refused())
    }
}

fn values(engine: &Engine<impl Io>) -> Vec<Vec<u8>> {
    let fetch = engine.read("t", 0, chronik_engine::Offset::ZERO, 1 << 20).unwrap();
    fetch.records().map(|r| r.value().to_vec()).collect()
}

#[test]
fn a_read_only_directory_refuses_writers_and_serves_readers() {
    let directory = tempfile::tempdir().unwrap();
    let clock = || Arc::new(SystemClock);
    {
        let (engine, _) =
            Engine::open(PreadIo::new(), clock(), directory.path(), Options::default()).unwrap();
        engine.create_topic("t", TopicConfig::default()).unwrap();
        engine.append("t", 0, &[Record::new(None, b"one"), Record::new(None, b"two")]).unwrap();
    }
    let listing = |p: &Path| -> Vec<_> {
        walk(p).into_iter().map(|f| (f.clone(), std::fs::read(&f).unwrap())).collect()
    };
    let before = listing(directory.path());

    let error = Engine::open(ReadOnlyFs::default(), clock(), directory.path(), Options::default())
        .err()
        .expect("a writer cannot open a read-only directory");
    assert!(matches!(error, OpenError::Io(_)), "{error:?}");
    assert!(error.to_string().contains("Read-only file system"), "{error}");

    let options = Options { read_only: true, ..Options::default() };
    let (reader, _) =
        Engine::open(ReadOnlyFs::default(), clock(), directory.path(), options).unwrap();
    assert_eq!(values(&reader), [b"one".to_vec(), b"two".to_vec()]);
    assert!(reader.append("t", 0, &[Record::new(None, b"three")]).is_err());
    drop(reader);

    assert_eq!(listing(directory.path()), before, "a refused open changed the directory");
    let (engine, _) =
        Engine::open(PreadIo::new(), clock(), directory.path(), Options::default()).unwrap();
    assert_eq!(values(&engine), [b"one".to_vec(), b"two".to_vec()]);
}

fn walk(path: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files.sort();
    files
}
