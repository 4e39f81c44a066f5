//! Each real-file backend (pread/pwrite, and io_uring where the kernel allows it) keeps the
//! `Io` contract the engine relies on: reads return what was written and stop short only at the
//! end of the file; a batch comes back in order, one completion per operation, buffers handed
//! back; a write followed by its fdatasync in one batch is ordered; batches longer than the
//! ring run in rounds; bad handles fail their own operation only; and many threads submit at
//! once. `submit_linked` too: a chain runs in order (a hundred linked writes to one position
//! leave the last), chains longer than the ring and more chains than fit one round finish, a
//! failure cancels the rest of its chain and only its chain, and truncate or allocate inside a
//! chain keep their place. The rest of the engine's tests run on the backend
//! `CHRONIK_TEST_IO` names (the test script runs them on both).

use chronik_engine::io::Namespace;
use chronik_engine::io::{
    Backend, Completion, FileHandle, Io, Linked, OpenMode, Operation, SystemIo, is_canceled,
    sync_directory,
};
use std::path::Path;
use std::sync::Arc;

fn backends() -> Vec<SystemIo> {
    let mut backends = vec![SystemIo::new(Backend::Pread).unwrap()];
    match SystemIo::new(Backend::IoUring) {
        Ok(io) => backends.push(io),
        // Reported, not hidden: on a kernel without io_uring only pread is checked.
        Err(error) => eprintln!("io_uring unavailable here, checking pread only: {error}"),
    }
    backends
}

fn create(io: &SystemIo, path: &Path) -> FileHandle {
    io.open(path, OpenMode::CreateNew).unwrap()
}

#[test]
fn auto_picks_io_uring_where_the_kernel_allows_it() {
    let auto = SystemIo::new(Backend::Auto).unwrap();
    if SystemIo::new(Backend::IoUring).is_ok() {
        assert_eq!((auto.name(), auto.fallback()), ("io_uring", None));
    } else {
        assert_eq!(auto.name(), "pread");
        assert!(auto.fallback().unwrap().contains("io_uring unavailable"));
    }
    assert_eq!(SystemIo::new(Backend::Pread).unwrap().name(), "pread");
    assert_eq!("io_uring".parse(), Ok(Backend::IoUring));
    assert!("mmap".parse::<Backend>().is_err());
}

#[test]
fn a_batch_completes_in_order_with_its_buffers() {
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("f");
        let file = create(&io, &path);
        // More operations than one ring round, writes and a closing fdatasync.
        let mut batch: Vec<Operation> = (0..200u64)
            .map(|i| Operation::Write {
                file,
                position: i * 100,
                buffer: vec![(i % 251) as u8; 100],
            })
            .collect();
        batch.push(Operation::Fdatasync { file });
        let completions = io.submit(batch);
        assert_eq!(completions.len(), 201, "{}", io.name());
        for (i, completion) in completions.iter().enumerate().take(200) {
            assert_eq!(completion.result.as_ref().unwrap(), &100, "{} op {i}", io.name());
            assert_eq!(completion.buffer, vec![(i % 251) as u8; 100]);
        }
        assert_eq!(completions[200].result.as_ref().unwrap(), &0);
        assert_eq!(io.file_size(file).unwrap(), 20_000);
        // Reads: whole, across the end (short), past the end (empty), with a bad handle
        // between them failing alone.
        let completions = io.submit(vec![
            Operation::Read { file, position: 150, buffer: vec![0; 100] },
            Operation::Read { file, position: 19_950, buffer: vec![0; 100] },
            Operation::Read { file: FileHandle(u64::MAX), position: 0, buffer: vec![0; 10] },
            Operation::Read { file, position: 30_000, buffer: vec![0; 10] },
            Operation::Fsync { file },
        ]);
        let mut expected = vec![1; 50];
        expected.extend(vec![2; 50]);
        assert_eq!(completions[0].buffer, expected, "{}", io.name());
        assert_eq!(completions[1].buffer, vec![199; 50], "{}: short at the end", io.name());
        assert_eq!(*completions[1].result.as_ref().unwrap(), 50);
        assert!(completions[2].result.is_err(), "{}: a bad handle fails", io.name());
        assert!(completions[3].buffer.is_empty() && completions[3].result.is_ok());
        assert!(completions[4].result.is_ok());
        // Size changes go through the same submit.
        let completions = io.submit(vec![
            Operation::Truncate { file, length: 1000 },
            Operation::Allocate { file, position: 0, length: 4096 },
        ]);
        assert!(completions.iter().all(|c| c.result.is_ok()), "{}", io.name());
        assert_eq!(io.file_size(file).unwrap(), 4096);
        io.close(file);
        sync_directory(&io, directory.path()).unwrap();
        // A large write, read back in one operation.
        let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 253) as u8).collect();
        let file = create(&io, &directory.path().join("big"));
        let written = io.submit(vec![
            Operation::Write { file, position: 0, buffer: big.clone() },
            Operation::Fdatasync { file },
        ]);
        assert!(written.iter().all(|c| c.result.is_ok()), "{}", io.name());
        let read = io.submit(vec![Operation::Read { file, position: 0, buffer: vec![0; 4 << 20] }]);
        assert_eq!(read[0].buffer, big, "{}", io.name());
        io.close(file);
    }
}

