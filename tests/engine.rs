//! The engine's behaviour on MemStore, one service pass at a time (STYLE: `run_once`, no sleeping to wait),
//! with tokio's paused clock as the local clock. Store-level semantics live in the conformance suite. The hot-row
//! drain across replicas runs on PostgreSQL too, in wall time.
#![cfg(not(madsim))]

use crate::support;

use lockstep::pipeline::{
    Changes, FetchPass, Handler, ItemOutcome, LoadCx, ManagerOptions, Pipeline, PipelineConfig, PipelineManager,
    WorkError,
};
use lockstep::store::{
    Clock, CommitOp, FetchParams, ManualClock, MemStore, NewRow, Row, RowId, RowUpdate, Store, Timestamp, TokioClock,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

const START: Timestamp = Timestamp(1_700_000_000_000_000);

fn config(workers: usize) -> PipelineConfig {
    PipelineConfig { workers, ..PipelineConfig::new("tasks", "task", &["ready"]) }
}

async fn insert_ready<S: Store>(store: &S, count: usize) -> Vec<RowId> {
    let mut ids = Vec::new();
    for i in 0..count {
        ids.push(store.insert(NewRow::new("task", "ready", json!({ "n": i }))).await.unwrap().id);
    }
    ids
}

/// Marks rows done, counting calls; optionally fails as if the store were down, or blocks until released.
#[derive(Default)]
struct MarkDone {
    processed: AtomicUsize,
    fail: bool,
    started: AtomicUsize,
    gate: Option<Arc<Notify>>,
}

impl<S: Store> Handler<S> for MarkDone {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, row: Row, _context: ()) -> Result<Changes, WorkError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        self.processed.fetch_add(1, Ordering::SeqCst);
        if self.fail {
            let down = lockstep::store::StoreError::Unavailable(format!("row {}: store down on purpose", row.id));
            return Err(WorkError::Store(down));
        }
        Ok(Changes::status("done"))
    }
}

fn pipeline(store: &MemStore, config: PipelineConfig) -> Pipeline<MemStore> {
    Pipeline::new(Arc::new(store.clone()), config).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_fetched_row_is_processed_applied_and_unlocked() {
    let store = MemStore::new(ManualClock::new(START));
    let ids = insert_ready(&store, 3).await;
    let p = pipeline(&store, config(2));
    let handler = MarkDone::default();
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.shared.queue_len(), 3);
    for _ in 0..3 {
        assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Applied));
    }
    for id in ids {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.status, "done", "row {id}");
        assert_eq!((row.lock_token, row.lock_expires_at, row.lock_owner), (None, None, None), "row {id}");
        assert_eq!(row.last_processed_at, Some(START), "row {id}");
    }
    assert_eq!(p.metrics().applied, 3);
    assert_eq!(p.shared.leases_len(), 0, "applied leases are forgotten");
}

#[tokio::test(start_paused = true)]
async fn fetch_fills_the_queue_to_its_max_and_waits_below_the_lower_mark() {
    let store = MemStore::new(ManualClock::new(START));
    insert_ready(&store, 50).await;
    let p = pipeline(&store, config(4)); // max 8, low 2
    let mut fetcher = p.fetcher(1);
    assert_eq!(fetcher.run_once().await.unwrap(), lockstep::pipeline::FetchPass::Fetched { fetched: 8, limit: 8 });
    assert_eq!(fetcher.run_once().await.unwrap(), lockstep::pipeline::FetchPass::Full);
    let handler = MarkDone::default();
    for _ in 0..7 {
        p.work_one(&handler).await.unwrap();
    }
    assert_eq!(p.shared.queue_len(), 1);
    assert_eq!(fetcher.run_once().await.unwrap(), lockstep::pipeline::FetchPass::Fetched { fetched: 7, limit: 7 });
}

/// A lease the store handed to another holder while this replica's clock did not see the time pass (the test
/// moves only the store's clock, as a suspended machine would see it).
#[tokio::test(start_paused = true)]
async fn a_lease_taken_over_before_processing_is_dropped_unprocessed() {
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let ids = insert_ready(&store, 1).await;
    // Every row reread, however fresh: the reread is what finds the lease gone.
    let p = pipeline(&store, PipelineConfig { refetch_after: Duration::ZERO, ..config(1) });
    p.fetcher(1).run_once().await.unwrap();
    // Another replica of the same pipeline takes the row after the store-side expiry.
    clock.advance(p.config.lease_ttl + Duration::from_secs(1));
    let other = pipeline(&store, config(1));
    other.fetcher(2).run_once().await.unwrap();
    assert_eq!(other.shared.queue_len(), 1);

    let handler = MarkDone::default();
    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Stale));
    assert_eq!(handler.started.load(Ordering::SeqCst), 0, "stale item must not be processed");
    let row = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(row.status, "ready");
    assert_eq!(row.last_processed_at, None);
    assert!(!store.history().iter().any(|c| matches!(c.op, CommitOp::Apply { .. })), "no apply attempted");
    assert_eq!(p.metrics().stale, 1);
}

/// A row loaded within `refetch_after` of its fetch is not reread: the worker processes the fetched copy, and if
/// the lease was lost unseen (only the store's clock moved), the guarded apply finds it stale and writes nothing.
#[tokio::test(start_paused = true)]
async fn a_fresh_row_is_loaded_as_fetched_and_a_lost_lease_is_caught_by_the_guarded_apply() {
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let ids = insert_ready(&store, 1).await;
    let p = pipeline(&store, config(1));
    assert_eq!(p.config.refetch_after, Duration::from_secs(1));
    p.fetcher(1).run_once().await.unwrap();
    clock.advance(p.config.lease_ttl + Duration::from_secs(1));
    let other = pipeline(&store, config(1));
    other.fetcher(2).run_once().await.unwrap();

    let handler = MarkDone::default();
    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Stale));
    assert_eq!(handler.started.load(Ordering::SeqCst), 1, "the fresh row is processed from the fetch's copy");
    assert_eq!(p.metrics().refetched, 0);
    let row = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(row.status, "ready", "the stale apply wrote nothing");
    assert_eq!(row.lock_token, other.shared.leases().values().next().map(|held| held.token));
}

/// A row that waited `refetch_after` or longer in the queue (local clock) is reread before it is loaded.
#[tokio::test(start_paused = true)]
async fn a_row_that_waited_refetch_after_is_reread() {
    let store = MemStore::new(ManualClock::new(START));
    insert_ready(&store, 2).await;
    let p = pipeline(&store, config(1));
    p.fetcher(1).run_once().await.unwrap();
    let handler = MarkDone::default();
    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Applied));
    assert_eq!(p.metrics().refetched, 0, "loaded at once: not reread");
    tokio::time::advance(p.config.refetch_after).await;
    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Applied));
    assert_eq!(p.metrics().refetched, 1, "waited refetch_after: reread");
}

