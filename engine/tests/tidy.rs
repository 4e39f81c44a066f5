//! Tidy: the engine core is sans-I/O, sans-clock and sans-thread. Files, the system clock,
//! threads, processes and randomness are reached only through `src/io/` (the I/O trait and its
//! backends) and `src/runtime.rs` (the system clock and the one background thread), so that the
//! simulator can replace all of them. This test reads every other source file of the engine and
//! fails, listing `file:line`, where one of them reaches for those directly.

use std::path::{Path, PathBuf};

/// Paths under `src/` that may use what the rest may not: a directory (every file below it)
/// or a file.
/// `loom_models.rs` spawns loom's simulated threads, only under `--cfg loom` in tests.
const EXEMPT: [&str; 3] = ["io", "runtime.rs", "loom_models.rs"];

/// What only the exempt files may name. A needle that starts (ends) with an identifier
/// character only matches where the text before (after) it does not continue the identifier,
/// so `SegmentFile::open` is not `File::open` and `std::thread_local!` is not `std::thread`.
const FORBIDDEN: [&str; 10] = [
    "std::fs",
    "File::open",
    "OpenOptions",
    "SystemTime",
    "Instant::now",
    "thread::spawn",
    "std::thread",
    "rand::",
    "getrandom",
    "std::process",
];

#[derive(Debug, PartialEq, Eq)]
struct Violation {
    /// 1-based.
    line: usize,
    what: &'static str,
}

fn is_identifier(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `needle` occurs in `line` as a whole path segment (see [`FORBIDDEN`]). A `:` before
/// the needle counts as continuing the path when `colon_continues` is set.
fn contains_path(line: &str, needle: &str, colon_continues: bool) -> bool {
    let starts_identifier = needle.chars().next().is_some_and(is_identifier);
    let ends_identifier = needle.chars().next_back().is_some_and(is_identifier);
    line.match_indices(needle).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + needle.len()..].chars().next();
        let continues = |c: char| is_identifier(c) || (colon_continues && c == ':');
        let left_ok = !starts_identifier || before.is_none_or(|c| !continues(c));
        let right_ok = !ends_identifier || after.is_none_or(|c| !is_identifier(c));
        left_ok && right_ok
    })
}

fn is_comment(line: &str) -> bool {
    // Covers `//`, `///` and `//!`, and so the examples in doc comments.
    line.trim_start().starts_with("//")
}

/// The forbidden uses in one source file, in line order.
fn check_source(source: &str) -> Vec<Violation> {
    let lines: Vec<(usize, &str)> = source
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !is_comment(l))
        .collect();
    let mut violations = Vec::new();
    // `use std::{fs, ...};`, possibly over several lines: the import itself is a violation,
    // and it makes every later `fs::` one.
    let mut fs_imports = Vec::new();
    let mut in_std_group = false;
    for &(number, line) in &lines {
        if line.contains("use std::{") {
            in_std_group = true;
        }
        if in_std_group && contains_path(line, "fs", false) {
            violations.push(Violation { line: number, what: "`fs` imported from `std`" });
            fs_imports.push(number);
        }
        if in_std_group && line.contains(';') {
            in_std_group = false;
        }
    }
    for &(number, line) in &lines {
        for what in FORBIDDEN {
            if contains_path(line, what, false) {
                violations.push(Violation { line: number, what });
            }
        }
        let imports_fs = !fs_imports.is_empty() && !fs_imports.contains(&number);
        if imports_fs && contains_path(line, "fs::", true) {
            violations.push(Violation { line: number, what: "fs::" });
        }
    }
    violations.sort_by_key(|v| v.line);
    violations
}