#[test]
fn many_threads_submit_at_once() {
    for io in backends() {
        let io = Arc::new(io);
        let directory = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..16u8)
            .map(|t| {
                let io = Arc::clone(&io);
                let path = directory.path().join(format!("t{t}"));
                std::thread::spawn(move || {
                    let file = io.open(&path, OpenMode::CreateNew).unwrap();
                    for i in 0..50u64 {
                        let done = io.submit(vec![
                            Operation::Write { file, position: i * 8, buffer: vec![t; 8] },
                            Operation::Fdatasync { file },
                        ]);
                        assert!(done.iter().all(|c| c.result.is_ok()));
                    }
                    let read = io.submit(vec![Operation::Read {
                        file,
                        position: 0,
                        buffer: vec![0; 400],
                    }]);
                    assert_eq!(read[0].buffer, vec![t; 400]);
                    io.close(file);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}

/// Direct handles: aligned writes, alone and in a batch through the ring, read back through
/// the same handle; a misaligned write fails with `InvalidInput` and changes nothing; the
/// other operations of its batch still run.
#[test]
fn direct_writes_are_aligned_and_read_back() {
    use chronik_engine::io::DIRECT_ALIGNMENT as BLOCK;
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("direct");
        let file = io.open(&path, OpenMode::CreateNewDirect).unwrap();
        let block = |fill: u8| vec![fill; BLOCK];
        let alone = io.submit(vec![Operation::Write { file, position: 0, buffer: block(1) }]);
        assert_eq!(alone[0].result.as_ref().unwrap(), &BLOCK, "{}", io.name());
        let batch = io.submit(vec![
            Operation::Write { file, position: BLOCK as u64, buffer: block(2) },
            Operation::Write { file, position: 2 * BLOCK as u64 + 1, buffer: block(9) },
            Operation::Write { file, position: 2 * BLOCK as u64, buffer: vec![3; 2 * BLOCK] },
            Operation::Fdatasync { file },
        ]);
        assert_eq!(batch[0].result.as_ref().unwrap(), &BLOCK, "{}", io.name());
        let error = batch[1].result.as_ref().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{}: {error}", io.name());
        assert!(error.to_string().contains("not aligned"), "{error}");
        assert_eq!(batch[2].result.as_ref().unwrap(), &(2 * BLOCK), "{}", io.name());
        assert!(batch[3].result.is_ok(), "{}", io.name());
        let misaligned_length =
            io.submit(vec![Operation::Write { file, position: 0, buffer: vec![7; 100] }]);
        assert!(misaligned_length[0].result.is_err(), "{}", io.name());
        // Unaligned reads are fine on a direct handle.
        let read = io.submit(vec![Operation::Read { file, position: 10, buffer: vec![0; 5000] }]);
        let mut expected = vec![1; BLOCK - 10];
        expected.extend(vec![2; 5000 - (BLOCK - 10)]);
        assert_eq!(read[0].buffer, expected, "{}", io.name());
        io.close(file);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4 * BLOCK);
        assert!(bytes[2 * BLOCK..].iter().all(|&b| b == 3), "{}", io.name());
    }
}

fn linked(operation: Operation, link_next: bool) -> Linked {
    Linked { operation, link_next }
}

fn write(file: FileHandle, position: u64, buffer: Vec<u8>) -> Operation {
    Operation::Write { file, position, buffer }
}

fn read_all(io: &SystemIo, path: &Path) -> Vec<u8> {
    let file = io.open(path, OpenMode::Read).unwrap();
    let size = io.file_size(file).unwrap();
    let data = chronik_engine::io::read_exact(io, file, 0, size as usize).unwrap();
    io.close(file);
    data
}

fn ok(completion: &Completion) -> usize {
    *completion.result.as_ref().unwrap()
}

#[test]
fn a_chain_runs_in_order_even_past_the_ring() {
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("f");
        let file = io.open(&path, OpenMode::CreateNew).unwrap();
        // 150 writes to the same four bytes, then an fdatasync, all one chain: only the order
        // decides which bytes are left.
        let mut batch: Vec<Linked> =
            (0..150u32).map(|i| linked(write(file, 0, i.to_le_bytes().to_vec()), true)).collect();
        batch.push(linked(Operation::Fdatasync { file }, false));
        // A second chain with an fdatasync, so the batch goes to the ring (a batch with one
        // syncing chain runs inline).
        let other = io.open(&directory.path().join("other"), OpenMode::CreateNew).unwrap();
        batch.push(linked(write(other, 0, b"other".to_vec()), true));
        batch.push(linked(Operation::Fdatasync { file: other }, false));
        let completions = io.submit_linked(batch);
        assert_eq!(completions.len(), 153, "{}", io.name());
        assert!(completions[..150].iter().all(|c| ok(c) == 4), "{}", io.name());
        assert_eq!(completions[10].buffer, 10u32.to_le_bytes(), "buffers handed back in order");
        assert!(completions[150].result.is_ok());
        assert_eq!(read_all(&io, &path), 149u32.to_le_bytes(), "{}: the last write", io.name());
        io.close(file);
        io.close(other);
    }
}

#[test]
fn many_chains_of_many_files_all_finish() {
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let paths: Vec<_> = (0..12).map(|i| directory.path().join(format!("f{i}"))).collect();
        let files: Vec<_> =
            paths.iter().map(|p| io.open(p, OpenMode::CreateNew).unwrap()).collect();
        // Per file: eight writes in a chain with an fdatasync, more entries than one round.
        let mut batch = Vec::new();
        for (index, &file) in files.iter().enumerate() {
            for part in 0..8u64 {
                let bytes = vec![(index * 8 + part as usize) as u8; 1000];
                batch.push(linked(write(file, part * 1000, bytes), true));
            }
            batch.push(linked(Operation::Fdatasync { file }, false));
        }
        let completions = io.submit_linked(batch);
        assert!(completions.iter().all(|c| c.result.is_ok()), "{}", io.name());
        for (index, path) in paths.iter().enumerate() {
            let data = read_all(&io, path);
            assert_eq!(data.len(), 8000);
            for part in 0..8 {
                let expected = (index * 8 + part) as u8;
                assert!(data[part * 1000..(part + 1) * 1000].iter().all(|&b| b == expected));
            }
        }
        for file in files {
            io.close(file);
        }
    }
}

