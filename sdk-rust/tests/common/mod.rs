//! Helpers shared by the tests that run the examples as processes.

use std::path::PathBuf;
use std::process::Command;

/// An example binary: `cargo test` builds the package's examples next to its test binaries.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let path = profile.join("examples").join(name);
    {
        // A filtered `cargo test --test ...` builds no examples, or builds them stale: build
        // this one (nothing to do when it is up to date).
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let profile = if cfg!(debug_assertions) { "dev" } else { "release" };
        let mut build = Command::new(cargo);
        build.args(["build", "--quiet", "-p", "chronik", "--profile", profile, "--example", name]);
        if cfg!(feature = "kafka") {
            build.args(["--features", "kafka"]);
        }
        assert!(build.status().unwrap().success(), "building the example {name} failed");
    }
    assert!(path.exists(), "{} is not built", path.display());
    path
}