/// Re-leases its row from another pipeline instance while processing, so its own apply comes too late.
struct LoseLeaseWhileProcessing {
    clock: ManualClock,
    thief: Pipeline<MemStore>,
}

impl Handler<MemStore> for LoseLeaseWhileProcessing {
    type Context = RowId;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, MemStore>) -> Result<RowId, WorkError> {
        let child = cx.store().list("child", Some(row.id)).await?[0].id;
        cx.lock_related(vec![child]).await?;
        Ok(child)
    }

    async fn process(&self, row: Row, child: RowId) -> Result<Changes, WorkError> {
        self.clock.advance(self.thief.config.lease_ttl + Duration::from_secs(1));
        self.thief.fetcher(9).run_once().await.map_err(WorkError::Store)?;
        let mut changes = Changes::status("done");
        changes.related.push(lockstep::store::RelatedUpdate { id: child, update: RowUpdate::status("touched") });
        changes.inserts.push(NewRow::new("task", "ready", json!({})).with_parent(row.id));
        changes.events.push(lockstep::store::NewEvent { row_id: row.id, kind: "done".into(), data: json!({}) });
        Ok(changes)
    }
}

#[tokio::test(start_paused = true)]
async fn an_apply_after_the_lease_was_taken_over_writes_nothing() {
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let parent = insert_ready(&store, 1).await[0];
    let child = store.insert(NewRow::new("child", "idle", json!({})).with_parent(parent)).await.unwrap().id;
    let p = pipeline(&store, config(1));
    p.fetcher(1).run_once().await.unwrap();
    let handler = LoseLeaseWhileProcessing { clock, thief: pipeline(&store, config(1)) };

    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Stale));
    let row = store.get(parent).await.unwrap().unwrap();
    assert_eq!(row.status, "ready", "main update must not be written");
    assert_eq!(store.get(child).await.unwrap().unwrap().status, "idle", "related update must not be written");
    assert_eq!(store.list("task", None).await.unwrap().len(), 1, "insert must not be written");
    assert!(store.events(parent).await.unwrap().is_empty(), "event must not be written");
    assert_eq!(row.lock_token, handler.thief.shared.leases()[&parent].token.into(), "the new holder keeps it");
    assert_eq!(p.metrics().stale, 1);
}

/// Locks the row's children before processing.
struct LockChildren;

impl Handler<MemStore> for LockChildren {
    type Context = Vec<RowId>;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, MemStore>) -> Result<Vec<RowId>, WorkError> {
        let children: Vec<RowId> = cx.store().list("child", Some(row.id)).await?.iter().map(|c| c.id).collect();
        cx.lock_related(children.clone()).await?;
        Ok(children)
    }

    async fn process(&self, _row: Row, children: Vec<RowId>) -> Result<Changes, WorkError> {
        let mut changes = Changes::status("done");
        for id in children {
            changes.related.push(lockstep::store::RelatedUpdate { id, update: RowUpdate::status("adopted") });
        }
        Ok(changes)
    }
}

#[tokio::test(start_paused = true)]
async fn related_lock_contention_resets_the_lease_and_the_row_is_retried() {
    let clock = ManualClock::new(START);
    let store = MemStore::new(clock.clone());
    let parent = insert_ready(&store, 1).await[0];
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(store.insert(NewRow::new("child", "idle", json!({})).with_parent(parent)).await.unwrap().id);
    }
    // The children's own pipeline holds child 2.
    let child_fetch = FetchParams {
        pipeline: "children".into(),
        kind: "child".into(),
        statuses: vec!["idle".into()],
        limit: 1,
        lease_ttl: Duration::from_secs(30),
        min_processing_interval: Duration::from_secs(5),
        retry_delay: Duration::from_millis(500),
    };
    let held = store.fetch(child_fetch.clone()).await.unwrap();
    assert_eq!(held[0].id, children[0]);

    let p = pipeline(&store, config(1));
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Retried { behind_other_replica: false }));
    let row = store.get(parent).await.unwrap().unwrap();
    assert_eq!(row.lock_owner.as_deref(), Some("tasks"), "owner is kept");
    assert_eq!((row.lock_token, row.lock_expires_at), (None, None), "token and expiry are cleared");
    assert_eq!(row.last_processed_at, None, "the reset row keeps its place in fetch order");
    assert_eq!(row.not_before, Some(clock.now().plus(Duration::from_millis(500))), "it waits out retry_delay");
    assert_eq!(p.metrics().retries, 1);

    // Fresh (intent-marked) children are skipped by their own pipeline; the held one is finished by it.
    assert!(store.fetch(FetchParams { limit: 10, ..child_fetch }).await.unwrap().is_empty());
    let lease = lockstep::store::Lease { id: held[0].id, token: held[0].lock_token.unwrap() };
    store.apply(lockstep::store::ApplyParams::new(lease, RowUpdate::default())).await.unwrap();

    // The parent is retried on a later fetch and now acquires every child.
    clock.advance(p.config.retry_delay);
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Applied));
    for id in children {
        let child = store.get(id).await.unwrap().unwrap();
        assert_eq!(child.status, "adopted", "child {id}");
        assert_eq!(child.lock_owner, None, "child {id} unlocked");
    }
}

/// A parent with three `child` rows, the first of them leased by the children's own pipeline for `ttl`; returns
/// the parent and the children, and the held child's lease.
async fn parent_with_a_held_child(store: &MemStore, ttl: Duration) -> (RowId, Vec<RowId>, lockstep::store::Lease) {
    let parent = insert_ready(store, 1).await[0];
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(store.insert(NewRow::new("child", "idle", json!({})).with_parent(parent)).await.unwrap().id);
    }
    let child_fetch = FetchParams {
        pipeline: "children".into(),
        kind: "child".into(),
        statuses: vec!["idle".into()],
        limit: 1,
        lease_ttl: ttl,
        min_processing_interval: Duration::from_secs(5),
        retry_delay: Duration::from_millis(500),
    };
    let held = store.fetch(child_fetch).await.unwrap();
    assert_eq!(held[0].id, children[0]);
    (parent, children, lockstep::store::Lease { id: held[0].id, token: held[0].lock_token.unwrap() })
}

fn parking(workers: usize) -> PipelineConfig {
    PipelineConfig { park_waiters: true, ..config(workers) }
}

