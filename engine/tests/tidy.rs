//! Tidy: checks of the sources that no compiler makes.
//!
//! - The engine core is sans-I/O, sans-clock and sans-thread. Files, the system clock, threads,
//!   processes and randomness are reached only through `src/io/` (the I/O trait and its
//!   backends), `src/runtime.rs` (the system clock and the background threads) and
//!   `src/parallel.rs` (scoped workers of an open or close, none with one thread), so that
//!   the simulator can replace all of them. Every other source file of the engine is read, and
//!   the test fails, listing `file:line`, where one of them reaches for those directly.
//! - In every crate of the workspace, no module (a file) imports one that imports it back.
//! - No file of `sdk-rust/src` or `sim/src` is longer than [`FILE_LINES_MAX`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Paths under `src/` that may use what the rest may not: a directory (every file below it)
/// or a file.
/// `loom_models.rs` spawns loom's simulated threads, only under `--cfg loom` in tests.
const EXEMPT: [&str; 4] = ["io", "runtime.rs", "parallel.rs", "loom_models.rs"];

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
        "only src/io/, src/runtime.rs and src/parallel.rs may use files, the clock, threads, \
         processes or \
         randomness; go through the `Io` trait, the `Clock` or the runtime instead:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_exempt_files_exist_and_need_their_exemption() {
    let root = source_directory();
    assert!(root.join("io").is_dir());
    assert!(root.join("runtime.rs").is_file());
    assert!(root.join("parallel.rs").is_file());
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

