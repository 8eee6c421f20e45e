//! A user's pipelines, tested in lockstep's simulator and run on PostgreSQL: orders whose lines are charged at a
//! payment service.
//!
//! - `line` rows (`new` → `charged`) are charged by the `lines` pipeline: one call to the payment provider per
//!   line, with the line's idempotency key, so a retry after a lost reply charges nothing twice.
//! - `order` rows (`open` → `done`) are the lines' parents. The `orders` pipeline locks all of an order's lines
//!   with `lock_related`; once every line is `charged` it moves them and itself to `done` in one guarded apply,
//!   writing the order's total.
//!
//! The handlers compile in both builds and are generic over the store (`S: Store`) and over the payment provider
//! ([`Payments`]): in production (`src/bin/orders.rs`) they are registered with a `PipelineManager` on `PgStore`
//! and a `Payments` of your own (your HTTP client); in the simulator (the module `sim`, `--cfg madsim` only) the
//! provider is a simulated external service and `sim::orders` is the pipeline set the tests (`tests/sim.rs`) and the
//! scenario files (`src/bin/orders-sim.rs`) run. Both register [`lines_config`] and [`orders_config`].

use lockstep::pipeline::{Changes, Handler, LoadCx, PipelineConfig, WorkError};
use lockstep::store::{RelatedUpdate, Row, RowId, RowUpdate, Store};
use serde_json::json;
use std::future::Future;

/// What the `lines` pipeline needs of a payment provider: a charge about `subject`, deduplicated by
/// `idempotency_key` when there is one. Returns the provider's payment number.
///
/// Errors: the provider's, as text; the item fails and is retried with backoff (its lease's key makes the retry
/// charge nothing twice).
pub trait Payments: Send + Sync + 'static {
    /// One charge.
    fn charge(
        &self,
        subject: String,
        idempotency_key: Option<String>,
    ) -> impl Future<Output = Result<u64, String>> + Send;
}

/// Whether the `lines` pipeline sends its idempotency key. `Off` is the planted bug of `tests/sim.rs`: a charge
/// whose reply was lost is charged again when the line is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idempotency {
    /// Every charge carries `line-{id}` (the right way).
    On,
    /// Charges carry no key (the bug).
    Off,
}

/// The `lines` pipeline: `line` rows in status `new`, every other field at lockstep's default (20 workers, a 30 s
/// lease). The production binary (`src/bin/orders.rs`) registers it as is; the simulator (`sim::orders`) with
/// fewer workers and a shorter lease.
pub fn lines_config() -> PipelineConfig {
    PipelineConfig::new("lines", "line", &["new"])
}

/// The `orders` pipeline: `order` rows in status `open`, every other field at lockstep's default, as
/// [`lines_config`].
pub fn orders_config() -> PipelineConfig {
    PipelineConfig::new("orders", "order", &["open"])
}

/// `line` rows: charge the line once, then mark it `charged`.
pub struct Lines<P> {
    /// The payment provider.
    pub payments: P,
    /// Whether charges carry their idempotency key.
    pub idempotency: Idempotency,
}

impl<S: Store, P: Payments> Handler<S> for Lines<P> {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, row: Row, _: ()) -> Result<Changes, WorkError> {
        let subject = format!("charge line {}", row.id);
        let idempotency_key = (self.idempotency == Idempotency::On).then(|| format!("line-{}", row.id));
        // A failed or unanswered charge fails the item: the engine retries the line later, and the key makes the
        // retry charge nothing twice.
        let payment = self.payments.charge(subject, idempotency_key).await.map_err(WorkError::Failed)?;
        let mut changes = Changes::status("charged");
        changes.update.data = Some(json!({ "amount": row.data["amount"], "payment": payment }));
        changes.hints.push("order".into());
        Ok(changes)
    }
}

/// `order` rows: lock every line; once all are charged, move them and the order to `done` with the total.
pub struct Orders;

impl<S: Store> Handler<S> for Orders {
    type Context = Vec<Row>;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<Vec<Row>, WorkError> {
        let ids = line_ids(row)?;
        // Lock every line and read it under the lock, in one store call: a line may have been charged between
        // the fetch and the lock.
        let lines = cx.lock_and_read_related(ids.clone()).await?;
        if let Some(id) = ids.iter().find(|id| !lines.iter().any(|line| line.id == **id)) {
            return Err(WorkError::Failed(format!("order {}: line {id} missing", row.id)));
        }
        Ok(lines)
    }

    async fn process(&self, row: Row, lines: Vec<Row>) -> Result<Changes, WorkError> {
        if !lines.iter().all(|line| line.status == "charged") {
            return Ok(Changes::default()); // not yet: release the locks, look again later
        }
        let total: u64 = lines.iter().map(|line| line.data["amount"].as_u64().unwrap_or(0)).sum();
        // The order is final: these changes close it, in the guarded apply that follows. (Should this worker have
        // lost its lease meanwhile, the apply writes nothing and the attempt that closes the order logs again.)
        tracing::info!(order = %row.id, lines = lines.len(), total, "order closed: every line charged");
        let related = lines
            .iter()
            .map(|line| RelatedUpdate { id: line.id, update: RowUpdate { status: Some("done".into()), data: None } })
            .collect();
        let mut changes = Changes { related, ..Changes::status("done") };
        changes.update.data =
            Some(json!({ "lines": lines.iter().map(|l| l.id.0).collect::<Vec<_>>(), "total": total }));
        Ok(changes)
    }
}