/// With `park_waiters`, a contended parent is parked with its lease (no reset, no worker held), and the holder's
/// apply wakes it through the hint channel: it goes back to the queue and locks its children at once, with no
/// `retry_delay` and no fetch.
#[tokio::test(start_paused = true)]
async fn a_parked_item_keeps_its_lease_and_the_holders_apply_wakes_it() {
    let clock = ManualClock::new(START);
    let store = MemStore::new(clock.clone());
    let (parent, children, held) = parent_with_a_held_child(&store, Duration::from_secs(30)).await;
    let p = pipeline(&store, parking(1));
    let mut hinter = lockstep::pipeline::Hinter::new(store.subscribe_hints(), vec![("task".into(), p.shared.clone())]);
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Parked));
    let row = store.get(parent).await.unwrap().unwrap();
    assert!(row.lock_token.is_some(), "the parked parent keeps its lease");
    assert_eq!((p.metrics().parked, p.metrics().retries), (1, 0));
    assert_eq!((p.shared.queue_len(), p.shared.parked_len(), p.shared.leases_len()), (0, 1, 1));

    store.apply(lockstep::store::ApplyParams::new(held, RowUpdate::default())).await.unwrap();
    assert_eq!(hinter.run_once().await, Some(1), "the holder's apply wakes the parked parent");
    assert_eq!((p.shared.queue_len(), p.shared.parked_len()), (1, 0));
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Applied), "no retry_delay, no fetch");
    for id in children {
        assert_eq!(store.get(id).await.unwrap().unwrap().status, "adopted", "child {id}");
    }
}

/// A parked item whose holder never writes (it died) is woken at the holder's expiry by the heartbeater's timer,
/// and takes the rows; meanwhile the heartbeater keeps its lease.
#[tokio::test(start_paused = true)]
async fn a_parked_item_is_woken_when_the_lock_it_met_expires() {
    let clock = ManualClock::new(START);
    let store = MemStore::new(clock.clone());
    let (_, children, _) = parent_with_a_held_child(&store, Duration::from_secs(20)).await;
    let p = pipeline(&store, parking(1));
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Parked));
    let heartbeater = p.heartbeater();
    for _ in 0..19 {
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.advance(Duration::from_secs(1));
        heartbeater.run_once().await.unwrap();
        assert_eq!(p.shared.parked_len(), 1, "parked until the child's lease expires");
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    clock.advance(Duration::from_secs(2));
    let pass = heartbeater.run_once().await.unwrap();
    assert!(pass.dropped.is_empty(), "the parked lease was kept: {pass:?}");
    assert_eq!((p.shared.queue_len(), p.shared.parked_len()), (1, 0), "woken at the holder's expiry");
    assert_eq!(p.work_one(&LockChildren).await, Some(ItemOutcome::Applied));
    assert_eq!(store.get(children[0]).await.unwrap().unwrap().status, "adopted");
}

#[tokio::test(start_paused = true)]
async fn a_store_error_leaves_the_lease_to_expire_and_the_row_is_retried_after_it() {
    let clock = ManualClock::new(START);
    let store = MemStore::new(clock.clone());
    let id = insert_ready(&store, 1).await[0];
    let p = pipeline(&store, config(1));
    p.fetcher(1).run_once().await.unwrap();
    let failing = MarkDone { fail: true, ..MarkDone::default() };
    assert_eq!(p.work_one(&failing).await, Some(ItemOutcome::Failed));
    let row = store.get(id).await.unwrap().unwrap();
    assert!(row.lock_token.is_some(), "the lease stays until it expires");
    assert_eq!(row.lock_expires_at, Some(START.plus(p.config.lease_ttl)));
    assert_eq!(p.shared.leases_len(), 0, "the heartbeater no longer extends it");
    assert_eq!(p.metrics().errors, 1);
    assert_eq!((row.attempts, p.metrics().failures), (0, 0), "the store being down is not the item's failure");

    clock.advance(p.config.lease_ttl - Duration::from_secs(1));
    assert_eq!(p.fetcher(1).run_once().await.unwrap(), lockstep::pipeline::FetchPass::Fetched { fetched: 0, limit: 2 });
    clock.advance(Duration::from_secs(1));
    p.fetcher(1).run_once().await.unwrap();
    assert_eq!(p.work_one(&MarkDone::default()).await, Some(ItemOutcome::Applied));
}

fn heartbeat_config() -> PipelineConfig {
    PipelineConfig {
        lease_ttl: Duration::from_secs(10),
        lease_margin: Duration::from_secs(1),
        heartbeat_interval: Duration::from_secs(1),
        heartbeat_trigger: Duration::from_secs(5),
        ..config(4)
    }
}

#[tokio::test(start_paused = true)]
async fn the_heartbeater_extends_only_leases_close_to_expiry() {
    let store = MemStore::new(TokioClock::new(START));
    let p = pipeline(&store, heartbeat_config()); // queue max 8, low 2
    let mut fetcher = p.fetcher(1);
    // Row a is leased now (local deadline +9 s), row b 5 s later (deadline +14 s).
    // Workers take each at once (a queued item would be released instead, see the start window's tests).
    let a = insert_ready(&store, 1).await[0];
    fetcher.run_once().await.unwrap();
    p.shared.pop(&p.clock).await.unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    let b = insert_ready(&store, 1).await[0];
    fetcher.run_once().await.unwrap();
    p.shared.pop(&p.clock).await.unwrap();
    assert_eq!(p.shared.leases_len(), 2);
    let b_expiry = store.get(b).await.unwrap().unwrap().lock_expires_at;

    let pass = p.heartbeater().run_once().await.unwrap();
    let a_lease = lockstep::store::Lease { id: a, token: p.shared.leases()[&a].token };
    assert_eq!(pass.sent, vec![a_lease], "only the lease within heartbeat_trigger of its deadline");
    assert_eq!(pass.extended, vec![a_lease]);
    let now = store.now().await.unwrap();
    assert_eq!(store.get(a).await.unwrap().unwrap().lock_expires_at, Some(now.plus(Duration::from_secs(10))));
    assert_eq!(store.get(b).await.unwrap().unwrap().lock_expires_at, b_expiry, "b is not written");
    // The extension moved a's local deadline: the next pass leaves it alone.
    let pass = p.heartbeater().run_once().await.unwrap();
    assert!(pass.sent.is_empty(), "{pass:?}");
}