#[test]
fn a_failure_cancels_the_rest_of_its_chain_only() {
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let good_path = directory.path().join("good");
        let good = io.open(&good_path, OpenMode::CreateNew).unwrap();
        let bad_path = directory.path().join("read-only");
        io.close(io.open(&bad_path, OpenMode::CreateNew).unwrap());
        let read_only = io.open(&bad_path, OpenMode::Read).unwrap();
        let batch = vec![
            linked(write(read_only, 0, b"refused".to_vec()), true),
            linked(write(read_only, 7, b"never".to_vec()), true),
            linked(Operation::Fdatasync { file: read_only }, false),
            linked(write(good, 0, b"kept".to_vec()), true),
            linked(Operation::Fdatasync { file: good }, false),
        ];
        let completions = io.submit_linked(batch);
        let error = completions[0].result.as_ref().unwrap_err();
        assert!(!is_canceled(error), "{}: the write itself fails: {error}", io.name());
        for completion in &completions[1..3] {
            let error = completion.result.as_ref().unwrap_err();
            assert!(is_canceled(error), "{}: cancelled, not run: {error}", io.name());
        }
        assert_eq!(completions[1].buffer, b"never", "a cancelled write hands its buffer back");
        assert_eq!(ok(&completions[3]), 4);
        assert!(completions[4].result.is_ok());
        assert_eq!(read_all(&io, &good_path), b"kept");
        assert_eq!(read_all(&io, &bad_path), b"", "nothing reached the refused file");
        io.close(good);
        io.close(read_only);
    }
}

#[test]
fn truncate_and_allocate_keep_their_place_in_a_chain() {
    for io in backends() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("f");
        let file = io.open(&path, OpenMode::CreateNew).unwrap();
        let other_path = directory.path().join("other");
        let other = io.open(&other_path, OpenMode::CreateNew).unwrap();
        let batch = vec![
            linked(write(file, 0, vec![7; 8192]), true),
            linked(Operation::Truncate { file, length: 100 }, true),
            linked(Operation::Allocate { file, position: 100, length: 50 }, true),
            linked(write(file, 150, vec![9; 10]), true),
            linked(Operation::Fsync { file }, false),
            linked(write(other, 0, vec![1; 10]), false),
        ];
        let completions = io.submit_linked(batch);
        assert!(completions.iter().all(|c| c.result.is_ok()), "{}", io.name());
        let data = read_all(&io, &path);
        assert_eq!(data.len(), 160, "{}: write, cut, grown, written after", io.name());
        assert!(data[..100].iter().all(|&b| b == 7));
        assert!(data[100..150].iter().all(|&b| b == 0));
        assert!(data[150..].iter().all(|&b| b == 9));
        assert_eq!(read_all(&io, &other_path), vec![1; 10]);
        io.close(file);
        io.close(other);
    }
}
