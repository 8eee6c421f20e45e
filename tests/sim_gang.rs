//! Gang operations in the simulated world (DESIGN §4, §5).
#![cfg(madsim)]

use lockstep::gang::SpecFormat;
use lockstep::sim::{self, Replay, RunReport, Scenario, Submission};
use std::time::Duration;

fn replay(name: &'static str) -> Replay {
    Replay { test: "sim_gang", name }
}

fn submission(name: &str, at: u64, spec: &str) -> Submission {
    Submission { name: name.into(), at: Duration::from_secs(at), spec: spec.into(), format: SpecFormat::Yson }
}

fn passed(report: RunReport, name: &'static str) -> RunReport {
    assert!(report.passed(), "{}", sim::run::failure_text(&report, replay(name)));
    report
}

#[test]
fn smoke() {
    let scenario = Scenario::gang_quiet(
        3,
        2,
        vec![submission("train", 1, "{tasks={worker={job_count=3;command=w;gang_options={}}}}")],
        Duration::from_secs(10),
    );
    let report = passed(sim::run(&scenario, 1), "smoke");
    eprintln!("{}", report.trace_text());
    eprintln!("{:#?}", report.operations);
}