#[tokio::test(start_paused = true)]
async fn the_heartbeater_drops_lost_and_retokened_leases_without_writing() {
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let [a, b] = insert_ready(&store, 2).await[..] else { unreachable!() };
    let p = pipeline(&store, PipelineConfig { workers: 1, ..heartbeat_config() });
    p.fetcher(1).run_once().await.unwrap();
    // Workers took both (queued items would be released, not heartbeated).
    while p.shared.queue_len() > 0 {
        p.shared.pop(&p.clock).await.unwrap();
    }
    // Row b is re-leased by another replica after the store-side expiry (store clock ahead of ours).
    clock.advance(Duration::from_secs(11));
    let thief = pipeline(&store, PipelineConfig { workers: 1, ..heartbeat_config() });
    thief.fetcher(1).run_once().await.unwrap();
    let thief_token = store.get(b).await.unwrap().unwrap().lock_token;
    assert!(thief_token.is_some());
    // Local time: 6 s later both leases are within the trigger; a's row also went to the thief.
    tokio::time::advance(Duration::from_secs(6)).await;
    let before = store.rows();
    let pass = p.heartbeater().run_once().await.unwrap();
    assert_eq!(pass.sent.len(), 2);
    assert!(pass.extended.is_empty());
    assert_eq!(pass.dropped.len(), 2);
    assert_eq!(store.rows(), before, "a heartbeat with superseded tokens writes nothing");
    assert_eq!(p.shared.leases_len(), 0);
    let _ = a;

    // A lease whose local deadline passed is dropped without even asking the store.
    let store = MemStore::with_history(ManualClock::new(START));
    insert_ready(&store, 1).await;
    let p = pipeline(&store, PipelineConfig { workers: 1, ..heartbeat_config() });
    p.fetcher(1).run_once().await.unwrap();
    tokio::time::advance(Duration::from_secs(9)).await;
    let pass = p.heartbeater().run_once().await.unwrap();
    assert!(pass.sent.is_empty());
    assert_eq!(pass.dropped.len(), 1);
    assert!(!store.history().iter().any(|c| matches!(c.op, CommitOp::Heartbeat { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_hint_wakes_a_sleeping_fetcher_at_once() {
    let store = MemStore::new(TokioClock::new(START));
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 5 });
    let handler = MarkDone::default();
    manager.register(config(2), handler).unwrap();
    manager.start();
    // Let the fetcher find nothing a few times, so it sleeps at least 1 s per backoff.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let fetched_before = manager.metrics("tasks").unwrap().empty_fetches;
    assert!(fetched_before >= 2, "{fetched_before} empty fetches");
    let id = insert_ready(&store, 1).await[0];
    let hinted_at = tokio::time::Instant::now();
    manager.hint_fetch("task", Some(id)).await.unwrap();
    for _ in 0..1_000 {
        if store.get(id).await.unwrap().unwrap().status == "done" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(store.get(id).await.unwrap().unwrap().status, "done", "processed without waiting");
    assert_eq!(tokio::time::Instant::now(), hinted_at, "no local time passed between hint and apply");
    manager.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_hint_the_fetcher_finds_new_rows_only_after_its_backoff() {
    let store = MemStore::new(TokioClock::new(START));
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 5 });
    manager.register(config(2), MarkDone::default()).unwrap();
    manager.start();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let id = insert_ready(&store, 1).await[0];
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.get(id).await.unwrap().unwrap().status, "ready", "nothing wakes the fetcher yet");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(store.get(id).await.unwrap().unwrap().status, "done", "the backoff (≤ 6 s) ends and it fetches");
    manager.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_queued_leases_and_finishes_started_items() {
    let store = MemStore::new(TokioClock::new(START));
    let ids = insert_ready(&store, 10).await;
    let gate = Arc::new(Notify::new());
    let handler = Arc::new(MarkDone { gate: Some(gate.clone()), ..MarkDone::default() });
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(config(2), SharedHandler(handler.clone())).unwrap(); // queue max 4
    manager.start();
    while handler.started.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    let queued = manager.metrics("tasks").unwrap().queue_depth;
    assert!(queued > 0, "items wait in the queue");
    let shutdown = tokio::spawn(async move {
        let report = manager.shutdown().await;
        (manager, report)
    });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    gate.notify_waiters();
    let (_manager, report) = shutdown.await.unwrap();
    assert_eq!(report.released, queued);
    assert_eq!(handler.processed.load(Ordering::SeqCst), 2, "started items finish");
    let rows: Vec<Row> = futures_rows(&store, &ids).await;
    assert_eq!(rows.iter().filter(|r| r.status == "done").count(), 2);
    for row in &rows {
        assert_eq!((row.lock_token, row.lock_owner.as_deref()), (None, None), "row {} left leased", row.id);
    }
}

async fn futures_rows(store: &MemStore, ids: &[RowId]) -> Vec<Row> {
    let mut rows = Vec::new();
    for id in ids {
        rows.push(store.get(*id).await.unwrap().unwrap());
    }
    rows
}

struct SharedHandler(Arc<MarkDone>);

impl<S: Store> Handler<S> for SharedHandler {
    type Context = ();

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Handler::<S>::load(self.0.as_ref(), row, cx).await
    }

    async fn process(&self, row: Row, context: ()) -> Result<Changes, WorkError> {
        Handler::<S>::process(self.0.as_ref(), row, context).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_manager_processes_every_row_with_many_workers() {
    let store = MemStore::new(TokioClock::new(START));
    let ids = insert_ready(&store, 500).await;
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 3 });
    let handler = Arc::new(MarkDone::default());
    manager.register(config(8), SharedHandler(handler.clone())).unwrap();
    manager.start();
    tokio::time::sleep(Duration::from_secs(30)).await;
    manager.shutdown().await;
    assert_eq!(handler.processed.load(Ordering::SeqCst), 500, "each row processed exactly once");
    for row in futures_rows(&store, &ids).await {
        assert_eq!(row.status, "done", "row {}", row.id);
    }
}

#[test]
fn a_config_that_needs_more_connections_than_the_store_has_is_refused() {
    // MemStore is unbounded; a store with a limit is checked by the manager.
    struct Limited(MemStore);
    impl Store for Limited {
        fn fetch(&self, p: FetchParams) -> impl Future<Output = Result<Vec<Row>, lockstep::store::StoreError>> + Send {
            self.0.fetch(p)
        }
        fn refetch(
            &self,
            l: lockstep::store::Lease,
        ) -> impl Future<Output = Result<Option<Row>, lockstep::store::StoreError>> + Send {
            self.0.refetch(l)
        }
        fn heartbeat(
            &self,
            p: lockstep::store::HeartbeatParams,
        ) -> impl Future<Output = Result<Vec<lockstep::store::Lease>, lockstep::store::StoreError>> + Send {
            self.0.heartbeat(p)
        }
        fn lock_related(
            &self,
            p: lockstep::store::LockRelatedParams,
        ) -> impl Future<Output = Result<lockstep::store::LockOutcome, lockstep::store::StoreError>> + Send {
            self.0.lock_related(p)
        }
        fn apply(
            &self,
            p: lockstep::store::ApplyParams,
        ) -> impl Future<Output = Result<lockstep::store::ApplyOutcome, lockstep::store::StoreError>> + Send {
            self.0.apply(p)
        }
        fn record_failure(
            &self,
            p: lockstep::store::FailureParams,
        ) -> impl Future<Output = Result<lockstep::store::FailureOutcome, lockstep::store::StoreError>> + Send {
            self.0.record_failure(p)
        }
        fn reset_for_retry(
            &self,
            l: lockstep::store::Lease,
            delay: std::time::Duration,
        ) -> impl Future<Output = Result<bool, lockstep::store::StoreError>> + Send {
            self.0.reset_for_retry(l, delay)
        }
        fn release(
            &self,
            l: Vec<lockstep::store::Lease>,
        ) -> impl Future<Output = Result<usize, lockstep::store::StoreError>> + Send {
            self.0.release(l)
        }
        fn insert(&self, r: NewRow) -> impl Future<Output = Result<Row, lockstep::store::StoreError>> + Send {
            self.0.insert(r)
        }
        fn get(&self, id: RowId) -> impl Future<Output = Result<Option<Row>, lockstep::store::StoreError>> + Send {
            self.0.get(id)
        }
        fn list(
            &self,
            kind: &str,
            parent: Option<RowId>,
        ) -> impl Future<Output = Result<Vec<Row>, lockstep::store::StoreError>> + Send {
            self.0.list(kind, parent)
        }
        fn events(
            &self,
            row: RowId,
        ) -> impl Future<Output = Result<Vec<lockstep::store::Event>, lockstep::store::StoreError>> + Send {
            self.0.events(row)
        }
        fn update_unleased(
            &self,
            id: RowId,
            u: RowUpdate,
        ) -> impl Future<Output = Result<lockstep::store::WriteOutcome, lockstep::store::StoreError>> + Send {
            self.0.update_unleased(id, u)
        }
        fn hint(
            &self,
            kind: &str,
            row: Option<RowId>,
        ) -> impl Future<Output = Result<(), lockstep::store::StoreError>> + Send {
            self.0.hint(kind, row)
        }
        fn subscribe_hints(&self) -> tokio::sync::broadcast::Receiver<lockstep::store::Hint> {
            self.0.subscribe_hints()
        }
        fn now(&self) -> impl Future<Output = Result<Timestamp, lockstep::store::StoreError>> + Send {
            self.0.now()
        }
        fn connection_limit(&self) -> Option<usize> {
            Some(12)
        }
    }
    let store = Arc::new(Limited(MemStore::new(ManualClock::new(START))));
    let mut manager = PipelineManager::new(store, ManagerOptions::default());
    // 7 workers, 2 fetchers (the default), a heartbeater and 2 apply batches in flight (the default): the store's 12.
    manager.register(config(7), MarkDone::default()).unwrap();
    let error = manager.register(PipelineConfig { name: "more".into(), ..config(1) }, MarkDone::default());
    assert_eq!(
        error.unwrap_err().to_string(),
        "store allows 12 connections but the pipelines need 18 (workers + fetchers + heartbeater + apply batches in \
         flight each): open the store with a pool of at least 18 (PgOptions::with_pool_for(configs) sizes it for the \
         configs you register, or set PgOptions::max_connections; `serve --max-connections`), or give the pipelines \
         fewer workers"
    );
}

#[tokio::test(start_paused = true)]
async fn starting_and_stopping_a_manager_many_times_loses_no_row_and_leaks_no_lease() {
    let store = MemStore::new(TokioClock::new(START));
    let ids = insert_ready(&store, 300).await;
    let handler = Arc::new(MarkDone::default());
    for round in 0..40u64 {
        let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: round });
        manager.register(config(4), SharedHandler(handler.clone())).unwrap();
        manager.start();
        manager.hint_fetch("task", None).await.unwrap();
        for _ in 0..round % 7 {
            tokio::task::yield_now().await;
        }
        manager.shutdown().await;
        let leased = store.rows().into_iter().filter(|row| row.lock_token.is_some()).count();
        assert_eq!(leased, 0, "round {round}: a drained manager leaves no lease behind");
    }
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 99 });
    manager.register(config(4), SharedHandler(handler.clone())).unwrap();
    manager.start();
    tokio::time::sleep(Duration::from_secs(30)).await;
    manager.shutdown().await;
    assert_eq!(handler.processed.load(Ordering::SeqCst), 300, "each row processed exactly once over all rounds");
    for row in futures_rows(&store, &ids).await {
        assert_eq!(row.status, "done", "row {}", row.id);
    }
}

