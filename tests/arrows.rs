//! Arrows point one way (DESIGN §1, docs/layout.md): the store names no layer above it; the engine names neither
//! the controller nor the agent; production code (the store, the engine, the controller, the agent, the leaf
//! modules and the binary's real-mode commands) names nothing of the experiment side (the simulator, `sim/`, and
//! `chaos`); and a leaf module (`src/*.rs`) names nothing of the crate. The experiment side uses production code,
//! never the other way round, so a production build could leave it out.
//!
//! Each rule scans the source files it covers for a path through a module it must not name (`crate::sim::…`,
//! `lockstep::chaos`, `use super::super::pipeline::…`, `gang::api` after a `use crate::{…`) and fails naming the
//! file, the line and the rule. Comments are not scanned: a doc link to a layer above (`[PipelineConfig]`) is
//! prose, not a dependency.

use std::path::{Path, PathBuf};

/// One rule: the files it covers and the modules they must not name.
struct Rule {
    /// What the rule says, for the failure message.
    says: &'static str,
    /// The files it covers.
    files: Vec<PathBuf>,
    /// Module names that no path in those files may go through.
    forbidden: &'static [&'static str],
}

/// The experiment side: the simulator (`sim/`, compiled in as `lockstep::sim`) and `lockstep chaos`.
const EXPERIMENT: &[&str] = &["sim", "chaos", "chaos_nodes"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` (relative to the repository), recursively, sorted.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    fn walk(path: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), &mut out);
    out.sort();
    assert!(!out.is_empty(), "{dir} holds no Rust file: the rule would check nothing");
    out
}

/// The crate's leaf modules: `src/*.rs` but the crate root.
fn leaves() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("src"))
        .expect("src/ is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs") && !path.ends_with("lib.rs"))
        .collect();
    out.sort();
    assert!(out.len() >= 5, "src/ holds fewer leaf modules than expected: {out:?}");
    out
}

/// The binary's real-mode commands (`serve`, `agent`, the clients and the flags they share); `real/chaos.rs` and
/// `real/chaos_nodes.rs` are the experiment side's commands.
fn real_mode() -> Vec<PathBuf> {
    ["mod.rs", "serve.rs", "agent.rs", "client.rs"]
        .iter()
        .map(|file| root().join("src/bin/lockstep/real").join(file))
        .collect()
}

fn rules() -> Vec<Rule> {
    let production: Vec<PathBuf> = ["src/store", "src/pipeline", "src/gang", "src/agent"]
        .iter()
        .flat_map(|dir| rust_files(dir))
        .chain(leaves())
        .collect();
    vec![
        Rule {
            says: "the store names no layer above it (the engine, the controller, the agent, the experiment side)",
            files: rust_files("src/store"),
            forbidden: &["pipeline", "gang", "agent", "sim", "chaos"],
        },
        Rule {
            says: "the engine names neither the controller nor the agent",
            files: rust_files("src/pipeline"),
            forbidden: &["gang", "agent"],
        },
        Rule {
            says: "production code names nothing of the experiment side (sim, chaos)",
            files: production,
            forbidden: EXPERIMENT,
        },
        Rule {
            // `real/mod.rs` registers the `chaos` command among the others (its module is a sibling), so only the
            // simulator is forbidden there; the commands themselves name neither.
            says: "the real-mode commands name nothing of the experiment side (sim, chaos)",
            files: real_mode().split_off(1),
            forbidden: EXPERIMENT,
        },
        Rule {
            says: "the real-mode commands' shared flags name nothing of the simulator",
            files: real_mode()[..1].to_vec(),
            forbidden: &["sim"],
        },
        Rule {
            says: "a leaf module (src/*.rs) names nothing of the crate",
            files: leaves(),
            forbidden: &["crate", "lockstep"],
        },
    ]
}

/// The code of `line`: empty for a comment line, cut before a trailing ` // ` comment.
fn code(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    line.find(" // ").map_or(line, |at| &line[..at])
}

/// Whether `word` starts at byte `at` of `text` as a whole identifier.
fn whole_word(text: &str, at: usize, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let before = text[..at].chars().next_back().is_none_or(|c| !ident(c));
    let after = text[at + word.len()..].chars().next().is_none_or(|c| !ident(c));
    before && after
}

/// The forbidden module `code` names as a path segment, if any: `name::…`, `crate::name`, `lockstep::name`,
/// `super::name`, or a name inside a `use …::{…}` group (`{name`, `, name`). `in_group`: the line continues a
/// `use` group that an earlier line opened.
fn named(code: &str, forbidden: &[&'static str], in_group: bool) -> Option<&'static str> {
    for &name in forbidden {
        for (at, _) in code.match_indices(name) {
            if !whole_word(code, at, name) {
                continue;
            }
            let before = code[..at].trim_end();
            let after = code[at + name.len()..].trim_start();
            let path_head = after.starts_with("::");
            let path_tail = ["crate::", "lockstep::", "super::", "self::"].iter().any(|head| before.ends_with(head));
            let grouped = (before.ends_with('{') || before.ends_with(',') || (in_group && before.is_empty()))
                && (in_group || code.contains("::{"));
            let used = code.trim_start().starts_with("use ") || code.trim_start().starts_with("pub use ");
            if path_head || path_tail || (grouped && (used || in_group)) {
                return Some(name);
            }
        }
    }
    None
}

/// Every line of `text` (a file called `path`) that names a module of `forbidden`: `path:line: the line`.
fn violations(path: &str, text: &str, forbidden: &[&'static str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_group = false;
    for (index, line) in text.lines().enumerate() {
        let code = code(line);
        if let Some(name) = named(code, forbidden, in_group) {
            found.push(format!("{path}:{}: names `{name}`: {}", index + 1, line.trim()));
        }
        let opens =
            (code.trim_start().starts_with("use ") || code.trim_start().starts_with("pub use ")) && code.contains('{');
        if opens && !code.contains(';') {
            in_group = true;
        } else if in_group && code.contains(';') {
            in_group = false;
        }
    }
    found
}

#[test]
fn arrows_point_one_way() {
    let mut broken = Vec::new();
    for rule in rules() {
        for file in &rule.files {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            let shown = file.strip_prefix(root()).unwrap_or(file).display().to_string();
            for violation in violations(&shown, &text, rule.forbidden) {
                broken.push(format!("{violation}\n    rule: {}", rule.says));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "arrows point one way (docs/layout.md): move what both sides need to a leaf module (src/*.rs), or let the \
         layer above pass it in:\n{}",
        broken.join("\n")
    );
}

/// The scan bites: each way of naming a forbidden module is found, with its line; comments, longer names and
/// other modules are not.
#[test]
fn the_scan_finds_each_way_of_naming_a_module() {
    let text = "\
use crate::sim::summary::count;
use lockstep::sim;
use crate::{duration, sim::files};
use crate::{
    duration,
    sim,
};
let n = sim::summary::count(1u64, \"row\");
use super::super::pipeline::PipelineConfig;
/// A doc link to [`crate::sim::user`] is prose.
// sim::files in a comment
let s = madsim::buggify::enable(); // sim::x
let simulate = 1;
use crate::store::Store;
";
    let found = violations("x.rs", text, &["sim", "pipeline"]);
    let lines: Vec<&str> = found.iter().map(|v| v.split(": names").next().unwrap()).collect();
    assert_eq!(lines, ["x.rs:1", "x.rs:2", "x.rs:3", "x.rs:6", "x.rs:8", "x.rs:9"], "{found:#?}");
    assert!(found[0].contains("names `sim`: use crate::sim::summary::count;"), "{}", found[0]);
    let leaf = violations("leaf.rs", "use crate::duration;\n    use super::*;\n", &["crate", "lockstep"]);
    assert_eq!(leaf.len(), 1, "{leaf:?}");
}

/// Every file and helper folder under `tests/` is a module of the one test binary, `tests/all.rs` (Cargo.toml sets
/// `autotests = false`): a file left out of it would compile into nothing, and its tests would never run. And every
/// module it declares is there.
#[test]
fn every_test_file_is_a_module_of_the_one_binary() {
    let tests = root().join("tests");
    let all = std::fs::read_to_string(tests.join("all.rs")).expect("tests/all.rs is readable");
    let declared: std::collections::BTreeSet<&str> =
        all.lines().filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';')).collect();
    let mut present = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&tests).expect("tests/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).expect("a UTF-8 name").to_owned();
        if path.is_dir() && path.join("mod.rs").is_file() {
            present.insert(name);
        } else if let Some(module) = name.strip_suffix(".rs").filter(|module| *module != "all") {
            present.insert(module.to_owned());
        }
    }
    assert!(present.len() >= 40, "tests/ holds {} modules, fewer than expected: {present:?}", present.len());
    let missing: Vec<&String> = present.iter().filter(|module| !declared.contains(module.as_str())).collect();
    assert!(missing.is_empty(), "tests/all.rs does not declare these test modules, so they never run: {missing:?}");
    let absent: Vec<&&str> = declared.iter().filter(|module| !present.contains(**module)).collect();
    assert!(absent.is_empty(), "tests/all.rs declares modules that have no file: {absent:?}");
}
