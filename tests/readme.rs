//! The README and the pages under `docs/` stay true:
//! - their examples are the code and files they name (`examples/quickstart.rs` and the user-pipelines test whole,
//!   the lines they quote of the enqueue example and the user-pipelines production binary, the annotated scenario
//!   files parse, the fault table lists every fault kind, the spec and its error);
//! - their shell blocks name commands, tests, examples, benches and files that exist (`real_e2e.rs` runs the real
//!   mode walk-through's `lockstep` commands with `--help`);
//! - every sample output they show is what its command prints today: each `text` block that follows a shell block
//!   is compared with the real output of that block's command (normalised only where it truly varies: wall times,
//!   build ids), and every other `text` block is listed here as not being an output;
//! - every relative link resolves to a file, and every `#anchor` to a heading of its page;
//! - every "DESIGN §N" citation names a section of docs/design.md, and nothing cites a tracker issue by number.
//!
//! Some checks need the simulator build (`env -u RUSTFLAGS cargo sim-test --test all readme::`), the others the
//! normal build (`cargo test --test all readme::`); `scripts/test` runs both.

use crate::support;

use support::command::{cargo_command, clean_command};
use support::scratch::Scratch;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

mod markdown {
    //! Just enough Markdown for the checks: pages, fenced blocks, sections by heading, links and anchors.
    use std::collections::BTreeSet;
    use std::path::Path;

    /// A page: its path relative to the repository (`README.md`, `docs/engine.md`) and its text.
    pub struct Page {
        pub path: String,
        pub text: String,
    }

    /// One fenced block: its info string (`bash`, `text`, `toml`) and its body.
    #[derive(Clone, Copy, Debug)]
    pub struct Block<'a> {
        pub info: &'a str,
        pub body: &'a str,
        /// Whether only blank lines separate it from the block before it.
        pub follows_block: bool,
    }

    pub fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    /// The README and every page under `docs/`, in path order.
    pub fn pages() -> Vec<Page> {
        let mut paths = vec!["README.md".to_string()];
        let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
            .expect("docs/")
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".md"))
            .map(|name| format!("docs/{name}"))
            .collect();
        docs.sort();
        paths.extend(docs);
        paths.into_iter().map(|path| page(&path)).collect()
    }

    pub fn page(path: &str) -> Page {
        let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"));
        Page { path: path.to_string(), text }
    }

    impl Page {
        /// The part of the page under `heading` (a whole line, such as `## Placement`), up to the next heading of
        /// the same or a higher level.
        pub fn section(&self, heading: &str) -> &str {
            let level = heading.chars().take_while(|c| *c == '#').count();
            let lines = prose_lines(&self.text);
            let (start, _) = lines
                .iter()
                .find(|(_, line)| *line == heading)
                .unwrap_or_else(|| panic!("{} has no heading {heading:?}", self.path));
            let end = lines
                .iter()
                .filter(|(at, _)| at > start)
                .find(|(_, line)| {
                    let hashes = line.chars().take_while(|c| *c == '#').count();
                    hashes > 0 && hashes <= level && line[hashes..].starts_with(' ')
                })
                .map_or(self.text.len(), |(at, _)| *at);
            &self.text[*start..end]
        }

        /// The anchors of the page's headings, as GitHub makes them.
        pub fn anchors(&self) -> BTreeSet<String> {
            let mut anchors = BTreeSet::new();
            for (_, line) in prose_lines(&self.text) {
                let hashes = line.chars().take_while(|c| *c == '#').count();
                if hashes == 0 || !line[hashes..].starts_with(' ') {
                    continue;
                }
                let base = slug(&line[hashes + 1..]);
                let mut anchor = base.clone();
                let mut n = 0;
                while !anchors.insert(anchor.clone()) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
            }
            anchors
        }

        /// The targets of the page's links and images (`[text](target)`), outside code.
        pub fn links(&self) -> Vec<String> {
            let mut links = Vec::new();
            for (_, line) in prose_lines(&self.text) {
                let line = without_code_spans(line);
                let mut rest = line.as_str();
                while let Some(at) = rest.find("](") {
                    let after = &rest[at + 2..];
                    let end = after.find(')').unwrap_or(after.len());
                    links.push(after[..end].to_string());
                    rest = &after[end..];
                }
            }
            links
        }
    }

    /// GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces as hyphens.
    pub fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect()
    }

    /// The lines outside fenced blocks, each with its byte offset.
    fn prose_lines(text: &str) -> Vec<(usize, &str)> {
        let mut lines = Vec::new();
        let mut in_block = false;
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            let trimmed = line.trim_end_matches('\n');
            if trimmed.starts_with("```") {
                in_block = !in_block;
            } else if !in_block {
                lines.push((at, trimmed));
            }
            at += line.len();
        }
        lines
    }

    fn without_code_spans(line: &str) -> String {
        line.split('`').step_by(2).collect::<Vec<_>>().join("")
    }

    /// The fenced blocks of `text`, in order.
    pub fn blocks(text: &str) -> Vec<Block<'_>> {
        let mut blocks = Vec::new();
        let mut open: Option<(&str, usize, bool)> = None;
        let mut at = 0;
        let mut last_end: Option<usize> = None;
        for line in text.split_inclusive('\n') {
            let trimmed = line.trim_end_matches('\n');
            match (open, trimmed.strip_prefix("```")) {
                (None, Some(info)) => {
                    let follows = last_end.is_some_and(|end| text[end..at].trim().is_empty());
                    open = Some((info, at + line.len(), follows));
                }
                (Some((info, start, follows_block)), Some("")) => {
                    blocks.push(Block { info, body: &text[start..at], follows_block });
                    open = None;
                    last_end = Some(at + line.len());
                }
                _ => {}
            }
            at += line.len();
        }
        assert!(open.is_none(), "a fenced block is not closed");
        blocks
    }

    /// The bodies of the blocks of `text` with info string `info`.
    pub fn bodies<'a>(text: &'a str, info: &str) -> Vec<&'a str> {
        blocks(text).into_iter().filter(|block| block.info == info).map(|block| block.body).collect()
    }

    /// The commands of a shell block: its lines without comments, a `\` continuation joined.
    pub fn commands(body: &str) -> Vec<String> {
        let mut commands = Vec::new();
        let mut pending = String::new();
        for line in body.lines() {
            let line = line.split(" #").next().unwrap().trim();
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                continue;
            }
            pending.push_str(line);
            commands.push(std::mem::take(&mut pending));
        }
        commands
    }
}