// ---- Module cycles, in every crate of the workspace ----
//
// A module is a file. A file imports another when its code (not its comments or strings)
// names it through `crate::` or `super::`: `crate::a::b::C` names the file of the longest
// module prefix, `a/b.rs` (or `a/b/mod.rs`), or `a.rs` if `b` is not a file module. A name the
// crate root re-exports (`crate::Engine`, from `pub use engine::Engine;`) names the module it
// comes from. `pub use` lines are re-exports, not imports: a root that re-exports a module is
// not made to depend on it. `super::` inside an inline `mod tests { .. }` is the file itself.

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Workspace members, from the root `Cargo.toml`'s `members = [..]`.
fn workspace_members() -> Vec<String> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let list = manifest.split("members").nth(1).expect("a members list");
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The text of `source` with comments blanked and string and character literals emptied,
/// line breaks kept, so that only code is searched for paths.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    // Keeps line breaks of skipped text, so that line numbers survive.
    let skip = |out: &mut String, text: &[char]| {
        out.extend(text.iter().filter(|&&c| c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |p| i + p);
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < chars.len() && depth > 0 {
                match (chars[j], chars.get(j + 1)) {
                    ('/', Some('*')) => (depth, j) = (depth + 1, j + 2),
                    ('*', Some('/')) => (depth, j) = (depth - 1, j + 2),
                    _ => j += 1,
                }
            }
            skip(&mut out, &chars[i..j.min(chars.len())]);
            i = j;
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i].last().is_some_and(|&p| is_identifier(p))
        {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let mut j = i + 2 + hashes;
            while j < chars.len()
                && !(chars[j] == '"'
                    && chars[j + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes)
            {
                j += 1;
            }
            skip(&mut out, &chars[i..j.min(chars.len())]);
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            skip(&mut out, &chars[i..j.min(chars.len())]);
            out.push_str("\"\"");
            i = j + 1;
        } else if c == '\'' && next == Some('\\') {
            let end =
                chars[i + 2..].iter().position(|&c| c == '\'').map_or(chars.len(), |p| i + 3 + p);
            out.push_str("' '");
            i = end;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The paths a `use` tree or path expression names, starting at `text` (just after
/// `crate::` or `super::`), each as its segments: `a::{b::C, d}` gives `[a, b, C]`, `[a, d]`.
fn expand_paths(text: &str) -> Vec<Vec<String>> {
    fn tree(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut rest = text.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut start = 0;
                for (at, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            tree(&group[start..at], &path, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            tree(&group[start..at], &path, out);
                            start = at + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let name: String = rest.chars().take_while(|&c| is_identifier(c)).collect();
            if name.is_empty() {
                break;
            }
            if name != "self" {
                path.push(name.clone());
            }
            rest = &rest[name.len()..];
            match rest.trim_start().strip_prefix("::") {
                Some(after) => rest = after.trim_start(),
                None => break,
            }
        }
        if path.len() > prefix.len() || !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    tree(text, &[], &mut out);
    out
}

/// What one file's code names: each `crate::` or `super::` path, made absolute (segments from
/// the crate root), given the file's own module path. Paths inside `pub use` re-exports are
/// left out, and so are those naming the file itself.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    // Inline modules open at these brace depths; `super::` in them goes up to the file first.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut in_reexport = false;
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let before_ok = i == 0 || !is_identifier(code[..i].chars().next_back().unwrap());
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            b';' => in_reexport = false,
            _ => {}
        }
        if before_ok && (rest.starts_with("pub use ") || rest.starts_with("pub(crate) use ")) {
            in_reexport = true;
        }
        if before_ok && rest.starts_with("mod ") {
            let after = rest[4..].trim_start();
            let name_len = after.chars().take_while(|&c| is_identifier(c)).count();
            if after[name_len..].trim_start().starts_with('{') {
                inline.push(depth);
            }
        }
        let mut ups: usize = 0;
        let mut at = rest;
        while before_ok && at.starts_with("super::") {
            ups += 1;
            at = &at["super::".len()..];
        }
        let start = if ups > 0 {
            // Each `super` leaves an inline module first, then the file's module.
            let file_ups = ups.saturating_sub(inline.len());
            (file_ups > 0).then(|| module[..module.len().saturating_sub(file_ups)].to_vec())
        } else if before_ok && rest.starts_with("crate::") {
            at = &rest["crate::".len()..];
            Some(Vec::new())
        } else {
            None
        };
        if let Some(base) = start {
            if !in_reexport {
                for path in expand_paths(at) {
                    found.push(base.iter().cloned().chain(path).collect());
                }
            }
            i += rest.len() - at.len();
            continue;
        }
        i += rest.chars().next().unwrap().len_utf8();
    }
    found
}

/// One compilation target's modules: module path -> file (relative to `src/`).
fn module_tree(src: &Path, root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut tree = BTreeMap::new();
    let mut pending = vec![(Vec::new(), root.to_path_buf())];
    while let Some((module, file)) = pending.pop() {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        // Children of `a/mod.rs`, `lib.rs` and `main.rs` are beside it; of `a.rs`, in `a/`.
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let directory = if module.is_empty() || stem == "mod" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        let mut depth = 0;
        for line in code.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "mod");
            if let (0, Some(at)) = (depth, at)
                && words[..at].iter().all(|w| w.starts_with("pub") || w.starts_with("#["))
                && let Some(name) = words.get(at + 1).and_then(|w| w.strip_suffix(';'))
            {
                let child =
                    [directory.join(format!("{name}.rs")), directory.join(name).join("mod.rs")]
                        .into_iter()
                        .find(|candidate| candidate.is_file())
                        .unwrap_or_else(|| panic!("{}: no file for `mod {name};`", file.display()));
                let mut path = module.clone();
                path.push(name.to_owned());
                pending.push((path, child));
            }
            depth += line.matches('{').count();
            depth -= line.matches('}').count().min(depth);
        }
        tree.insert(module, file.strip_prefix(src).unwrap().to_path_buf());
    }
    tree
}

/// The names the crate root re-exports, with the module path each comes from.
fn root_reexports(root_code: &str) -> BTreeMap<String, Vec<String>> {
    let mut names = BTreeMap::new();
    for statement in root_code.split(';') {
        let statement = statement.trim();
        let Some(rest) = statement.split("pub use ").nth(1) else { continue };
        let rest = rest.trim_start_matches("crate::").trim_start_matches("self::");
        for mut path in expand_paths(rest) {
            if let Some(name) = path.pop() {
                let name = name.split(" as ").last().unwrap_or(&name).to_owned();
                names.insert(name, path);
            }
        }
    }
    names
}

/// The crate's compilation targets under `src/`: the library and every binary.
fn target_roots(src: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).filter(|f| f.is_file()).collect();
    if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = entries
            .map(|entry| entry.unwrap().path())
            .map(|path| if path.is_dir() { path.join("main.rs") } else { path })
            .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "rs"))
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

