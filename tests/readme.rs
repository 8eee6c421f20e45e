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

/// The quick start's scenario output is the pinned summary of `scenarios/rows-quiet.toml` (seed 1), so the
/// README changes when the behaviour does.
#[test]
fn readme_quick_start_scenario_output_is_the_pinned_summary() {
    let readme = include_str!("../README.md");
    let snapshot = include_str!("snapshots/sim_scenarios__rows-quiet.snap");
    let summary = &snapshot[snapshot.find("scenario rows-quiet seed 1").expect("the snapshot's summary")..];
    assert!(readme.contains("env -u RUSTFLAGS cargo sim run scenarios/rows-quiet.toml"), "README quick start");
    assert!(readme.contains(summary.trim_end()), "README's quick start output differs from the snapshot:\n{summary}");
}