/// A lease ttl of 10 s with a 1 s margin and a 5 s trigger: an item queued at its fetch reaches the end of its
/// start window (ttl − margin − trigger) 4 s later.
fn start_window_config(workers: usize) -> PipelineConfig {
    PipelineConfig { workers, ..heartbeat_config() }
}

/// An item no worker started within its start window is given back to the store, not extended; the one a worker
/// started is extended; and the pipeline, now saturated, leases nothing more while no worker is idle and none
/// started an item within the window (a replica kept leases alive for rows its busy workers could not
/// start).
#[tokio::test(start_paused = true)]
async fn a_queued_item_at_the_end_of_its_start_window_is_released_and_the_pipeline_stops_leasing() {
    let store = MemStore::with_history(TokioClock::new(START));
    let [started, queued] = insert_ready(&store, 2).await[..] else { unreachable!() };
    let p = pipeline(&store, start_window_config(1)); // queue max 2, low 1
    let mut fetcher = p.fetcher(1);
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Fetched { fetched: 2, limit: 2 });
    let item = p.shared.pop(&p.clock).await.expect("a worker takes the first item");
    assert_eq!(item.lease.id, started);
    let held = p.shared.leases();
    let lease = |id: RowId| lockstep::store::Lease { id, token: held[&id].token };

    tokio::time::advance(Duration::from_secs(3)).await;
    let pass = p.heartbeater().run_once().await.unwrap();
    assert!(pass.sent.is_empty() && pass.released.is_empty(), "nothing is due 1 s before the window ends: {pass:?}");
    tokio::time::advance(Duration::from_secs(1)).await;
    let pass = p.heartbeater().run_once().await.unwrap();
    assert_eq!(pass.released, vec![lease(queued)], "the unstarted item is given back");
    assert_eq!(pass.extended, vec![lease(started)], "the started one is extended");
    assert_eq!(p.shared.queue_len(), 0);
    assert_eq!(p.shared.leases().keys().copied().collect::<Vec<_>>(), vec![started], "the released lease is forgotten");
    let row = store.get(queued).await.unwrap().unwrap();
    assert_eq!((row.lock_token, row.lock_owner, row.lock_expires_at), (None, None, None), "row {queued} released");
    assert_eq!(row.last_processed_at, None, "a release keeps the row's place in fetch order");
    assert!(p.shared.is_saturated());
    assert!(store.history().iter().any(|c| matches!(&c.op, CommitOp::Hint { kind, .. } if kind == "task")));

    // Below its lower mark with a row ready, but its one worker is busy and started nothing within the window.
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Full, "a saturated pipeline with no idle worker");
    let other = pipeline(&store, start_window_config(1));
    assert_eq!(other.fetcher(2).run_once().await.unwrap(), FetchPass::Fetched { fetched: 1, limit: 2 });
    assert_eq!(other.shared.leases().keys().copied().collect::<Vec<_>>(), vec![queued], "another replica takes it");
}

