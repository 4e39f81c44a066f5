//! A mistyped `--data`: every command that only reads, or changes what is already there,
//! refuses a data directory that does not exist (one line, exit 2) and creates nothing; the
//! commands that write (produce, topic create) still create it.

mod common;

use common::{assert_fails, chronik_bytes, text};

#[test]
fn a_missing_data_directory_is_refused_by_every_command_but_the_writers() {
    let directory = tempfile::tempdir().unwrap();
    let typo = directory.path().join("typo");
    let commands: &[&[&str]] = &[
        &["topic", "list"],
        &["topic", "describe", "t"],
        &["topic", "config", "t", "retention_ms=1"],
        &["topic", "delete", "t"],
        &["stats"],
        &["stats", "t"],
        &["consume", "t"],
        &["consume", "t", "--group", "g"],
        &["consume", "t", "--follow"],
        &["compact", "t"],
        &["delete-records", "t", "--before", "1"],
        &["verify"],
    ];
    for args in commands {
        let case = format!("chronik {}", args.join(" "));
        let output = chronik_bytes(&typo, args, b"");
        // verify has always said so in its own words.
        let needle = if args[0] == "verify" { "is not a directory" } else { "does not exist" };
        let stderr = assert_fails(&output, 2, needle, &case);
        assert!(stderr.contains(&typo.display().to_string()), "{case}: {stderr}");
        assert!(output.stdout.is_empty(), "{case}: printed {}", text(&output.stdout));
        assert!(!typo.exists(), "{case}: created the data directory");
    }
    // A missing parent too.
    let nested = directory.path().join("no/such/place");
    let output = chronik_bytes(&nested, &["topic", "list"], b"");
    assert_fails(&output, 2, "does not exist", "nested");
    assert!(!directory.path().join("no").exists());

    // The writers create it, and then the readers work.
    let output = chronik_bytes(&typo, &["produce", "t"], b"one\n");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = chronik_bytes(&typo, &["topic", "list"], b"");
    assert_eq!(text(&output.stdout), "t\n", "{}", text(&output.stderr));
    let created = directory.path().join("created");
    let output = chronik_bytes(&created, &["topic", "create", "u"], b"");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = chronik_bytes(&created, &["consume", "u"], b"");
    assert!(output.status.success() && output.stdout.is_empty(), "{}", text(&output.stderr));
}