/// One target's module graph: file -> files it imports (paths relative to `src/`).
fn target_graph(src: &Path, root: &Path) -> Graph {
    let tree = module_tree(src, root);
    let reexports = root_reexports(&code_only(&std::fs::read_to_string(root).unwrap()));
    let file_of = |path: &[String]| -> String {
        let mut path = path.to_vec();
        if let Some(first) = path.first()
            && !tree.contains_key(&path[..1])
            && let Some(source) = reexports.get(first)
        {
            path.splice(..1, source.iter().cloned());
        }
        let prefix = (0..=path.len()).rev().find(|&n| tree.contains_key(&path[..n])).unwrap();
        tree[&path[..prefix]].display().to_string()
    };
    let mut graph = Graph::new();
    for (module, file) in &tree {
        let code = code_only(&std::fs::read_to_string(src.join(file)).unwrap());
        let own = file.display().to_string();
        let imports = graph.entry(own.clone()).or_default();
        for path in named_paths(&code, module) {
            let target = file_of(&path);
            if target != own {
                imports.insert(target);
            }
        }
    }
    graph
}

/// The cycles of `graph`: one per strongly connected component of more than one module, as
/// the modules along it, the first repeated at the end.
fn find_cycles(graph: &Graph) -> Vec<Vec<String>> {
    // Components: the modules each reaches, intersected with those that reach it.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![from.to_owned()];
        while let Some(module) = pending.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    pending.push(next.clone());
                }
            }
        }
        seen
    };
    let mut cycles = Vec::new();
    let mut placed = BTreeSet::new();
    for module in graph.keys() {
        if placed.contains(module) || !reach(module).contains(module) {
            continue;
        }
        let component: BTreeSet<String> =
            reach(module).into_iter().filter(|other| reach(other).contains(module)).collect();
        placed.extend(component.iter().cloned());
        // The shortest way round from `module`, by breadth-first search inside the component.
        let mut previous: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([module.clone()]);
        'search: while let Some(at) = queue.pop_front() {
            for next in graph.get(&at).into_iter().flatten() {
                if !component.contains(next) || previous.contains_key(next) {
                    continue;
                }
                previous.insert(next.clone(), at.clone());
                if next == module {
                    break 'search;
                }
                queue.push_back(next.clone());
            }
        }
        let mut cycle = vec![module.clone()];
        let mut at = previous[module].clone();
        while at != *module {
            cycle.push(at.clone());
            at = previous[&at].clone();
        }
        cycle.push(module.clone());
        cycle.reverse();
        if component.len() + 1 > cycle.len() {
            let others: Vec<&String> = component.iter().filter(|m| !cycle.contains(m)).collect();
            cycle.push(format!("(and through {others:?})"));
        }
        cycles.push(cycle);
    }
    cycles
}

/// Every crate's targets with their module graphs: (`crate/src/root.rs`, graph).
fn workspace_graphs() -> Vec<(String, Graph)> {
    let mut graphs = Vec::new();
    for member in workspace_members() {
        let src = workspace_root().join(&member).join("src");
        let roots = target_roots(&src);
        assert!(!roots.is_empty(), "{member}: no lib.rs, main.rs or bin/ under src/");
        for root in roots {
            let target = format!("{member}/src/{}", root.strip_prefix(&src).unwrap().display());
            graphs.push((target, target_graph(&src, &root)));
        }
    }
    graphs
}