/// A saturated pipeline leases for its idle workers only, and a worker that finds the queue empty wakes the
/// fetcher for it; once its workers start items as fast as its queue's max per start window, it fetches as
/// dstack's does again.
#[tokio::test(start_paused = true)]
async fn a_saturated_pipeline_leases_for_its_idle_workers_until_they_start_items_fast_again() {
    let store = MemStore::new(TokioClock::new(START));
    insert_ready(&store, 40).await;
    let p = pipeline(&store, start_window_config(2)); // queue max 4, low 1
    p.shared.saturate();
    let mut fetcher = p.fetcher(1);
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Full, "no worker is idle");
    let _ = tokio::time::timeout(Duration::from_millis(1), p.shared.refill.notified()).await;
    let waiting = tokio::spawn({
        let (shared, clock) = (p.shared.clone(), p.clock.clone());
        async move { shared.pop(&clock).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(p.shared.idle_workers(), 1);
    let woken = tokio::time::timeout(Duration::from_millis(1), p.shared.refill.notified()).await;
    assert!(woken.is_ok(), "a worker finding the queue empty wakes the fetcher");
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Fetched { fetched: 1, limit: 1 }, "one idle worker");
    assert!(waiting.await.unwrap().is_some(), "the idle worker got the row");
    // Items started quickly: each start within the window raises the allowance, until it reaches the queue's max.
    let handler = MarkDone::default();
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Fetched { fetched: 1, limit: 1 }, "one start");
    assert_eq!(p.work_one(&handler).await, Some(ItemOutcome::Applied));
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Fetched { fetched: 2, limit: 2 }, "two starts");
    while p.work_one(&handler).await.is_some() {}
    assert!(p.shared.is_saturated());
    assert_eq!(fetcher.run_once().await.unwrap(), FetchPass::Fetched { fetched: 4, limit: 4 }, "dstack's limit");
    assert!(!p.shared.is_saturated(), "four starts within the window, the queue's max, end the saturation");
}

/// Records which replica processed which row; rows whose data says `slow` take 100 s.
struct Replica {
    name: &'static str,
    log: Arc<std::sync::Mutex<Vec<(RowId, &'static str)>>>,
}

impl<S: Store> Handler<S> for Replica {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, row: Row, _context: ()) -> Result<Changes, WorkError> {
        self.log.lock().unwrap().push((row.id, self.name));
        if row.data["slow"] == json!(true) {
            tokio::time::sleep(Duration::from_secs(100)).await;
        }
        Ok(Changes::status("done"))
    }
}

/// Two replicas of one pipeline: the first leases a slow row and a fast one with its one worker; the second,
/// idle, gets the fast row within a lease ttl instead of after the slow row's 100 s.
#[tokio::test(start_paused = true)]
async fn a_row_queued_behind_a_slow_item_goes_to_an_idle_replica_within_a_lease_ttl() {
    let store = MemStore::new(TokioClock::new(START));
    let slow = store.insert(NewRow::new("task", "ready", json!({ "slow": true }))).await.unwrap().id;
    let fast = insert_ready(&store, 1).await[0];
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut busy = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    busy.register(start_window_config(1), Replica { name: "busy", log: log.clone() }).unwrap();
    busy.start();
    while log.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    assert_eq!(log.lock().unwrap()[0], (slow, "busy"));
    assert_eq!(busy.metrics("tasks").unwrap().queue_depth, 1, "the fast row waits behind the slow one");
    let mut idle = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 2 });
    idle.register(start_window_config(1), Replica { name: "idle", log: log.clone() }).unwrap();
    idle.start();
    let started = tokio::time::Instant::now();
    while store.get(fast).await.unwrap().unwrap().status != "done" {
        assert!(started.elapsed() < Duration::from_secs(10), "the fast row waited a lease ttl");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(log.lock().unwrap()[1], (fast, "idle"));
    idle.shutdown().await;
    busy.shutdown().await;
}

/// Records when it starts each row; with `hang`, never finishes one (a replica that dies mid-item).
struct Recorder {
    started: Arc<std::sync::Mutex<Vec<(RowId, tokio::time::Instant)>>>,
    hang: bool,
}

impl<S: Store> Handler<S> for Recorder {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, row: Row, _context: ()) -> Result<Changes, WorkError> {
        self.started.lock().unwrap().push((row.id, tokio::time::Instant::now()));
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(Changes::status("done"))
    }
}

/// A replica dies holding a lease; another, idle and deep in its empty-fetch backoff, takes the row over within
/// the fetch expiry slack of the lease's expiry in the store, so within a lease ttl and 0.5 s of the death, not a
/// backoff later (takeover without waiting out a backoff).
#[tokio::test(start_paused = true)]
async fn an_idle_replica_takes_over_a_dead_replicas_lease_when_it_expires() {
    let store = MemStore::new(TokioClock::new(START));
    let config = start_window_config(1);
    let (ttl, slack) = (config.lease_ttl, config.fetch_expiry_slack);
    let started = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut survivor = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 4 });
    survivor.register(config.clone(), Recorder { started: started.clone(), hang: false }).unwrap();
    survivor.start();
    // Idle long enough that its backoff is at its longest step (5 s ± 20%).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let row = insert_ready(&store, 1).await[0];
    let mut doomed = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 5 });
    doomed.register(config, Recorder { started: started.clone(), hang: true }).unwrap();
    doomed.start();
    while started.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    // Let its heartbeater extend the lease once, then kill it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    doomed.abort();
    let killed = tokio::time::Instant::now();
    let expires = store.get(row).await.unwrap().unwrap().lock_expires_at.expect("the dead replica's lease");
    let expires_in = Duration::from_micros((expires.as_micros() - store.now().await.unwrap().as_micros()) as u64);
    while started.lock().unwrap().len() < 2 {
        assert!(killed.elapsed() <= ttl + Duration::from_secs(8), "the row was never taken over");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (taken, at) = started.lock().unwrap()[1];
    assert_eq!(taken, row);
    let after_expiry = at.duration_since(killed).saturating_sub(expires_in);
    assert!(after_expiry <= slack + Duration::from_millis(20), "taken {after_expiry:?} after the lease expired");
    assert!(at.duration_since(killed) <= ttl + Duration::from_millis(500), "taken {:?} after the death", at - killed);
    survivor.shutdown().await;
}

/// Locks the `child` rows under its row; done once it holds them all.
struct LockAllChildren;

impl<S: Store> Handler<S> for LockAllChildren {
    type Context = ();

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        let children: Vec<RowId> = cx.store().list("child", Some(row.id)).await?.iter().map(|c| c.id).collect();
        cx.lock_related(children).await
    }

    async fn process(&self, _row: Row, _context: ()) -> Result<Changes, WorkError> {
        Ok(Changes::status("done"))
    }
}

