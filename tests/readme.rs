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