fn source_directory() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file below `directory`, sorted.
fn rust_files(directory: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![directory.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn is_exempt(relative: &Path) -> bool {
    EXEMPT.iter().any(|exempt| relative.starts_with(exempt))
}

#[test]
fn the_engine_core_uses_no_files_clock_threads_processes_or_randomness() {
    let root = source_directory();
    let mut checked = 0;
    let mut report = Vec::new();
    for path in rust_files(&root) {
        let relative = path.strip_prefix(&root).unwrap();
        if is_exempt(relative) {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = source.lines().collect();
        for violation in check_source(&source) {
            let text = lines[violation.line - 1].trim();
            let file = Path::new("engine/src").join(relative);
            report.push(format!(
                "{}:{}: `{}` in: {text}",
                file.display(),
                violation.line,
                violation.what
            ));
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} files checked under {}", root.display());
    assert!(
        report.is_empty(),
        "only src/io/ and src/runtime.rs may use files, the clock, threads, processes or \
         randomness; go through the `Io` trait, the `Clock` or the runtime instead:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_exempt_files_exist_and_need_their_exemption() {
    let root = source_directory();
    assert!(root.join("io").is_dir());
    assert!(root.join("runtime.rs").is_file());
    // If nothing exempt trips the checker, either the exemption is stale or the checker is
    // blind; both want a look.
    for exempt in EXEMPT {
        let path = root.join(exempt);
        let files = if path.is_dir() { rust_files(&path) } else { vec![path] };
        let violations: usize = files
            .iter()
            .map(|file| check_source(&std::fs::read_to_string(file).unwrap()).len())
            .sum();
        assert!(violations > 0, "nothing under src/{exempt} needs the exemption");
    }
}

#[test]
fn the_checker_catches_each_forbidden_use() {
    let cases = [
        ("let bytes = std::fs::read(path)?;", "std::fs"),
        ("use std::fs::File;", "std::fs"),
        ("let file = File::open(path)?;", "File::open"),
        ("let options = OpenOptions::new();", "OpenOptions"),
        ("use std::time::{Duration, SystemTime};", "SystemTime"),
        ("let start = Instant::now();", "Instant::now"),
        ("thread::spawn(move || work());", "thread::spawn"),
        ("let handle = std::thread::Builder::new();", "std::thread"),
        ("let x: u64 = rand::random();", "rand::"),
        ("getrandom::fill(&mut seed)?;", "getrandom"),
        ("std::process::exit(1);", "std::process"),
    ];
    for (line, what) in cases {
        let source = format!("fn f() {{\n    {line}\n}}\n");
        let violations = check_source(&source);
        assert!(violations.contains(&Violation { line: 2, what }), "{line:?}: {violations:?}");
    }
}

#[test]
fn the_checker_follows_fs_imported_in_a_std_group() {
    let source = "use std::{fs, io};\n\nfn f() {\n    fs::remove_file(p);\n}\n";
    let violations = check_source(source);
    let expected = [
        Violation { line: 1, what: "`fs` imported from `std`" },
        Violation { line: 4, what: "fs::" },
    ];
    assert_eq!(violations, expected);

    let source =
        "use std::{\n    collections::HashMap,\n    fs::{self, File},\n};\nfn f() { fs::read(p) }";
    let lines: Vec<usize> = check_source(source).iter().map(|v| v.line).collect();
    assert_eq!(lines, [3, 5]);
}

#[test]
fn the_checker_skips_comments_and_lookalikes() {
    let source = "\
//! Unlike `std::fs`, the engine goes through `Io`.
/// Never calls `SystemTime::now`:
    // std::thread::spawn is for the runtime only.
let file = SegmentFile::open(io, path, OpenMode::Read)?;
let file = io.open(path, OpenMode::ReadWrite)?;
let operand::value = 1;
thread_local! { static X: u8 = 0; }
let y = std::thread_local_thing;
let z = my_fs::read(p);
use crate::io::{self, Io};
";
    assert_eq!(check_source(source), []);
}

/// The module of `src/` a file belongs to: `engine/data.rs` is in `engine`, `segment.rs` in
/// `segment`. `None` for the crate root.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_owned())
}

/// The names the crate root re-exports, with the module each comes from (`Engine` ->
/// `engine`), from its `pub use module::{..}` and `pub use module::Name;` lines.
fn root_reexports(lib: &str) -> std::collections::BTreeMap<String, String> {
    let mut names = std::collections::BTreeMap::new();
    for statement in lib.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else { continue };
        let Some((module, items)) = rest.split_once("::") else { continue };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            names.insert(item.to_owned(), module.trim().to_owned());
        }
    }
    names
}

/// The modules a file's code (not its comments) names through `crate::`.
fn imports(source: &str, reexports: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for line in source.lines().filter(|line| !is_comment(line)) {
        for (at, _) in line.match_indices("crate::") {
            let name: String = line[at + 7..].chars().take_while(|&c| is_identifier(c)).collect();
            let module = reexports.get(&name).cloned().unwrap_or(name);
            found.push(module);
        }
        // `use crate::{a, b::C}` names several at once.
        if let Some(group) = line.split("crate::{").nth(1) {
            for item in group.split(',') {
                let name: String = item.trim().chars().take_while(|&c| is_identifier(c)).collect();
                found.push(reexports.get(&name).cloned().unwrap_or(name));
            }
        }
    }
    found
}

/// A cycle in `graph` (module -> modules it imports), as the modules along it, if any.
fn find_cycle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut cycle = path[start..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph.keys().find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

/// The engine's modules, each with the modules of the engine it imports.
fn module_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let root = source_directory();
    let reexports = root_reexports(&std::fs::read_to_string(root.join("lib.rs")).unwrap());
    let files = rust_files(&root);
    let modules: std::collections::BTreeSet<String> =
        files.iter().filter_map(|file| module_of(file.strip_prefix(&root).unwrap())).collect();
    let mut graph = std::collections::BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file.strip_prefix(&root).unwrap()) else { continue };
        // The loom models drive the whole engine and are not part of it.
        if module == "loom_models" {
            continue;
        }
        let source = std::fs::read_to_string(file).unwrap();
        let entry: &mut std::collections::BTreeSet<String> =
            graph.entry(module.clone()).or_default();
        entry.extend(
            imports(&source, &reexports)
                .into_iter()
                .filter(|named| *named != module && modules.contains(named)),
        );
    }
    graph
}

/// The engine's modules depend on one another in layers: leaf modules (the context, the file
/// layout, the compaction swap protocol, the formats) below the partition, recovery and the
/// cleaner, and those below the engine. No module imports one that imports it back.
#[test]
fn the_engine_modules_import_one_another_without_a_cycle() {
    let graph = module_graph();
    assert!(graph.len() > 20, "found only {} modules", graph.len());
    assert!(graph["engine"].contains("partition"), "the graph misses imports: {graph:?}");
    assert!(graph["runtime"].contains("engine"), "root re-exports are not followed");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the engine's modules import each other in a cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let mut graph = module_graph();
    assert_eq!(find_cycle(&graph), None);
    // The cycle this project had: recovery used the partition's context, and the partition
    // recovery.
    graph.get_mut("recovery").unwrap().insert("partition".to_owned());
    let cycle = find_cycle(&graph).expect("the planted cycle is found");
    assert!(cycle.contains(&"recovery".to_owned()) && cycle.contains(&"partition".to_owned()));
    assert_eq!(cycle.first(), cycle.last());
}