/// A parent that keeps retrying while one child is busy does not keep its other children from their idle
/// pipeline: its intent marks are not renewed by its retries, so the children's pipeline takes them as the marks
/// expire, a lease ttl after the first contended attempt (a parent re-marked its children every 0.6 s
/// for minutes while their workers idled).
#[tokio::test(start_paused = true)]
async fn a_retrying_parents_intent_marks_hold_its_children_for_one_lease_ttl_only() {
    let store = MemStore::new(TokioClock::new(START));
    let parent = store.insert(NewRow::new("parent", "ready", json!({}))).await.unwrap().id;
    let child = || NewRow::new("child", "ready", json!({})).with_parent(parent);
    let busy = store.insert(child()).await.unwrap().id;
    let free = [store.insert(child()).await.unwrap().id, store.insert(child()).await.unwrap().id];
    // The busy child is leased for good by a holder outside the test's pipelines.
    let held = FetchParams {
        pipeline: "children".into(),
        kind: "child".into(),
        statuses: vec!["ready".into()],
        limit: 1,
        lease_ttl: Duration::from_secs(3_600),
        min_processing_interval: Duration::from_secs(5),
        retry_delay: Duration::from_millis(500),
    };
    assert_eq!(store.fetch(held).await.unwrap()[0].id, busy);
    let parents_config = PipelineConfig { name: "parents".into(), kind: "parent".into(), ..start_window_config(1) };
    let ttl = parents_config.lease_ttl;
    let mut parents = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 6 });
    parents.register(parents_config, LockAllChildren).unwrap();
    parents.start();
    while store.get(free[0]).await.unwrap().unwrap().lock_owner.as_deref() != Some("parents") {
        tokio::task::yield_now().await;
    }
    let marked = tokio::time::Instant::now();
    let children_config = PipelineConfig { name: "children".into(), kind: "child".into(), ..start_window_config(1) };
    let done = Arc::new(MarkDone::default());
    let mut children = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    children.register(children_config, SharedHandler(done.clone())).unwrap();
    children.start();
    while done.processed.load(Ordering::SeqCst) < free.len() {
        assert!(marked.elapsed() <= ttl * 3, "the free children were never processed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waited = marked.elapsed();
    assert!(waited >= ttl, "a child was taken under a fresh mark after {waited:?}");
    assert!(waited <= ttl + Duration::from_millis(500), "the free children waited {waited:?}");
    let retries = parents.metrics("parents").unwrap().retries;
    assert!(retries >= 5, "the parent retried only {retries} times while its marks held");
    for id in free {
        assert_eq!(store.get(id).await.unwrap().unwrap().status, "done", "child {id}");
    }
    children.shutdown().await;
    parents.shutdown().await;
}

/// Locks the shared row `data.counter` in load, works 20 ms, then adds one to the counter: every item contends for
/// the same hot row (a new user's trial: 60 such claims took 12 s with 1 worker and 40 s with 4).
struct HotClaim;

const HOT_CLAIM_WORK: Duration = Duration::from_millis(20);

impl<S: Store> Handler<S> for HotClaim {
    type Context = Row;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<Row, WorkError> {
        let counter = RowId(row.data["counter"].as_i64().expect("a counter id"));
        let mut locked = cx.lock_and_read_shared(vec![counter]).await?;
        Ok(locked.remove(0))
    }

    async fn process(&self, _row: Row, counter: Row) -> Result<Changes, WorkError> {
        tokio::time::sleep(HOT_CLAIM_WORK).await;
        let claims = counter.data["claims"].as_i64().expect("a count") + 1;
        let update = RowUpdate { status: None, data: Some(json!({ "claims": claims })) };
        let mut changes = Changes::status("done");
        changes.related.push(lockstep::store::RelatedUpdate { id: counter.id, update });
        Ok(changes)
    }
}

/// Drains `claims` items that all lock one shared row with `workers` workers in each of `replicas` replicas (one
/// `PipelineManager` each, over one store; `no_backoff`: without the contention backoff); returns the time it took
/// (the local clock's: simulated under a paused clock), the pipelines' retries (resets after a contended lock,
/// summed over the replicas) and the counter's final count.
async fn drain_hot_claims<S: Store + Clone>(
    store: S,
    claims: usize,
    workers: usize,
    replicas: u64,
    no_backoff: bool,
) -> (Duration, u64, i64) {
    let counter = store.insert(NewRow::new("counter", "idle", json!({ "claims": 0 }))).await.unwrap().id;
    let mut ids = Vec::new();
    for _ in 0..claims {
        ids.push(store.insert(NewRow::new("task", "ready", json!({ "counter": counter.0 }))).await.unwrap().id);
    }
    let mut managers: Vec<_> = (0..replicas)
        .map(|replica| PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 5 + replica }))
        .collect();
    for manager in &mut managers {
        let config = PipelineConfig { contention_backoff_disabled_for_mutation_test: no_backoff, ..config(workers) };
        manager.register(config, HotClaim).unwrap();
    }
    let started = tokio::time::Instant::now();
    for manager in &mut managers {
        manager.start();
    }
    let deadline = started + Duration::from_secs(600);
    loop {
        let mut done = 0;
        for id in &ids {
            done += usize::from(store.get(*id).await.unwrap().unwrap().status == "done");
        }
        if done == ids.len() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{done} of {claims} claims done in 600 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let mut retries = 0;
    for mut manager in managers {
        retries += manager.metrics("tasks").unwrap().retries;
        manager.shutdown().await;
    }
    let count = store.get(counter).await.unwrap().unwrap().data["claims"].as_i64().unwrap();
    (took, retries, count)
}

fn memstore() -> MemStore {
    MemStore::new(TokioClock::new(START))
}

#[tokio::test(start_paused = true)]
async fn items_contending_for_one_hot_row_in_one_replica_take_turns_without_resets() {
    for workers in [1, 4] {
        let (took, retries, count) = drain_hot_claims(memstore(), 60, workers, 1, false).await;
        assert_eq!(count, 60, "{workers} workers: every claim counted once");
        // 60 claims of 20 ms each in turn is 1.2 s; each turn also waits for its predecessor's apply.
        assert!(took < Duration::from_secs(3), "{workers} workers: 60 claims took {took:?} (retries {retries})");
        assert_eq!(retries, 0, "{workers} workers: items of one replica wait for each other, not reset");
    }
}

/// Replicas that meet on one hot row: the replica that lost the row backs its fetcher off after a full queue's worth
/// of its items were turned away (`Shared::backs_off_for_contention`), and the holder's replica drains the backlog
/// at the one-replica pace. Before, the losing replica leased and reset the whole backlog within the first instant
/// (its resets looked like workers outrunning the fetch, so its queue doubled), every reset kept its row from both
/// replicas for `retry_delay`, and the hot row idled: 600 claims took 26.4 s with 8 406 resets on two replicas of one
/// worker against 12.0 s on one (BENCHMARKS.md, "Contention on one hot shared row").
#[tokio::test(start_paused = true)]
async fn hot_row_across_replicas_drains_at_the_one_replica_pace() {
    let (alone, retries, count) = drain_hot_claims(memstore(), 600, 1, 1, false).await;
    assert_eq!((retries, count), (0, 600));
    for (workers, replicas) in [(1, 2), (4, 2), (1, 3)] {
        let (took, retries, count) = drain_hot_claims(memstore(), 600, workers, replicas, false).await;
        let case = format!("{replicas} replicas of {workers} workers");
        assert_eq!(count, 600, "{case}: every claim counted once");
        assert!(took.as_secs_f64() <= alone.as_secs_f64() * 1.1, "{case}: {took:?} against {alone:?} alone");
        assert!(retries <= 300, "{case}: {retries} resets");
    }
    let (took, retries, _) = drain_hot_claims(memstore(), 600, 1, 2, true).await;
    assert!(took.as_secs_f64() >= alone.as_secs_f64() * 1.5, "without the backoff: {took:?} against {alone:?}");
    assert!(retries >= 2_000, "without the backoff: {retries} resets");
}

