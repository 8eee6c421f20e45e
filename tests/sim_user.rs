//! Users' pipeline sets in the simulator: what a run does when a user's handler misbehaves in ways the checkers
//! cannot see from the database (the examples crate, `examples/user-pipelines`, covers the working case).
#![cfg(madsim)]

use lockstep::pipeline::{Changes, Handler, LoadCx, PipelineConfig, WorkError};
use lockstep::sim::Scenario;
use lockstep::sim::run::run_within;
use lockstep::sim::user::PipelineSet;
use lockstep::store::{NewRow, Row, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set by the test once it has its report, so the handler's loop ends and its thread can finish.
static RELEASE_SPINNER: AtomicBool = AtomicBool::new(false);

/// A handler that never yields: it spins until the test releases it.
struct Spinner;

impl<S: Store> Handler<S> for Spinner {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
        while !RELEASE_SPINNER.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        Ok(Changes::status("done"))
    }
}

/// A handler that busy-loops stops the simulated clock for good, so the run's simulated time limit never comes:
/// the run ends at its wall-clock limit with a message that says so, instead of hanging the test.
#[test]
fn a_handler_that_never_yields_ends_the_run_at_its_wall_clock_limit_with_a_message() {
    let set =
        PipelineSet::new("spinner", |replica| replica.register(PipelineConfig::new("spin", "spin", &["new"]), Spinner))
            .final_statuses("spin", &["done"])
            .workload(|client| async move {
                client.insert("only", NewRow::new("spin", "new", serde_json::json!({}))).await;
                client.hint("spin").await;
            });
    let mut scenario = Scenario::for_pipelines(set);
    scenario.faults.random.clear();
    let report = run_within(&scenario, 1, None, Duration::from_secs(3));
    RELEASE_SPINNER.store(true, Ordering::SeqCst);
    assert!(!report.passed());
    let panic = report.panic.expect("the run is reported stuck");
    assert!(panic.contains("wall-clock limit of 3 s while simulated time stood still"), "{panic}");
}
