//! The README's examples stay true: its pipeline is `examples/quickstart.rs` verbatim (which `scripts/test` runs in
//! both builds), and its test command is what CI runs.

#[test]
fn readme_shows_the_quickstart_example_verbatim() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    assert!(readme.contains(example), "README.md must include examples/quickstart.rs verbatim");
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = include_str!("../README.md");
    let ci = include_str!("../.ci/run");
    assert!(readme.contains("```bash\nscripts/test\n```"), "README.md must show `scripts/test` as the test command");
    assert!(ci.lines().any(|line| line.trim() == "exec scripts/test"), ".ci/run must exec scripts/test");
}

#[test]
fn readme_gang_spec_parses_and_its_error_example_is_the_validators() {
    use lockstep::gang::{OperationSpec, SpecFormat};
    let readme = include_str!("../README.md");
    let section = &readme[readme.find("## Gang controller").expect("a Gang controller section")..];
    let start = section.find("```text\n").expect("a spec block") + "```text\n".len();
    let text = &section[start..start + section[start..].find("```").unwrap()];
    let spec = OperationSpec::parse(text.trim(), SpecFormat::Yson).expect("the README's spec parses");
    assert!(spec.is_gang());
    assert_eq!(spec.gang_size(), 3);

    let broken = text.replace("size=3", "size=9").replace("job_count=3", "job_count=8");
    let error = OperationSpec::parse(broken.trim(), SpecFormat::Yson).unwrap_err().to_string();
    let quoted = "`tasks.trainer.gang_options.size: 9 exceeds job_count 8`";
    assert!(readme.contains(quoted), "README quotes the error");
    assert!(error.contains(quoted.trim_matches('`')), "{error}");
}

/// The README's annotated scenario file parses, and its fault table covers every fault kind.
#[cfg(madsim)]
#[test]
fn readme_scenario_example_parses_and_its_table_lists_every_fault_kind() {
    use lockstep::sim::{FaultKind, ScenarioFile};
    let readme = include_str!("../README.md");
    let start = readme.find("## Scenarios and the command line").expect("a Scenarios section");
    let section = &readme[start..start + readme[start + 3..].find("\n## ").expect("a next section") + 3];
    let begin = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let example = &section[begin..begin + section[begin..].find("```").unwrap()];
    let file = ScenarioFile::parse(example, "README.md").unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(file.scenario.name, "example");
    assert_eq!(file.scenario.faults.fixed.len(), 2);
    assert_eq!(file.scenario.faults.random.len(), 2);
    for kind in FaultKind::ALL {
        let row = format!("| `{}` |", kind.name());
        assert!(section.contains(&row), "the README's fault table has no row {row}");
    }
}

/// The README's annotated gang scenario parses (its spec file read from `scenarios/`) and sets every gang key.
#[cfg(madsim)]
#[test]
fn readme_gang_scenario_example_parses_with_every_gang_key() {
    use lockstep::sim::scenario_file::gang::SpecSource;
    use lockstep::sim::{Fault, FaultKind, ScenarioFile, Target};
    let readme = include_str!("../README.md");
    let start = readme.find("## Scenarios and the command line").expect("a Scenarios section");
    let section = &readme[start..start + readme[start + 3..].find("\n## ").expect("a next section") + 3];
    let blocks: Vec<&str> =
        section.split("```toml\n").skip(1).map(|block| &block[..block.find("```").unwrap()]).collect();
    assert_eq!(blocks.len(), 2, "a row example and a gang example");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let file =
        ScenarioFile::parse_with(blocks[1], "README.md", SpecSource::Dir(&dir)).unwrap_or_else(|e| panic!("{e}"));
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
        assert!(section.contains(kind.name()), "the README's gang example never names {}", kind.name());
    }
}

/// The quick start's scenario output is the pinned summary of `scenarios/gang-seed-example.toml` (seed 1), so the
/// README changes when the behaviour does.
#[test]
fn readme_quick_start_scenario_output_is_the_pinned_summary() {
    let readme = include_str!("../README.md");
    let snapshot = include_str!("snapshots/sim_scenarios__gang-seed-example.snap");
    let summary = &snapshot[snapshot.find("scenario gang-seed-example seed 1").expect("the snapshot's summary")..];
    assert!(readme.contains("env -u RUSTFLAGS cargo sim run scenarios/gang-seed-example.toml"), "README quick start");
    assert!(readme.contains(summary.trim_end()), "README's quick start output differs from the snapshot:\n{summary}");
}

/// The README's "Test your own pipelines" shows the example crate's simulator tests whole, and its scenario-file
/// commands name files the example has.
#[test]
fn readme_shows_the_user_pipelines_test_whole() {
    let readme = include_str!("../README.md");
    let test = include_str!("../examples/user-pipelines/tests/sim.rs");
    assert!(readme.contains(test), "README.md must include examples/user-pipelines/tests/sim.rs verbatim");
    for scenario in ["orders-mixed.toml", "orders-without-keys.toml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/user-pipelines/scenarios");
        assert!(path.join(scenario).is_file(), "the README runs {scenario}, which the example lacks");
        assert!(readme.contains(&format!("scenarios/{scenario}")));
    }
}

/// The quick start's first output line names the scenario's current version label (it changes when the scenario
/// model does), so the README's sample is this build's, not an older one's.
#[cfg(madsim)]
#[test]
fn readme_quick_start_names_the_scenarios_current_version() {
    use lockstep::sim::ScenarioFile;
    let readme = include_str!("../README.md");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gang-seed-example.toml");
    let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
    let line = format!("scenarios/gang-seed-example.toml ({}), seed 1, build ", file.version_label());
    assert!(readme.contains(&line), "README's quick start output should begin with {line:?}");
}