/// The ids of an order's lines (its data's `lines`).
pub fn line_ids(order: &Row) -> Result<Vec<RowId>, WorkError> {
    let ids =
        order.data["lines"].as_array().ok_or_else(|| WorkError::Failed(format!("order {}: no lines", order.id)))?;
    Ok(ids.iter().filter_map(|id| id.as_i64()).map(RowId).collect())
}

/// The simulator's side (`--cfg madsim`): the payment provider as a simulated service, the workload, the
/// project's own checker, and the pipeline set.
#[cfg(madsim)]
pub mod sim {
    use super::{Idempotency, Lines, Orders, Payments, line_ids, lines_config, orders_config};
    use lockstep::pipeline::PipelineConfig;
    use lockstep::sim::user::{
        CheckInput, Checker, EffectRequest, PipelineSet, ServiceClient, ServiceOptions, WorkloadClient,
    };
    use lockstep::store::{NewRow, Row, RowId};
    use rand::Rng;
    use serde_json::json;
    use std::time::Duration;

    impl Payments for ServiceClient {
        async fn charge(&self, subject: String, idempotency_key: Option<String>) -> Result<u64, String> {
            let receipt = self.call(EffectRequest { subject, idempotency_key }).await.map_err(|e| e.to_string())?;
            Ok(receipt.effect)
        }
    }

    /// Orders the workload inserts.
    pub const ORDERS: u64 = 30;
    /// Lines per order, uniform.
    pub const LINES_PER_ORDER: std::ops::RangeInclusive<u64> = 1..=4;
    /// Lease ttl of both pipelines: short, so that leases expire often within a run (a paused replica's items
    /// go to another replica within seconds).
    pub const LEASE_TTL: Duration = Duration::from_secs(10);
    /// The workload inserts orders over this span of simulated time.
    pub const WORKLOAD_SPAN: Duration = Duration::from_secs(60);

    /// The pipeline set: `lines` and `orders` on every replica, the workload, the final statuses, the `payments`
    /// service and the `order_totals` checker.
    pub fn orders(idempotency: Idempotency) -> PipelineSet {
        let name = match idempotency {
            Idempotency::On => "orders",
            Idempotency::Off => "orders-without-keys",
        };
        PipelineSet::new(name, move |replica| {
            let payments = replica.service("payments");
            let lines = PipelineConfig { workers: 4, ..lines_config() };
            replica.register(lines.with_lease_ttl(LEASE_TTL), Lines { payments, idempotency })?;
            let orders = PipelineConfig { workers: 2, ..orders_config() };
            replica.register(orders.with_lease_ttl(LEASE_TTL), Orders)
        })
        .final_statuses("order", &["done"])
        .final_statuses("line", &["done"])
        .service("payments", ServiceOptions::default())
        .workload(workload)
        .checker(OrderTotals)
    }

    /// The client: [`ORDERS`] orders at random times over [`WORKLOAD_SPAN`], each with its lines, every insert keyed
    /// (lines first, then the order naming them), so a retried insert never duplicates a row.
    async fn workload(client: WorkloadClient) {
        let mut rng = client.rng("orders");
        let mut times: Vec<u64> = (0..ORDERS).map(|_| rng.random_range(0..WORKLOAD_SPAN.as_millis() as u64)).collect();
        times.sort_unstable();
        for (order, at) in times.into_iter().enumerate() {
            client.sleep_until(Duration::from_millis(at)).await;
            let mut lines = Vec::new();
            for index in 0..rng.random_range(LINES_PER_ORDER) {
                let amount = rng.random_range(1..100u64);
                let line = NewRow::new("line", "new", json!({ "order": order, "amount": amount }));
                lines.push(client.insert(format!("order-{order}-line-{index}"), line).await.id.0);
            }
            client.insert(format!("order-{order}"), NewRow::new("order", "open", json!({ "lines": lines }))).await;
            client.hint("line").await;
        }
    }

    /// An invariant of this project: every order that is `done` holds the sum of its lines' amounts, and each of its
    /// lines is `done` too.
    pub struct OrderTotals;

    impl Checker for OrderTotals {
        fn name(&self) -> &'static str {
            "order_totals"
        }

        fn check(&self, input: &CheckInput<'_>) -> Result<(), String> {
            let rows: std::collections::BTreeMap<RowId, &Row> = input.rows_final.iter().map(|r| (r.id, r)).collect();
            let mut broken = Vec::new();
            for order in input.rows_final.iter().filter(|r| r.kind == "order" && r.status == "done") {
                let ids = line_ids(order).unwrap_or_default();
                let lines: Vec<&Row> = ids.iter().filter_map(|id| rows.get(id).copied()).collect();
                let sum: u64 = lines.iter().map(|line| line.data["amount"].as_u64().unwrap_or(0)).sum();
                if order.data["total"].as_u64() != Some(sum) || lines.iter().any(|line| line.status != "done") {
                    broken.push(format!("order {} total {} for lines summing {sum}", order.id, order.data["total"]));
                }
            }
            if broken.is_empty() { Ok(()) } else { Err(broken.join("; ")) }
        }
    }
}
