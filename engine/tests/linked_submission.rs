//! `Io::submit_linked` on each real-file backend (pread/pwrite, and io_uring where the kernel
//! allows it): a chain runs in order (a hundred linked writes to one position leave the last),
//! chains longer than the ring and more chains than fit one round finish, a failure cancels
//! the rest of its chain and only its chain, and truncate or allocate inside a chain keep their
//! place.

use chronik_engine::io::{
    Backend, Completion, FileHandle, Io, Linked, OpenMode, Operation, SystemIo, is_canceled,
};
use std::path::Path;

fn backends() -> Vec<SystemIo> {
    let mut backends = vec![SystemIo::new(Backend::Pread).unwrap()];
    match SystemIo::new(Backend::IoUring) {
        Ok(io) => backends.push(io),
        Err(error) => eprintln!("io_uring unavailable here, checking pread only: {error}"),
    }
    backends
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
        let completions = io.submit_linked(batch);
        assert_eq!(completions.len(), 151, "{}", io.name());
        assert!(completions[..150].iter().all(|c| ok(c) == 4), "{}", io.name());
        assert_eq!(completions[10].buffer, 10u32.to_le_bytes(), "buffers handed back in order");
        assert!(completions[150].result.is_ok());
        assert_eq!(read_all(&io, &path), 149u32.to_le_bytes(), "{}: the last write", io.name());
        io.close(file);
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