use markdown::{Page, blocks, bodies, commands, page, pages, root};

// ---------------------------------------------------------------------------------------------------------------
// The examples are the code and files they name.

#[test]
fn the_engine_page_shows_the_quickstart_example_verbatim() {
    let engine = page("docs/engine.md");
    let example = include_str!("../examples/quickstart.rs");
    assert!(engine.text.contains(example), "docs/engine.md must include examples/quickstart.rs verbatim");
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = page("README.md");
    let ci = include_str!("../.ci/run");
    assert!(
        readme.text.contains("```bash\nscripts/test\n```"),
        "README.md must show `scripts/test` as the test command"
    );
    assert!(ci.lines().any(|line| line.trim() == "exec scripts/test"), ".ci/run must exec scripts/test");
}

#[test]
fn the_readme_shows_the_main_job_on_the_simulator_and_links_every_docs_page() {
    let readme = page("README.md");
    let quick_start = readme.section("## Quick start");
    let commands: Vec<String> = bodies(quick_start, "bash").into_iter().flat_map(commands).collect();
    assert_eq!(commands, ["env -u RUSTFLAGS cargo sim run scenarios/gang-seed-example.toml", "scripts/test"]);
    assert!(readme.text.contains("](docs/timeline.png)"), "the README shows the timeline's picture");
    let linked: BTreeSet<String> =
        readme.links().into_iter().map(|link| link.split('#').next().unwrap().into()).collect();
    for docs_page in pages().into_iter().filter(|page| page.path.starts_with("docs/")) {
        assert!(linked.contains(&docs_page.path), "README.md links no {}", docs_page.path);
    }
}

#[test]
fn the_gang_page_spec_parses_and_its_error_example_is_the_validators() {
    use lockstep::gang::{OperationSpec, SpecFormat};
    let gang = page("docs/gang.md");
    let section = gang.section("## Specs");
    let text = bodies(section, "text")[0];
    let spec = OperationSpec::parse(text.trim(), SpecFormat::Yson).expect("the page's spec parses");
    assert!(spec.is_gang());
    assert_eq!(spec.gang_size(), 3);

    let broken = text.replace("size=3", "size=9").replace("job_count=3", "job_count=8");
    let error = OperationSpec::parse(broken.trim(), SpecFormat::Yson).unwrap_err().to_string();
    let quoted = "`tasks.trainer.gang_options.size: 9 exceeds job_count 8`";
    assert!(section.contains(quoted), "docs/gang.md quotes the error");
    assert!(error.contains(quoted.trim_matches('`')), "{error}");
}

