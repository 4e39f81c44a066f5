//! `chronik dump FILE` of a file that is not a segment (text, an index, other metadata,
//! random bytes, an empty file, a directory) says so in one line with exit 2 and prints
//! nothing, not "damage at position 0" as if a segment were damaged. A copy of a segment under
//! another name is still dumped, and a segment damaged from its first byte is still damage.

mod common;

use common::{assert_fails, chronik_raw, produce_lines, segments, text};
use std::ffi::OsStr;
use std::path::Path;

fn dump(files: &[&Path]) -> std::process::Output {
    let mut args: Vec<&OsStr> = vec![OsStr::new("dump")];
    args.extend(files.iter().map(|f| f.as_os_str()));
    chronik_raw(&args, b"")
}

#[test]
fn a_file_that_is_not_a_segment_is_named_as_such() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    produce_lines(&data, 500);
    let logs = segments(&data);
    let text_file = directory.path().join("notes.txt");
    std::fs::write(&text_file, "hello, these are notes and not a segment at all\n").unwrap();
    let random = directory.path().join("random.bin");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let bytes: Vec<u8> = (0..5000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect();
    std::fs::write(&random, bytes).unwrap();
    let empty = directory.path().join("empty.log");
    std::fs::write(&empty, b"").unwrap();
    let cases: [(&Path, &str); 8] = [
        (&text_file, "is not a segment file: its first bytes are not a batch"),
        (&random, "is not a segment file: its first bytes are not a batch"),
        (&empty, "is not a segment file: it is empty"),
        (&logs[0].with_extension("index"), "is an offset index, not a segment file"),
        (&logs[0].with_extension("timeindex"), "is a time index, not a segment file"),
        (&data.join("chronik.meta"), "is the data directory's metadata, not a segment file"),
        (&data.join("topics/t/topic.meta"), "is a topic's metadata, not a segment file"),
        (&data.join("topics/t/0"), "is a directory, not a segment file"),
    ];
    for (file, needle) in cases {
        let case = file.display().to_string();
        // Also after a good segment: nothing is printed before the refusal.
        let output = dump(&[&logs[0], file]);
        assert_fails(&output, 2, needle, &case);
        assert!(output.stdout.is_empty(), "{case}: printed {}", text(&output.stdout));
    }

    // A copy of a segment under any name is a segment.
    let copy = directory.path().join("copy.bin");
    std::fs::copy(&logs[0], &copy).unwrap();
    let output = dump(&[&copy]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("baseOffset: 0 "), "{}", text(&output.stdout));
    // A segment's name with bad bytes at its start is a damaged segment: exit 3, as before.
    let damaged = directory.path().join("00000000000000000000.log");
    std::fs::write(&damaged, b"hello, these are notes and not a segment at all\n").unwrap();
    let output = dump(&[&damaged]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("damage at position 0"), "{}", text(&output.stdout));
}