/// In every crate the modules depend on one another in layers: no module (a file) imports one
/// that imports it back, through `crate::` or `super::`. A cycle means the two files are one
/// module in two pieces, or that what both need belongs in a third, below both.
#[test]
fn no_crate_has_modules_that_import_one_another_in_a_cycle() {
    let graphs = workspace_graphs();
    let members = workspace_members();
    for member in &members {
        assert!(graphs.iter().any(|(t, _)| t.starts_with(&format!("{member}/"))), "{member}");
    }
    let engine = &graphs.iter().find(|(t, _)| t == "engine/src/lib.rs").unwrap().1;
    assert!(engine.len() > 40, "found only {} engine modules", engine.len());
    assert!(engine["engine/mod.rs"].contains("partition/mod.rs"), "imports missed: {engine:?}");
    assert!(engine["runtime.rs"].contains("engine/mod.rs"), "root re-exports are not followed");
    let mut report = Vec::new();
    for (target, graph) in &graphs {
        for cycle in find_cycles(graph) {
            report.push(format!("  {target}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        report.is_empty(),
        "modules that import one another (through `crate::` or `super::`), per crate target; \
         move what both need to a module below both, or merge them:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let engine = workspace_graphs().into_iter().find(|(t, _)| t == "engine/src/lib.rs").unwrap();
    let mut graph = engine.1;
    assert_eq!(find_cycles(&graph), Vec::<Vec<String>>::new());
    // The cycle this project had: recovery used the partition's context, and the partition
    // recovery.
    graph.get_mut("recovery.rs").unwrap().insert("partition/mod.rs".to_owned());
    let cycles = find_cycles(&graph);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains(&"recovery.rs".to_owned()));
    assert!(cycles[0].contains(&"partition/mod.rs".to_owned()));
    assert_eq!(cycles[0].first(), cycles[0].last());
}

#[test]
fn the_import_finder_reads_paths_groups_super_and_skips_the_rest() {
    let source = r#"
//! See `crate::doc_only`.
use crate::{a::{B, c::D}, e};
use super::sibling::X;
pub use crate::reexported::Y;
fn f() { let s = "crate::in_string"; crate::g::h(); }
mod tests {
    use super::*;
    use super::super::up;
}
"#;
    let module = ["m".to_owned(), "n".to_owned()];
    let mut found: Vec<String> =
        named_paths(&code_only(source), &module).iter().map(|p| p.join("::")).collect();
    found.sort();
    assert_eq!(found, ["a::B", "a::c::D", "e", "g::h", "m::sibling::X", "m::up"]);
}

// ---- File lengths ----

/// Most lines in a file of `sdk-rust/src` or `sim/src`: longer ones are read in pieces, not at
/// once. Test modules (files named `tests.rs`) may be longer.
const FILE_LINES_MAX: usize = 900;

/// The files over [`FILE_LINES_MAX`] lines under `crate/src`, as `(path, lines)`.
fn long_files(member: &str) -> Vec<(String, usize)> {
    let src = workspace_root().join(member).join("src");
    let files = rust_files(&src);
    assert!(!files.is_empty(), "no files under {}", src.display());
    files
        .into_iter()
        .filter(|file| file.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (file.strip_prefix(workspace_root()).unwrap().display().to_string(), lines)
        })
        .filter(|&(_, lines)| lines > FILE_LINES_MAX)
        .collect()
}

#[test]
fn no_source_file_of_the_sdk_or_the_simulator_is_too_long() {
    let report: Vec<String> = ["sdk-rust", "sim"]
        .iter()
        .flat_map(|member| long_files(member))
        .map(|(file, lines)| format!("  {file}: {lines} lines"))
        .collect();
    assert!(
        report.is_empty(),
        "files over {FILE_LINES_MAX} lines (split them by responsibility; only test modules \
         named tests.rs may be longer):\n{}",
        report.join("\n")
    );
}

/// The front-door documents stay a quick read: a reader finds the one thing they came for.
const DOCUMENT_BYTES_MAX: [(&str, u64); 2] =
    [("README.md", 12 * 1024), ("ARCHITECTURE.md", 15 * 1024)];

#[test]
fn the_readme_and_the_architecture_stay_short() {
    for (name, bytes_max) in DOCUMENT_BYTES_MAX {
        let bytes = std::fs::metadata(workspace_root().join(name)).unwrap().len();
        assert!(
            bytes <= bytes_max,
            "{name} is {bytes} bytes, over its {bytes_max}: move detail to docs/ instead"
        );
    }
}