/// The gang page's unknown-key warning is what `lockstep submit` prints for that spec (before it connects: the
/// database named here does not exist).
#[cfg(not(madsim))]
#[test]
fn the_gang_page_quotes_submits_warning_for_an_unknown_key() {
    let gang = page("docs/gang.md");
    let section = gang.section("## Specs");
    let start = section.find("(`warning: ").expect("the page quotes the warning") + 2;
    let quoted = &section[start..start + section[start..].find('`').unwrap()];
    let quoted = quoted.split_whitespace().collect::<Vec<_>>().join(" ");
    let dir = sandbox("spec-warning");
    std::fs::write(dir.join("t.yson"), "{tasks={t={job_count=1; command=\"true\"; gang_option={size=1}}}}").unwrap();
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["submit", "t.yson", "--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().next(), Some(quoted.as_str()), "{stderr}");
}

/// The gang page's unfit-gang message is the controller's reason, durations as people read them.
#[test]
fn the_gang_page_quotes_the_unfit_reason() {
    use lockstep::gang::placement::{Unfit, unfit_reason};
    use std::time::Duration;
    let gang = page("docs/gang.md");
    let section = gang.section("## Placement").split_whitespace().collect::<Vec<_>>().join(" ");
    let start = section.find("`gang_placement all_or_nothing: ").expect("the page quotes the unfit reason") + 1;
    let quoted = &section[start..start + section[start..].find('`').unwrap()];
    let (sixty, grace) = (Duration::from_secs(60), Duration::from_secs(300));
    let unfit = Unfit { index: 0, need: 4, live: 3, returning: 0, waited: sixty, timeout: sixty, grace };
    assert_eq!(quoted, unfit_reason(unfit));
    // A wait measured on the store's clock reads to the millisecond, not as Debug's nanoseconds.
    let waited = unfit_reason(Unfit { waited: Duration::from_nanos(61_234_567_891), returning: 1, ..unfit });
    assert!(waited.contains("expected back, offer 1 more) for 61.234s (gang_unfit_timeout 60s)"), "{waited}");
}

/// The real-mode page's enqueue snippet is the example's code: each of its lines is a line of
/// `examples/enqueue_in_transaction.rs` (indentation aside), in the example's order.
#[test]
fn the_real_mode_page_quotes_the_enqueue_example() {
    let real = page("docs/real-mode.md");
    let section = real.section("## Enqueue in your own transaction");
    let snippets = bodies(section, "rust");
    assert_eq!(snippets.len(), 1, "one rust block in the enqueue section");
    let example = include_str!("../examples/enqueue_in_transaction.rs");
    let mut lines = example.lines().map(str::trim);
    for line in snippets[0].lines().map(str::trim).filter(|line| !line.is_empty()) {
        assert!(lines.any(|own| own == line), "examples/enqueue_in_transaction.rs has no line {line:?} (in order)");
    }
}

/// The user-pipelines page's pool snippet is the production binary's code: each of its lines is a line of
/// `examples/user-pipelines/src/bin/orders.rs` (indentation aside), in the binary's order.
#[test]
fn the_user_pipelines_page_quotes_the_production_binary() {
    let user = page("docs/user-pipelines.md");
    let section = user.section("## Run them on PostgreSQL");
    let snippets = bodies(section, "rust,ignore");
    assert_eq!(snippets.len(), 1, "one rust block in the PostgreSQL section");
    let binary = include_str!("../examples/user-pipelines/src/bin/orders.rs");
    let mut lines = binary.lines().map(str::trim);
    for line in snippets[0].lines().map(str::trim).filter(|line| !line.is_empty()) {
        assert!(lines.any(|own| own == line), "src/bin/orders.rs has no line {line:?} (in order)");
    }
}

/// The real-mode page's claim about `--help`: clap names the unset variable as `[env: LOCKSTEP_SCHEMA=]`.
#[cfg(not(madsim))]
#[test]
fn the_real_mode_page_quotes_the_help_of_schema() {
    let real = page("docs/real-mode.md");
    assert!(real.text.contains("`--help` shows `[env: LOCKSTEP_SCHEMA=]`"), "the page quotes the help");
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["migrate", "--help"])
        .env_remove("LOCKSTEP_SCHEMA")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("[env: LOCKSTEP_SCHEMA=]"), "{help}");
}

/// The scenario page's annotated scenario file parses, and its fault table covers every fault kind.
#[cfg(madsim)]
#[test]
fn the_scenario_page_example_parses_and_its_table_lists_every_fault_kind() {
    use lockstep::sim::{FaultKind, ScenarioFile};
    let scenarios = page("docs/scenarios.md");
    let example = bodies(scenarios.section("## A row scenario, annotated"), "toml")[0];
    let file = ScenarioFile::parse(example, "docs/scenarios.md").unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(file.scenario.name, "example");
    assert_eq!(file.scenario.faults.fixed.len(), 2);
    assert_eq!(file.scenario.faults.random.len(), 2);
    let table = scenarios.section("## Fault kinds");
    for kind in FaultKind::ALL {
        let row = format!("| `{}` |", kind.name());
        assert!(table.contains(&row), "the fault table has no row {row}");
    }
}

/// The swarm section's ranges file is the default ranges, key for key (so the page shows what a swarm draws from).
#[test]
fn the_swarm_ranges_example_is_the_default_ranges() {
    use lockstep::sim::swarm::Ranges;
    let simulator = page("docs/simulator.md");
    let blocks = bodies(simulator.section("## Swarm: every seed draws its own world"), "toml");
    assert_eq!(blocks.len(), 1, "one ranges file");
    let ranges = Ranges::parse(blocks[0], "docs/simulator.md").unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(ranges, Ranges::default());
}