/// The same drain on PostgreSQL, two replicas of one worker, in wall time: the losing replica backs off, so the
/// claims meet the other replica's holder a few times, not once per claim and turn. Before the backoff a trial
/// measured 600 claims at 30.9 s against 12.0 s on one replica; here 100 claims, judged by resets (the machine's
/// load moves the times): at most one per claim with the backoff, at least that many without it.
#[tokio::test]
async fn hot_row_across_replicas_on_postgres_resets_a_few_claims_not_each() {
    let claims = 100;
    for (no_backoff, what) in [(false, "with the backoff"), (true, "without it")] {
        let harness = support::pg::PgHarness::new().await;
        let store = lockstep::store::conformance::Harness::store(&harness).clone();
        let (took, retries, count) = drain_hot_claims(store, claims, 1, 2, no_backoff).await;
        assert_eq!(count, claims as i64, "{what}: every claim counted once");
        eprintln!("{what}: {claims} claims in {took:?}, {retries} resets");
        if no_backoff {
            assert!(retries >= claims as u64, "{what}: only {retries} resets");
        } else {
            assert!(retries < claims as u64, "{what}: {retries} resets");
        }
    }
}

/// Locks the row `data.peer` as shared in load (each item of a ring locks the next item's own row).
struct LockPeer;

impl<S: Store> Handler<S> for LockPeer {
    type Context = ();

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        cx.lock_shared(vec![RowId(row.data["peer"].as_i64().expect("a peer id"))]).await
    }

    async fn process(&self, _row: Row, _context: ()) -> Result<Changes, WorkError> {
        tokio::time::sleep(HOT_CLAIM_WORK).await;
        Ok(Changes::status("done"))
    }
}

/// Items of one pipeline that lock each other's rows as shared finish: a shared lock takes a row its own pipeline
/// reset for retry. Before, each found the other's reset mark (owner = the pipeline's name, no expiry) and never
/// finished (a new user's trial: 0 of 2 done after 120 s, 244 resets; the same on PostgreSQL).
#[tokio::test(start_paused = true)]
async fn items_that_lock_each_others_rows_as_shared_finish() {
    for (items, workers) in [(2, 1), (2, 4), (3, 4)] {
        let store = MemStore::new(TokioClock::new(START));
        let ids = insert_ready(&store, items).await;
        for (i, id) in ids.iter().enumerate() {
            let row = store.get(*id).await.unwrap().unwrap();
            let peer = ids[(i + 1) % items];
            let update = RowUpdate { status: None, data: Some(json!({ "peer": peer.0 })) };
            let lease = store.fetch(FetchParams {
                pipeline: "setup".into(),
                kind: "task".into(),
                statuses: vec!["ready".into()],
                limit: 1,
                lease_ttl: Duration::from_secs(30),
                min_processing_interval: Duration::ZERO,
                retry_delay: Duration::from_millis(500),
            });
            let leased = lease.await.unwrap();
            assert_eq!(leased[0].id, row.id);
            let lease = lockstep::store::Lease { id: row.id, token: leased[0].lock_token.unwrap() };
            let params = lockstep::store::ApplyParams::new(lease, update);
            store.apply(params).await.unwrap();
        }
        let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
        manager.register(config(workers), LockPeer).unwrap();
        manager.start();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while futures_rows(&store, &ids).await.iter().any(|row| row.status != "done") {
            let now = tokio::time::Instant::now();
            assert!(now < deadline, "{items} items, {workers} workers: a ring of shared locks did not finish in 60 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        manager.shutdown().await;
    }
}

/// Two pipelines of the default config need 50 connections, twice the default pool: on a store of the default
/// options the second is refused (the error names `with_pool_for`), and on one whose pool `PgOptions::with_pool_for`
/// sized from both configs, both register and run. A new user's trial: the example project's production binary
/// could not start its two pipelines on a default `PgStore`.
#[tokio::test]
async fn two_default_pipelines_run_on_a_postgres_store_sized_for_them() {
    let lines = PipelineConfig::new("lines", "line", &["ready"]);
    let orders = PipelineConfig::new("orders", "order", &["ready"]);
    let harness = support::pg::PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let mut manager = PipelineManager::new(Arc::new(store), ManagerOptions { seed: 1 });
    manager.register(lines.clone(), MarkDone::default()).expect("one default pipeline fits the default pool");
    let error = manager.register(orders.clone(), MarkDone::default()).unwrap_err().to_string();
    assert!(error.contains("pool of at least 50 (PgOptions::with_pool_for(configs)"), "{error}");

    let harness = support::pg::PgHarness::with(|options| {
        *options = options.clone().with_pool_for([&lines, &orders]);
    })
    .await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let mut ids = Vec::new();
    for kind in ["line", "order"] {
        ids.push(store.insert(NewRow::new(kind, "ready", json!({}))).await.unwrap().id);
    }
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(lines, MarkDone::default()).expect("lines on a pool sized for both");
    manager.register(orders, MarkDone::default()).expect("orders on a pool sized for both");
    manager.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for id in ids {
        while store.get(id).await.unwrap().is_none_or(|row| row.status != "done") {
            assert!(std::time::Instant::now() < deadline, "row {id} not done within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    manager.shutdown().await;
}

/// A pipeline of the default config runs on a store of the default options: the default pool
/// (`PgOptions::MAX_CONNECTIONS_DEFAULT`, 25) holds the default pipeline's 20 workers, 2 fetchers, heartbeater and
/// 2 apply batches in flight.
/// A new user's trial: with the pool at 11 the manager refused the default pipeline at register.
#[tokio::test]
async fn a_default_pipeline_runs_on_a_postgres_store_of_the_default_options() {
    let harness = support::pg::PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let ids = insert_ready(&store, 5).await;
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    let config = PipelineConfig::new("tasks", "task", &["ready"]);
    assert!(config.connections_needed() > 11, "the default pipeline needs more than the old pool");
    manager.register(config, MarkDone::default()).expect("a default pipeline on a default store");
    manager.start();
    manager.hint_fetch("task", None).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows = store.list("task", None).await.unwrap();
        if rows.iter().all(|row| row.status == "done") {
            assert_eq!(rows.len(), ids.len());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "rows not done within 60 s: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    manager.shutdown().await;
}
