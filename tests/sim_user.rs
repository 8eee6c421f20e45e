//! Users' pipeline sets in the simulator: what a run does when a user's handler misbehaves in ways the checkers
//! cannot see from the database (the examples crate, `examples/user-pipelines`, covers the working case).
#![cfg(madsim)]

use lockstep::pipeline::{Changes, Handler, LoadCx, PipelineConfig, WorkError};
use lockstep::sim::run::run_within;
use lockstep::sim::user::{CheckInput, Checker, PipelineSet};
use lockstep::sim::{Fault, FaultEvent, Scenario};
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

/// Orders the enqueue test's workload places, each with its email, one every [`ORDER_GAP`] of simulated time.
const ORDERS: u64 = 20;
const ORDER_GAP: Duration = Duration::from_secs(2);

/// Every order of the enqueue test is stored once, with exactly one email, and every email has its order.
struct OneEmailPerOrder;

impl Checker for OneEmailPerOrder {
    fn name(&self) -> &'static str {
        "one_email_per_order"
    }

    fn check(&self, input: &CheckInput<'_>) -> Result<(), String> {
        let count = |kind: &str| {
            let mut counts = std::collections::BTreeMap::new();
            for row in input.rows_final.iter().filter(|row| row.kind == kind) {
                *counts.entry(row.data["order"].as_u64().unwrap_or(u64::MAX)).or_insert(0_usize) += 1;
            }
            counts
        };
        let once: std::collections::BTreeMap<u64, usize> = (0..ORDERS).map(|order| (order, 1)).collect();
        let (orders, emails) = (count("order"), count("email"));
        if orders != once || emails != once {
            return Err(format!("rows per order: orders {orders:?}, emails {emails:?}"));
        }
        Ok(())
    }
}

/// Sends an email (marks its row sent).
struct Mailer;

impl<S: Store> Handler<S> for Mailer {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
        Ok(Changes::status("sent"))
    }
}

/// `WorkloadClient::insert_many`, the simulator's model of an enqueue in the caller's transaction: while half the
/// database's replies are lost (the client retries calls whose outcome it does not know), each order and its email
/// are stored together once (one call, all or none, keyed), and the email's hint gets it sent.
#[test]
fn an_enqueue_batch_stores_each_order_with_exactly_one_email_under_faults() {
    let set = PipelineSet::new("shop", |replica| {
        replica.register(PipelineConfig::new("emails", "email", &["queued"]), Mailer)
    })
    .final_statuses("email", &["sent"])
    .checker(OneEmailPerOrder)
    .workload(|client| async move {
        for order in 0..ORDERS {
            client.sleep_until(ORDER_GAP * order as u32).await;
            let rows = vec![
                NewRow::new("order", "placed", serde_json::json!({ "order": order })),
                NewRow::new("email", "queued", serde_json::json!({ "order": order })),
            ];
            let stored = client.insert_many(format!("order-{order}"), rows).await;
            let kinds: Vec<&str> = stored.iter().map(|row| row.kind.as_str()).collect();
            assert_eq!(kinds, ["order", "email"], "order {order}: the rows as stored, in input order");
        }
    });
    let mut scenario = Scenario::for_pipelines(set);
    scenario.faults.random.clear();
    let lost = Fault::LostReplies { chance: 0.5, span: ORDER_GAP * ORDERS as u32 };
    scenario.faults.fixed = vec![FaultEvent { at: Duration::ZERO, fault: lost }];
    for seed in 1..=3 {
        let report = run_within(&scenario, seed, None, Duration::from_secs(120));
        assert!(report.passed(), "seed {seed}: {:?} {:?}", report.panic, report.violations);
        assert_eq!(report.keyed_rows, 2 * ORDERS as usize, "seed {seed}: keyed rows");
        assert_eq!(report.statuses["email"]["sent"], ORDERS as usize, "seed {seed}: emails sent");
    }
}

/// Retention runs in a simulated replica as in a real one: its passes go through the simulated network
/// (`Store::purge` over the wire), delete the rows that finished long enough ago, and no checker sees a row lost
/// (a deleted finished row is no unfinished one).
#[test]
fn retention_in_a_simulated_replica_deletes_the_rows_that_finished_long_ago() {
    const ROWS: u32 = 20;
    let set = PipelineSet::new("retained", |replica| {
        replica.register(PipelineConfig::new("mailer", "email", &["queued"]), Mailer)?;
        let rule = lockstep::pipeline::RetentionRule::new("email", &["sent"], Duration::from_secs(5));
        let mut retention = lockstep::pipeline::Retention::new(vec![rule]);
        retention.every = Duration::from_secs(2);
        retention.batch = 3;
        replica.retain(retention)
    })
    .final_statuses("email", &["sent"])
    .workload(|client| async move {
        for n in 0..ROWS {
            client.sleep_until(Duration::from_millis(200) * n).await;
            client.insert(format!("email-{n}"), NewRow::new("email", "queued", serde_json::json!({ "n": n }))).await;
        }
    });
    let mut scenario = Scenario::for_pipelines(set);
    scenario.faults.random.clear();
    let report = run_within(&scenario, 1, None, Duration::from_secs(120));
    assert!(report.passed(), "{:?} {:?}", report.panic, report.violations);
    let sent = report.statuses.get("email").and_then(|statuses| statuses.get("sent")).copied().unwrap_or(0);
    assert!(sent < ROWS as usize, "retention deleted none of the {ROWS} sent emails (still {sent})");
}