/// The scenario page's annotated gang scenario parses (its spec file read from `scenarios/`) and sets every gang
/// key.
#[cfg(madsim)]
#[test]
fn the_scenario_page_gang_example_parses_with_every_gang_key() {
    use lockstep::sim::scenario_file::gang::SpecSource;
    use lockstep::sim::{Fault, FaultKind, ScenarioFile, Target};
    let scenarios = page("docs/scenarios.md");
    let section = scenarios.section("## Gang scenarios");
    let blocks = bodies(section, "toml");
    assert_eq!(blocks.len(), 1, "one gang example");
    let dir = root().join("scenarios");
    let file = ScenarioFile::parse_with(blocks[0], "docs/scenarios.md", SpecSource::Dir(&dir))
        .unwrap_or_else(|e| panic!("{e}"));
    let scenario = &file.scenario;
    let gang = scenario.gang.as_ref().expect("a gang part");
    assert_eq!((gang.agents, gang.slots, gang.controller.workers), (3, 1, 4));
    assert_eq!(gang.operations[0].spec, include_str!("../scenarios/specs/seed-gang.yson"));
    assert_eq!(gang.jobs.rules.len(), 1);
    assert_eq!(gang.controls.len(), 1);
    assert_eq!(scenario.workload.rows_max, 0, "no [workload]: no rows");
    assert!(matches!(scenario.faults.fixed[0].fault, Fault::AgentKill { agent: 1, .. }));
    assert!(matches!(scenario.faults.fixed[1].fault, Fault::Partition { a: Target::Agent(2), b: Target::Db, .. }));
    assert_eq!(scenario.faults.random[0].kind, FaultKind::AgentPartition);
    assert_eq!(scenario.expect.operations.len(), 1);
    assert_eq!(scenario.expect.trace[0].contains, ["killed="]);
    for kind in FaultKind::ALL.into_iter().filter(|kind| kind.targets_agents()) {
        assert!(section.contains(kind.name()), "the gang example never names {}", kind.name());
    }
}

/// The quick start's sample is also the pinned summary of `scenarios/gang-seed-example.toml` (seed 1), which
/// `tests/sim_scenarios.rs` checks on every run.
#[test]
fn readme_quick_start_scenario_output_is_the_pinned_summary() {
    let readme = page("README.md");
    let snapshot = include_str!("snapshots/all__sim_scenarios__gang-seed-example.snap");
    let summary = &snapshot[snapshot.find("scenario gang-seed-example seed 1").expect("the snapshot's summary")..];
    assert!(
        readme.text.contains(summary.trim_end()),
        "README's quick start output differs from the snapshot:\n{summary}"
    );
}

/// "Test your own pipelines" shows the example crate's simulator tests whole, and its scenario-file commands name
/// files the example has.
#[test]
fn the_user_pipelines_page_shows_the_examples_test_whole() {
    let user = page("docs/user-pipelines.md");
    let test = include_str!("../examples/user-pipelines/tests/sim.rs");
    assert!(user.text.contains(test), "docs/user-pipelines.md must include examples/user-pipelines/tests/sim.rs");
    for scenario in ["orders-mixed.toml", "orders-without-keys.toml"] {
        let path = root().join("examples/user-pipelines/scenarios");
        assert!(path.join(scenario).is_file(), "the page runs {scenario}, which the example lacks");
        assert!(user.text.contains(&format!("scenarios/{scenario}")));
    }
}

/// The quick start's first output line names the scenario's current version label (it changes when the scenario
/// model does), so the README's sample is this build's, not an older one's.
#[cfg(madsim)]
#[test]
fn readme_quick_start_names_the_scenarios_current_version() {
    use lockstep::sim::ScenarioFile;
    let readme = page("README.md");
    let path = root().join("scenarios/gang-seed-example.toml");
    let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
    let line = format!("scenarios/gang-seed-example.toml ({}), seed 1, build ", file.version_label());
    assert!(readme.text.contains(&line), "README's quick start output should begin with {line:?}");
}

/// The replay command the user-pipelines page shows is the one a failing seed prints (`Replay::command`), with
/// its placeholders.
#[cfg(madsim)]
#[test]
fn the_user_pipelines_page_shows_the_replay_command_a_failing_seed_prints() {
    use lockstep::sim::user::Replay;
    let user = page("docs/user-pipelines.md");
    let text = user.text.split_whitespace().collect::<Vec<_>>().join(" ");
    let printed = Replay { package: "PACKAGE", test: "FILE", name: "TEST" }.command(17).replace("=17 ", "=S ");
    assert!(text.contains(&format!("`{printed}`")), "docs/user-pipelines.md should show `{printed}`");
}

// ---------------------------------------------------------------------------------------------------------------
// Links.

#[test]
fn every_relative_link_resolves_to_a_file_and_every_anchor_to_a_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let dir = Path::new(&page.path).parent().unwrap_or(Path::new("")).to_path_buf();
        for link in page.links() {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() { PathBuf::from(&page.path) } else { normalize(&dir.join(path)) };
            if !root().join(&target).exists() {
                broken.push(format!("{}: {link}: no file {}", page.path, target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let target_page = markdown::page(&target.to_string_lossy());
            if !target_page.anchors().contains(anchor) {
                broken.push(format!("{}: {link}: no heading with anchor #{anchor} in {}", page.path, target.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(markdown::slug("The `lockstep sim` commands"), "the-lockstep-sim-commands");
    assert_eq!(markdown::slug("Replaying and explaining a failure"), "replaying-and-explaining-a-failure");
    assert_eq!(markdown::slug("PgStore"), "pgstore");
}

/// `a/../b` as `b` (the path stays relative to the repository).
fn normalize(path: &Path) -> PathBuf {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str()),
        }
    }
    parts.iter().collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Shell blocks name what exists.

/// Every `cargo` command of every shell block names tests, examples, benches and packages that exist, and every
/// repository path it names (`scenarios/…`, `tests/…`, `examples/…`, `scripts/…`) exists (for the example
/// project's commands, in that project).
#[test]
fn every_shell_block_names_tests_examples_benches_and_files_that_exist() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for body in bodies(&page.text, "bash") {
            for command in commands(body) {
                checked += 1;
                let words: Vec<&str> = command.split_whitespace().collect();
                let cargo = words.contains(&"cargo");
                let package = words.windows(2).find(|w| w[0] == "-p").map(|w| w[1]);
                let crate_dir = match package {
                    Some("user-pipelines") => root().join("examples/user-pipelines"),
                    Some(other) if cargo => {
                        missing.push(format!("{}: `{command}`: no package {other}", page.path));
                        continue;
                    }
                    _ => root().to_path_buf(),
                };
                for pair in words.windows(2) {
                    let file = match pair[0] {
                        "--test" => format!("tests/{}.rs", pair[1]),
                        "--example" => format!("examples/{}.rs", pair[1]),
                        "--bench" => format!("benches/{}.rs", pair[1]),
                        _ => continue,
                    };
                    if !crate_dir.join(&file).is_file() {
                        missing.push(format!("{}: `{command}`: no {file}", page.path));
                    }
                }
                let user_project = command.contains("orders") || page.path == "docs/user-pipelines.md";
                for word in &words {
                    let word = word.trim_matches(|c| c == '"' || c == '\'' || c == ')' || c == '(');
                    let named = ["scenarios/", "tests/", "examples/", "scripts/", "docs/"];
                    if !named.iter().any(|prefix| word.starts_with(prefix)) || word.contains("..") {
                        continue;
                    }
                    let found = root().join(word).exists()
                        || (user_project && root().join("examples/user-pipelines").join(word).exists());
                    if !found {
                        missing.push(format!("{}: `{command}`: no file {word}", page.path));
                    }
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} commands found: is the block parser broken?");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Every `cargo sim …` synopsis line's subcommand and flags are the binary's (`--help` lists them).
#[cfg(madsim)]
#[test]
fn the_sim_synopsis_names_subcommands_and_flags_the_binary_has() {
    let simulator = page("docs/simulator.md");
    let synopsis = bodies(simulator.section("## The `lockstep sim` commands"), "bash")[0];
    let mut subcommands = BTreeSet::new();
    for command in commands(synopsis) {
        let args = command.strip_prefix("cargo sim ").unwrap_or_else(|| panic!("not a `cargo sim` line: {command}"));
        let subcommand = args.split_whitespace().next().unwrap();
        let output =
            clean_command(env!("CARGO_BIN_EXE_lockstep")).args(["sim", subcommand, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "`lockstep sim {subcommand} --help` failed");
        for flag in args.split(|c: char| c.is_whitespace() || c == '[' || c == ']').filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "`lockstep sim {subcommand}` has no {flag}:\n{help}");
        }
        subcommands.insert(subcommand.to_string());
    }
    // Every subcommand `lockstep sim --help` lists (but `help`) has its synopsis line.
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep")).args(["sim", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    let listed: BTreeSet<String> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect();
    assert!(listed.len() >= 5, "no subcommands read from `lockstep sim --help`:\n{help}");
    assert_eq!(subcommands, listed);
}

// ---------------------------------------------------------------------------------------------------------------
// Sample outputs.

/// What a `text` block of a page is.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Sample {
    /// The output of the shell block right before it, compared by [`walk`] in this build.
    Output(Build),
    /// Text that is not a program's output (a spec, the source tree), or one that needs PostgreSQL and timing to
    /// make (a chaos run's summary; `tests/chaos.rs` checks its lines).
    NotOutput,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Build {
    Normal,
    Sim,
}

const THIS_BUILD: Build = if cfg!(madsim) { Build::Sim } else { Build::Normal };

/// Every "DESIGN §N" citation in the repository's code, scripts and pages names a section `## N.` of
/// docs/design.md, the design that stands in the repository.
#[test]
fn every_design_citation_names_a_section_of_the_design_page() {
    let design = page("docs/design.md");
    let sections: BTreeSet<String> = design
        .text
        .lines()
        .filter_map(|line| line.strip_prefix("## "))
        .filter_map(|heading| heading.split_once(". ").map(|(number, _)| number.to_string()))
        .collect();
    assert!(sections.len() >= 6, "docs/design.md has sections {sections:?}");
    let mut cited = 0;
    let mut files = Vec::new();
    for dir in ["src", "sim", "tests", "docs", "scripts", "benches", "examples", ".cargo"] {
        collect_files(&markdown::root().join(dir), &mut files);
    }
    files.push(markdown::root().join("README.md"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (at, _) in text.match_indices("DESIGN §") {
            let number: String = text[at + "DESIGN §".len()..].chars().take_while(char::is_ascii_digit).collect();
            if number.is_empty() {
                continue; // the page's own explanation, "DESIGN §N"
            }
            assert!(sections.contains(&number), "{}: DESIGN §{number} is no section of docs/design.md", file.display());
            cited += 1;
        }
    }
    assert!(cited >= 100, "only {cited} citations found: the walk missed the code");
}

/// History belongs in git, not in the tree: no comment, script, scenario file or page cites a tracker issue by its
/// number ("issue N", "issue #N", or the number on the comment's next line), which no reader of the repository can
/// open. The pinned snapshots are records, not references, and are left as they are; the record of benchmark rounds
/// (docs/benchmarks-history.md) names each round's goal, not its issue.
#[test]
fn no_comment_or_page_cites_an_issue_by_number() {
    let mut files = Vec::new();
    for dir in ["src", "sim", "tests", "docs", "scripts", "benches", "examples", "scenarios", ".cargo", ".ci"] {
        collect_files(&markdown::root().join(dir), &mut files);
    }
    files.push(markdown::root().join("README.md"));
    let mut cited = Vec::new();
    for file in files.iter().filter(|file| !file.components().any(|part| part.as_os_str() == "snapshots")) {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for at in issue_citations(&text) {
            let line = text[..at].matches('\n').count();
            cited.push(format!("{}:{}: {}", file.display(), line + 1, text.lines().nth(line).unwrap_or("").trim()));
        }
    }
    assert!(files.len() > 100, "the walk found only {} files", files.len());
    assert!(cited.is_empty(), "issues cited by number:\n{}", cited.join("\n"));
}

/// The byte offsets of the words "issue" and "issues" in `text` that a number follows: after spaces, a `#`, or a
/// line break and the next line's comment marker (`#`, `//`, `///`, `//!`, `*`, `>`).
fn issue_citations(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for word in ["issue", "issues"] {
        for (at, _) in text.match_indices(word) {
            let starts_word = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
            let rest = &text[at + word.len()..];
            let after = rest.trim_start_matches([' ', '\t', '\n', '\r', '#', '/', '!', '*', '>']);
            let gap = &rest[..rest.len() - after.len()];
            if starts_word && !gap.is_empty() && after.starts_with(|c: char| c.is_ascii_digit()) {
                out.push(at);
            }
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn an_issue_number_is_found_in_each_form_and_other_numbers_are_not() {
    // Written with the word apart, or this file would cite what it tests.
    let (one, many) = (["iss", "ue"].concat(), ["iss", "ues"].concat());
    let cited = [
        format!("{one} 39"),
        format!("see {one} #39."),
        format!("the queue of {one}\n# 39 is"),
        format!("of {many}\n/// 12 and"),
        format!("{one}\n//! 4"),
    ];
    for cited in &cited {
        assert_eq!(issue_citations(cited).len(), 1, "{cited:?}");
    }
    let plain = [
        format!("an {one} (2 cases)"),
        format!("{one}39"),
        format!("t{one} 3"),
        format!("the {one}: 3 rows"),
        format!("{many}, 4 of them"),
        format!("{one} launchbadge/sqlx#2016"),
    ];
    for plain in &plain {
        assert_eq!(issue_citations(plain), Vec::<usize>::new(), "{plain:?}");
    }
}

/// Every file under `dir`, recursively, except build output.
fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !path.ends_with("target") {
                collect_files(&path, files);
            }
        } else {
            files.push(path);
        }
    }
}

/// Every `text` block of the README and `docs/`, by page and first line (a prefix of it).
const TEXT_BLOCKS: &[(&str, &str, Sample)] = &[
    ("README.md", "scenarios/gang-seed-example.toml (", Sample::Output(Build::Sim)),
    ("docs/chaos.md", "pauses inside a pass: ", Sample::NotOutput),
    ("docs/chaos.md", "tests/fixtures/chaos-rows-kill-pause.toml (chaos, real PostgreSQL)", Sample::NotOutput),
    ("docs/design.md", "            ┌", Sample::NotOutput),
    ("docs/engine.md", "processed 200 images in 0.53 s", Sample::Output(Build::Normal)),
    ("docs/engine.md", "processed 200 images in 0.51 s", Sample::Output(Build::Sim)),
    ("docs/gang.md", "{tasks={trainer=", Sample::NotOutput),
    ("docs/layout.md", "src/store/", Sample::NotOutput),
    // `lockstep list`'s table needs PostgreSQL; `gang::listing`'s unit test renders it from the page.
    ("docs/real-mode.md", "operation  state", Sample::NotOutput),
    // `serve --retain`'s refusal; `serve`'s unit test `retain_rules_reach_the_replica_…` finds it on the page.
    ("docs/real-mode.md", "error: invalid value 'allocation:free:24h'", Sample::NotOutput),
    ("docs/scenarios.md", "lockstep sim: x.toml:", Sample::Output(Build::Sim)),
    ("docs/scenarios.md", "lockstep sim: y.toml:", Sample::Output(Build::Sim)),
    ("docs/simulator.md", "tests/fixtures/timeline-planted.toml (", Sample::Output(Build::Sim)),
    ("docs/simulator.md", "lockstep-replays/timeline-planted-seed-1.replay.json: ", Sample::Output(Build::Sim)),
    ("docs/simulator.md", "operation 8: ", Sample::Output(Build::Sim)),
];

/// Which [`TEXT_BLOCKS`] entry a block is: the longest first-line prefix that matches.
fn sample_of(page: &str, body: &str) -> Option<(&'static str, Sample)> {
    let first = body.lines().next().unwrap_or("");
    TEXT_BLOCKS
        .iter()
        .filter(|(path, prefix, _)| *path == page && first.starts_with(prefix))
        .max_by_key(|(_, prefix, _)| prefix.len())
        .map(|(_, prefix, sample)| (*prefix, *sample))
}

/// Every `text` block is listed, every listed block exists, and every output follows a shell block.
#[test]
fn every_text_block_is_a_checked_output_or_listed_as_none() {
    let mut seen = BTreeSet::new();
    for page in pages() {
        for block in blocks(&page.text).into_iter().filter(|block| block.info == "text") {
            let (prefix, sample) = sample_of(&page.path, block.body)
                .unwrap_or_else(|| panic!("{}: a text block nobody checks:\n{}", page.path, block.body));
            if let Sample::Output(_) = sample {
                assert!(block.follows_block, "{}: the output {prefix:?} does not follow its command", page.path);
            }
            seen.insert((page.path.clone(), prefix));
        }
    }
    for (path, prefix, _) in TEXT_BLOCKS {
        assert!(seen.contains(&(path.to_string(), *prefix)), "{path} has no text block {prefix:?}");
    }
}

/// The pages' walk-throughs, run in order in a fresh directory each: a shell block's commands run (those of the
/// other build are skipped), a `toml` block whose first line is `# file: NAME` is written to NAME, and a `text`
/// block right after a shell block is compared with its last command's output.
const WALKS: &[(&str, &str)] = &[
    ("README.md", "## Quick start"),
    ("docs/engine.md", "## Running it"),
    ("docs/simulator.md", "## Replaying and explaining a failure"),
    ("docs/scenarios.md", "## Errors"),
];

#[test]
fn every_sample_output_is_what_its_command_prints() {
    let mut compared = 0;
    for (path, heading) in WALKS {
        let page = page(path);
        compared += walk(&page, heading);
    }
    let expected = TEXT_BLOCKS.iter().filter(|(_, _, sample)| *sample == Sample::Output(THIS_BUILD)).count();
    assert_eq!(compared, expected, "outputs compared in this build");
}

/// Runs one walk-through (see [`WALKS`]); returns how many outputs it compared.
fn walk(page: &Page, heading: &str) -> usize {
    let section = page.section(heading);
    let dir = sandbox(&markdown::slug(heading));
    let mut last: Option<(String, Option<String>)> = None;
    let mut compared = 0;
    for block in blocks(section) {
        match block.info {
            "bash" => {
                last = None;
                for command in commands(block.body) {
                    let output = run(&command, &dir);
                    last = Some((command, output));
                }
            }
            "toml" => {
                if let Some(name) = block.body.lines().next().and_then(|line| line.strip_prefix("# file: ")) {
                    std::fs::write(dir.join(name.trim()), block.body).unwrap();
                }
                last = None;
            }
            "text" if block.follows_block => {
                let Some((prefix, Sample::Output(build))) = sample_of(&page.path, block.body) else { continue };
                let Some((command, output)) = last.take() else {
                    panic!("{}: output {prefix:?} follows no command", page.path)
                };
                if build != THIS_BUILD {
                    continue;
                }
                let output = output.unwrap_or_else(|| panic!("{}: `{command}` does not run in this build", page.path));
                let (printed, sample) = (normalized(&output), normalized(block.body));
                assert!(
                    excerpt_of(&printed, &sample),
                    "{}: the sample output of `{command}` is not what it prints.\nprinted:\n{printed}\n\nthe page:\n{sample}",
                    page.path
                );
                compared += 1;
            }
            _ => last = None,
        }
    }
    compared
}

/// A fresh directory for a walk-through, with the repository's `scenarios` and `tests` reachable by the relative
/// paths the pages use.
fn sandbox(name: &str) -> Scratch {
    let build = if cfg!(madsim) { "sim" } else { "normal" };
    let dir = Scratch::new(&format!("readme-{build}-{name}"));
    for linked in ["scenarios", "tests"] {
        std::os::unix::fs::symlink(root().join(linked), dir.join(linked)).unwrap();
    }
    dir
}

/// Runs a page's command in `dir` if this build can: `cargo sim ARGS` as the simulator build's `lockstep sim
/// ARGS`, `cargo run --example X` (normal build) and `cargo sim-run --example X` (simulator build) through cargo.
/// Returns what it printed (stdout, then stderr), or None when the command is the other build's.
fn run(command: &str, dir: &Path) -> Option<String> {
    let command = command.strip_prefix("env -u RUSTFLAGS ").unwrap_or(command);
    let words: Vec<&str> = command.split_whitespace().collect();
    let output = match words.as_slice() {
        ["cargo", "sim", args @ ..] => sim_binary(args, dir)?,
        ["cargo", "run", "--example", example] => example_output("run", example, Build::Normal)?,
        ["cargo", "sim-run", "--example", example] => example_output("sim-run", example, Build::Sim)?,
        ["scripts/test"] => return None,
        _ => panic!("the walk-through runs `{command}`, which this test does not know how to run"),
    };
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Some(text)
}

#[cfg(madsim)]
fn sim_binary(args: &[&str], dir: &Path) -> Option<Output> {
    Some(clean_command(env!("CARGO_BIN_EXE_lockstep")).arg("sim").args(args).current_dir(dir).output().unwrap())
}

#[cfg(not(madsim))]
fn sim_binary(_: &[&str], _: &Path) -> Option<Output> {
    None
}

/// Builds and runs an example through cargo in this build's target dir (the alias `sim-run` with `RUSTFLAGS`
/// unset for the simulator build), as the page tells a reader to.
fn example_output(subcommand: &str, example: &str, build: Build) -> Option<Output> {
    if build != THIS_BUILD {
        return None;
    }
    let mut cargo = cargo_command();
    cargo.args([subcommand, "--quiet", "--example", example]).current_dir(root());
    if build == Build::Sim {
        // A RUSTFLAGS variable would replace the alias's `--cfg madsim` (notes/madsim.md pitfall 1).
        cargo.env_remove("RUSTFLAGS").env_remove("CARGO_ENCODED_RUSTFLAGS");
    }
    let output = cargo.output().unwrap();
    assert!(
        output.status.success(),
        "cargo {subcommand} --example {example}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // cargo's own lines (a build, warnings) go to stderr: only the example's stdout is its output.
    Some(Output { stderr: Vec::new(), ..output })
}

/// `text` with what truly varies from run to run or build to build masked: the build id, wall times, and the
/// real-time figures of the quick-start example. Each masked value must be a plain decimal number (the way
/// people read it), else it stays and the comparison shows it.
fn normalized(text: &str) -> String {
    let mut text = text.trim_end().to_string();
    text = mask(&text, ", build ", "\n", |word| word.starts_with("0.") && !word.contains(' '));
    text = mask(&text, "wall time: ", " s", decimal);
    if THIS_BUILD == Build::Normal {
        // Real time: the simulator build's run of the same example is deterministic and compared whole.
        text = mask(&text, "images in ", " s with", decimal);
        text = mask(&text, "(mean process ", " ms,", decimal);
    }
    text
}

fn decimal(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_ascii_digit() || c == '.') && word.matches('.').count() <= 1
}

/// Replaces each value between `before` and the next `after` that `accept`s with `…`.
fn mask(text: &str, before: &str, after: &str, accept: impl Fn(&str) -> bool) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(before) {
        let value_start = at + before.len();
        out.push_str(&rest[..value_start]);
        rest = &rest[value_start..];
        let end = rest.find(after).unwrap_or(rest.len());
        if accept(&rest[..end]) {
            out.push('…');
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// Whether `sample` is `printed`, or an excerpt of it: a line `…` alone stands for lines left out, and the other
/// lines are `printed`'s, in order, the first and last included unless a `…` line stands there.
fn excerpt_of(printed: &str, sample: &str) -> bool {
    let printed: Vec<&str> = printed.lines().collect();
    let chunks: Vec<Vec<&str>> = sample.split("\n…\n").map(|chunk| chunk.lines().collect()).collect::<Vec<_>>();
    let opens = !sample.starts_with("…\n");
    let closes = !sample.ends_with("\n…");
    let chunks: Vec<Vec<&str>> =
        chunks.into_iter().map(|chunk| chunk.into_iter().filter(|line| *line != "…").collect()).collect();
    let mut from = 0;
    for (index, chunk) in chunks.iter().enumerate() {
        let last = index == chunks.len() - 1;
        let at = if index == 0 && opens {
            printed.starts_with(chunk).then_some(0)
        } else if last && closes {
            (printed.len() >= from + chunk.len() && printed.ends_with(chunk)).then(|| printed.len() - chunk.len())
        } else {
            (from..=printed.len().saturating_sub(chunk.len())).find(|at| printed[*at..].starts_with(chunk))
        };
        let Some(at) = at else { return false };
        if at < from {
            return false;
        }
        from = at + chunk.len();
    }
    !chunks.is_empty() && (!closes || from == printed.len())
}

#[test]
fn an_excerpt_keeps_its_lines_in_order_and_marks_what_it_leaves_out() {
    let printed = "a\nb\nc\nd";
    assert!(excerpt_of(printed, "a\nb\nc\nd"));
    assert!(excerpt_of(printed, "a\n…\nd"));
    assert!(excerpt_of(printed, "a\nb\n…"));
    assert!(excerpt_of(printed, "…\nc\nd"));
    assert!(!excerpt_of(printed, "a\nc\nd"), "a left-out line needs its mark");
    assert!(!excerpt_of(printed, "a\nb"), "so does a left-out end");
    assert!(!excerpt_of(printed, "a\n…\nb\n…\nb\n…"), "lines in order, each once");
    assert!(!excerpt_of(printed, "d\n…\na"));
}
