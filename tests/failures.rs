//! Items that fail (DESIGN §2 and §3, failures): a failure is recorded on its row at once and the row
//! backs off, gives up after its pipeline's last attempt, or as its handler decides; a panicking handler fails its
//! item, not its worker; a row whose apply the store refuses fails alone while the rows batched with it go on.
//! Single passes on MemStore with a manual store clock and tokio's paused clock; the poison-row run on MemStore
//! and on PostgreSQL.
#![cfg(not(madsim))]

use crate::support;

use lockstep::pipeline::{
    Changes, Failure, Handler, ItemOutcome, LoadCx, ManagerOptions, Pipeline, PipelineConfig, PipelineManager,
    RetryDecision, RetryPolicy, WorkError,
};
use lockstep::store::{
    CommitOp, ManualClock, MemStore, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store, Timestamp, TokioClock,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::pg::PgHarness;

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

async fn get<S: Store>(store: &S, id: RowId) -> Row {
    store.get(id).await.unwrap().unwrap_or_else(|| panic!("row {id} vanished"))
}

/// What a row's pass does, by the row's `data.do`: `"fail"`, `"fail-once"` (fails its first attempt), `"sleep"` (waits
/// `data.sleep_ms`, then marks the row done), `"panic"`, `"hang"` (never returns), `"block"` (blocks
/// its thread until the test sets `released`, then marks the row done), `"nul"` (writes a value PostgreSQL cannot store),
/// `"orphan"` (inserts a child under `data.parent`, which names no row: DESIGN §2, "Parents"), `"hopeless"` (fails with an error its [`Handler::retry`] gives up on at once), `"unlocked"` (updates
/// the row `data.other` without having locked it) or `"lock-self"` (locks its own row as a shared related row in
/// `load`); anything else marks the row done. Counts its passes.
#[derive(Default)]
struct Scripted {
    passes: AtomicUsize,
    /// Set by a test to let a `"block"` handler return.
    released: std::sync::atomic::AtomicBool,
}

impl<S: Store> Handler<S> for Scripted {
    type Context = ();

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        if row.data["do"] == "lock-self" {
            cx.lock_shared(vec![row.id]).await?;
        }
        Ok(())
    }

    async fn process(&self, row: Row, _: ()) -> Result<Changes, WorkError> {
        self.passes.fetch_add(1, Ordering::SeqCst);
        match row.data["do"].as_str() {
            Some("fail") => Err(WorkError::Failed(format!("row {} failed on purpose", row.id))),
            Some("fail-once") if row.attempts == 0 => Err(WorkError::Failed(format!("row {} failed once", row.id))),
            Some("sleep") => {
                tokio::time::sleep(Duration::from_millis(row.data["sleep_ms"].as_u64().unwrap())).await;
                Ok(Changes::status("done"))
            }
            Some("hopeless") => Err(WorkError::Failed("hopeless: the spec names no command".into())),
            Some("panic") => panic!("row {} panicked on purpose", row.id),
            Some("hang") => std::future::pending().await,
            Some("block") => {
                // Blocks its thread (a handler calling blocking code), so its worker's timer cannot fire, until the
                // test releases it: a wait on the test's condition, not on a time a loaded machine may outrun.
                let started = std::time::Instant::now();
                while !self.released.load(Ordering::SeqCst) {
                    assert!(started.elapsed() < Duration::from_secs(120), "the blocked handler was never released");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(Changes::status("done"))
            }
            Some("nul") => Ok(Changes {
                update: RowUpdate { status: Some("done".into()), data: Some(json!({ "log": "a\u{0}b" })) },
                ..Changes::default()
            }),
            Some("orphan") => {
                let parent = RowId(row.data["parent"].as_i64().unwrap());
                let mut changes = Changes::status("done");
                changes.inserts.push(NewRow::new("child", "ready", json!({})).with_parent(parent));
                Ok(changes)
            }
            Some("unlocked") => Ok(Changes {
                related: vec![RelatedUpdate {
                    id: RowId(row.data["other"].as_i64().unwrap()),
                    update: RowUpdate::status("x"),
                }],
                ..Changes::status("done")
            }),
            _ => Ok(Changes::status("done")),
        }
    }

    fn retry(&self, failure: &Failure<'_>) -> RetryDecision {
        match failure.error {
            WorkError::Failed(message) if message.starts_with("hopeless") => RetryDecision::GiveUp,
            _ => RetryDecision::Policy,
        }
    }
}

/// A MemStore on a manual clock, one row doing `what`, and a pipeline of one worker over it.
async fn one_row(what: &str) -> (ManualClock, MemStore, RowId, Pipeline<MemStore>) {
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let id = store.insert(NewRow::new("task", "ready", json!({ "do": what }))).await.unwrap().id;
    let pipeline = Pipeline::new(Arc::new(store.clone()), config(1)).unwrap();
    (clock, store, id, pipeline)
}

async fn fetch_and_work(p: &Pipeline<MemStore>, handler: &Scripted) -> Option<ItemOutcome> {
    p.fetcher(1).run_once().await.unwrap();
    p.work_one(handler).await
}

#[tokio::test(start_paused = true)]
async fn a_handler_failure_is_recorded_at_once_and_the_row_backs_off() {
    let (clock, store, id, p) = one_row("fail").await;
    let handler = Scripted::default();
    assert_eq!(fetch_and_work(&p, &handler).await, Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!((row.lock_token, row.lock_owner.as_deref()), (None, None), "the lease was not given back");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.errors.len(), 1);
    assert_eq!(row.errors[0].error, format!("row {id} failed on purpose"));
    let not_before = row.not_before.expect("a backoff");
    let delay = Duration::from_micros((not_before.as_micros() - START.as_micros()) as u64);
    let base = p.config.retry.backoff_base;
    assert!(delay >= base.mul_f64(0.8) && delay <= base.mul_f64(1.2), "first backoff {delay:?} from base {base:?}");
    assert_eq!((p.metrics().failures, p.metrics().errors, p.metrics().gave_up), (1, 0, 0));
    // Not before its time, even hinted; then retried, and a success resets the count.
    store.hint("task", Some(id)).await.unwrap();
    clock.advance(delay - Duration::from_millis(1));
    assert_eq!(fetch_and_work(&p, &handler).await, None, "row {id} fetched inside its backoff");
    clock.advance(Duration::from_millis(1));
    store.update_unleased(id, RowUpdate { status: None, data: Some(json!({ "do": "succeed" })) }).await.unwrap();
    assert_eq!(fetch_and_work(&p, &handler).await, Some(ItemOutcome::Applied));
    assert_eq!(get(&store, id).await.attempts, 0, "an apply resets the attempts");
}

#[tokio::test(start_paused = true)]
async fn after_attempts_max_the_row_takes_the_failed_status() {
    let (clock, store, id, mut p) = one_row("fail").await;
    let mut config = (*p.config).clone();
    config.retry = RetryPolicy { attempts_max: Some(3), jitter: 0.0, ..RetryPolicy::default() };
    p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    let handler = Scripted::default();
    for attempt in 1..=2u32 {
        assert_eq!(fetch_and_work(&p, &handler).await, Some(ItemOutcome::BackedOff), "attempt {attempt}");
        clock.advance(p.config.retry.backoff(attempt, 0.0));
    }
    assert_eq!(fetch_and_work(&p, &handler).await, Some(ItemOutcome::GaveUp), "attempt 3");
    let row = get(&store, id).await;
    assert_eq!((row.status.as_str(), row.attempts, row.errors.len()), ("failed", 3, 3));
    assert_eq!((row.lock_owner, row.not_before), (None, None));
    clock.advance(Duration::from_secs(3600));
    assert_eq!(fetch_and_work(&p, &handler).await, None, "a row that gave up is fetched again");
    assert_eq!((p.metrics().failures, p.metrics().gave_up), (3, 1));
    let delays: Vec<Timestamp> =
        store.history().iter().filter_map(|c| matches!(c.op, CommitOp::Failure { .. }).then_some(c.at)).collect();
    assert_eq!(delays, vec![START, START.plus(Duration::from_secs(1)), START.plus(Duration::from_secs(3))]);
}

#[tokio::test(start_paused = true)]
async fn the_retry_hook_gives_up_at_once_on_an_error_it_names() {
    let (_clock, store, id, p) = one_row("hopeless").await;
    assert_eq!(fetch_and_work(&p, &Scripted::default()).await, Some(ItemOutcome::GaveUp));
    let row = get(&store, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("failed", 1));
    assert!(row.errors[0].error.starts_with("hopeless"), "{:?}", row.errors);
}

#[tokio::test(start_paused = true)]
async fn a_panic_fails_its_item_with_the_panic_recorded() {
    let (_clock, store, id, p) = one_row("panic").await;
    assert_eq!(fetch_and_work(&p, &Scripted::default()).await, Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.errors[0].error, format!("handler panicked: row {id} panicked on purpose"));
    assert_eq!((p.metrics().panics, p.metrics().failures), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_apply_the_store_refuses_fails_its_item_and_keeps_no_lease() {
    let (_clock, store, id, p) = one_row("nul").await;
    assert_eq!(fetch_and_work(&p, &Scripted::default()).await, Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!((row.status.as_str(), row.attempts, row.lock_token), ("ready", 1, None));
    assert!(row.errors[0].error.contains("\\u0000"), "{:?}", row.errors);
}

/// A handler that never returns fails its item at its pipeline's `handler_timeout` (within a heartbeat interval):
/// the failure is recorded on the row, which backs off, and the lease goes back, instead of the item holding its
/// row (and its worker) for ever.
#[tokio::test(start_paused = true)]
async fn a_handler_that_never_returns_fails_its_item_at_its_handler_timeout() {
    let (_clock, store, id, p) = one_row("hang").await;
    assert_eq!(p.config.handler_timeout, lockstep::pipeline::config::HANDLER_TIMEOUT_DEFAULT);
    p.fetcher(1).run_once().await.unwrap();
    let worker = {
        let p = p.clone();
        tokio::spawn(async move { p.work_one(&Scripted::default()).await })
    };
    // The heartbeater's passes (one per interval) give the handler up once its time-out passed.
    let (heartbeater, started) = (p.heartbeater(), tokio::time::Instant::now());
    let bound = p.config.handler_timeout + p.config.heartbeat_interval;
    while !worker.is_finished() {
        assert!(started.elapsed() <= bound, "the hanging handler still holds its item after {:?}", started.elapsed());
        heartbeater.run_once().await.unwrap();
        tokio::time::sleep(p.config.heartbeat_interval).await;
    }
    assert!(started.elapsed() >= p.config.handler_timeout, "given up after {:?}", started.elapsed());
    assert_eq!(worker.await.unwrap(), Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!((row.attempts, row.lock_token), (1, None));
    assert_eq!(row.errors[0].error, "the handler did not return within its handler_timeout (60s)");
    assert_eq!(p.metrics().leases_held, 0, "the pipeline still holds the lease");
}

/// A handler that blocks its thread past its `handler_timeout` (so not even its worker's timer can end it) loses
/// its lease renewals: the heartbeater withholds them, the lease expires, another fetch takes the row, and the
/// blocked handler's late result, once the test releases it, is found stale. Real time: the handler blocks a
/// runtime thread until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_past_its_handler_timeout_gets_no_more_lease_renewals() {
    // Long enough that the first heartbeat pass falls within it on a loaded machine.
    const HANDLER_TIMEOUT: Duration = Duration::from_secs(2);
    let clock = ManualClock::new(START);
    let store = MemStore::with_history(clock.clone());
    let id = store.insert(NewRow::new("task", "ready", json!({ "do": "block" }))).await.unwrap().id;
    // A lease extended at every pass: its local deadline is always within the trigger.
    let lease_ttl = Duration::from_secs(10);
    let config = PipelineConfig {
        handler_timeout: HANDLER_TIMEOUT,
        heartbeat_trigger: Duration::from_millis(7_999),
        lease_margin: Duration::from_secs(2),
        ..config(1).with_lease_ttl(lease_ttl)
    };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let handler = Arc::new(Scripted::default());
    // Released whatever happens: a failing assertion must not leave a runtime thread blocked.
    struct Release(Arc<Scripted>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.released.store(true, Ordering::SeqCst);
        }
    }
    let release = Release(handler.clone());
    let worker = {
        let (p, handler) = (p.clone(), handler.clone());
        tokio::spawn(async move { p.work_one(&Shared(handler)).await })
    };
    let heartbeater = p.heartbeater();
    // While the handler runs within its bound, its lease is extended: the first pass that finds the lease within
    // its trigger (a millisecond after the fetch: the trigger is the ttl less the margin, less 1 ms) extends it.
    let started = std::time::Instant::now();
    while handler.passes.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the handler never started");
        tokio::task::yield_now().await;
    }
    let pass = loop {
        let pass = heartbeater.run_once().await.unwrap();
        if !pass.sent.is_empty() || !pass.withheld.is_empty() {
            break pass;
        }
        assert!(started.elapsed() < HANDLER_TIMEOUT, "no heartbeat pass took up the lease: {pass:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!((pass.extended.len(), pass.withheld.len()), (1, 0), "{pass:?}");
    // Past its bound, no more.
    let withheld = loop {
        let pass = heartbeater.run_once().await.unwrap();
        if !pass.withheld.is_empty() {
            break pass;
        }
        assert!(
            started.elapsed() < HANDLER_TIMEOUT + Duration::from_secs(30),
            "the lease is still renewed {:?} after the handler started",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(withheld.extended, Vec::new(), "{withheld:?}");
    // The lease expires in the store and another fetch takes the row; the late result is stale.
    clock.advance(lease_ttl);
    let other = Pipeline::new(Arc::new(store.clone()), (*p.config).clone()).unwrap();
    let fetched = other.fetcher(2).run_once().await.unwrap();
    assert!(matches!(fetched, lockstep::pipeline::FetchPass::Fetched { fetched: 1, .. }), "{fetched:?}");
    drop(release);
    assert_eq!(worker.await.unwrap(), Some(ItemOutcome::Stale));
    assert_eq!(get(&store, id).await.status, "ready", "the blocked handler's late result was applied");
}

/// A drain ends within its bound whatever a pass does: with a handler that never returns (and no handler time-out)
/// the drain would wait for ever; `shutdown_within` aborts every task at its bound and says so.
#[tokio::test(start_paused = true)]
async fn a_drain_ends_within_its_bound_while_a_pass_never_ends() {
    const BOUND: Duration = Duration::from_secs(5);
    let store = MemStore::new(TokioClock::new(START));
    insert_ready(&store, 1).await;
    store.update_unleased(RowId(1), RowUpdate { status: None, data: Some(json!({ "do": "hang" })) }).await.unwrap();
    let handler = Arc::new(Scripted::default());
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    let config = PipelineConfig { handler_timeout: Duration::ZERO, ..config(1) };
    manager.register(config, Shared(handler.clone())).unwrap();
    manager.start();
    wait_until("the pass started", 1000, || async { handler.passes.load(Ordering::SeqCst) == 1 }).await;
    let started = tokio::time::Instant::now();
    let drained = tokio::time::timeout(BOUND * 10, manager.shutdown_within(BOUND)).await;
    let drained = drained.unwrap_or_else(|_| panic!("the drain still runs {:?} after its bound", BOUND * 10));
    assert_eq!(drained, None, "a drain whose pass never ends reports no clean stop");
    assert!(started.elapsed() <= BOUND + Duration::from_millis(10), "stopped after {:?}", started.elapsed());
    assert_eq!(get(&store, RowId(1)).await.status, "ready");
}

/// A handler that updates a related row it never locked fails its item with an error that names the row, instead
/// of an apply the store refuses as stale at every pass, with nothing recorded (a new user's trial).
#[tokio::test(start_paused = true)]
async fn a_related_update_of_a_row_not_locked_fails_its_item_naming_the_row() {
    let (_clock, store, id, p) = one_row("unlocked").await;
    let other = store.insert(NewRow::new("note", "free", json!({}))).await.unwrap().id;
    store
        .update_unleased(id, RowUpdate { status: None, data: Some(json!({ "do": "unlocked", "other": other.0 })) })
        .await
        .unwrap();
    assert_eq!(fetch_and_work(&p, &Scripted::default()).await, Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!((row.status.as_str(), row.attempts, row.lock_token), ("ready", 1, None));
    assert!(
        row.errors[0].error.starts_with(&format!("related row {other} is not locked by this lease")),
        "{:?}",
        row.errors
    );
    assert_eq!(get(&store, other).await.status, "free", "row {other} was written");
}

/// A handler that locks its item's own row as a related row fails at once, naming the row, with no store call
/// made for the lock: before, a contended lock left an intent mark on the item's own row, which kept its own
/// pipeline off it for a lease ttl (a new user's trial).
#[tokio::test(start_paused = true)]
async fn locking_the_items_own_row_as_a_related_row_fails_the_item() {
    let (_clock, store, id, p) = one_row("lock-self").await;
    assert_eq!(fetch_and_work(&p, &Scripted::default()).await, Some(ItemOutcome::BackedOff));
    let row = get(&store, id).await;
    assert_eq!((row.attempts, row.lock_token, row.lock_owner.as_deref()), (1, None, None));
    let expected = format!("related rows include the item's own row {id}");
    assert!(row.errors[0].error.starts_with(&expected), "{:?}", row.errors);
    let locks = store.history().iter().filter(|c| matches!(c.op, CommitOp::LockRelated { .. })).count();
    assert_eq!(locks, 0, "a lock call reached the store");
}

/// A manager of `workers` workers (apply batching on, as by default) over `store`, running `handler`.
fn manager<S: Store + Clone>(store: &S, workers: usize, handler: Arc<Scripted>) -> PipelineManager<S> {
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    manager.register(config(workers), Shared(handler)).unwrap();
    manager.start();
    manager
}

struct Shared(Arc<Scripted>);

impl<S: Store> Handler<S> for Shared {
    type Context = ();

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Handler::<S>::load(self.0.as_ref(), row, cx).await
    }

    async fn process(&self, row: Row, context: ()) -> Result<Changes, WorkError> {
        Handler::<S>::process(self.0.as_ref(), row, context).await
    }

    fn retry(&self, failure: &Failure<'_>) -> RetryDecision {
        Handler::<S>::retry(self.0.as_ref(), failure)
    }
}

/// Polls, every 10 ms of the local clock for at most `polls` times, until `done` holds; panics naming `what`.
async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, polls: usize, mut done: impl FnMut() -> F) {
    for _ in 0..polls {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within {polls} polls");
}

async fn statuses<S: Store>(store: &S) -> BTreeMap<RowId, Row> {
    store.list("task", None).await.unwrap().into_iter().map(|row| (row.id, row)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_fails_its_item_and_its_worker_goes_on() {
    let store = MemStore::new(TokioClock::new(START));
    let mut ids = Vec::new();
    for what in ["panic", "panic", "done", "panic", "done", "done", "done", "done"] {
        ids.push(store.insert(NewRow::new("task", "ready", json!({ "do": what }))).await.unwrap().id);
    }
    let handler = Arc::new(Scripted::default());
    let mut manager = manager(&store, 1, handler.clone());
    manager.hint_fetch("task", None).await.unwrap();
    let done = || async { statuses(&store).await.values().filter(|row| row.status == "done").count() == 5 };
    wait_until("five good rows done by the one worker", 500, done).await;
    let rows = statuses(&store).await;
    for id in [ids[0], ids[1], ids[3]] {
        assert_eq!((rows[&id].status.as_str(), rows[&id].attempts), ("ready", 1), "panicking row {id}");
    }
    assert_eq!(manager.metrics("tasks").unwrap().panics, 3);
    manager.shutdown().await;
}

/// One poison row (its apply writes a NUL, or with `orphan` inserts a row under a parent that does not exist) among
/// 100 good ones, on `store`: the 100 finish in their first pass, none waits out a lease (no store error, each
/// fetched once), and the poison row fails alone (its apply batch failed whole and was sent again item by item),
/// recorded with the reason, backing off rather than looping. Returns the store time the run took.
async fn one_poison_row_among_a_hundred_fails_alone<S: Store + Clone>(store: S, orphan: bool) -> Duration {
    let good = insert_ready(&store, 50).await;
    let (data, reason) = match orphan {
        false => (json!({ "do": "nul" }), "data.log contains \\u0000".to_string()),
        true => {
            let parent = good[49].0 + 1_000_000;
            (json!({ "do": "orphan", "parent": parent }), format!("inserts[0]: parent_id {parent} names no row"))
        }
    };
    let poison = store.insert(NewRow::new("task", "ready", data)).await.unwrap().id;
    let more = insert_ready(&store, 50).await;
    let started = store.now().await.unwrap();
    let handler = Arc::new(Scripted::default());
    let mut manager = manager(&store, 8, handler.clone());
    manager.hint_fetch("task", None).await.unwrap();
    let done = || async { statuses(&store).await.values().filter(|row| row.status == "done").count() == 100 };
    wait_until("the 100 good rows done", 3000, done).await;
    let took = store.now().await.unwrap();
    // After the drain: a worker counts its apply once the apply's reply is back, which can be after its row reads
    // done (a loaded run read 95 of 100).
    manager.shutdown().await;
    let metrics = manager.metrics("tasks").unwrap();
    let rows = statuses(&store).await;
    for id in good.iter().chain(&more) {
        assert_eq!((rows[id].status.as_str(), rows[id].attempts), ("done", 0), "good row {id}");
    }
    let row = &rows[&poison];
    assert_eq!(row.status, "ready", "the poison row {poison} was written");
    assert!(row.attempts >= 1, "the poison row's failure was not recorded");
    assert!(row.errors[0].error.contains(&reason), "reason recorded: {:?}", row.errors);
    assert_eq!(metrics.errors, 0, "a lease was left to expire");
    assert_eq!(metrics.applied, 100, "good rows applied");
    assert_eq!(metrics.fetched, 100 + row.attempts as u64, "each good row leased once, the poison one per attempt");
    assert!(row.attempts <= 4, "the poison row looped: {} attempts", row.attempts);
    Duration::from_micros((took.as_micros() - started.as_micros()) as u64)
}

#[tokio::test(start_paused = true)]
async fn one_poison_row_among_a_hundred_fails_alone_on_memstore() {
    let store = MemStore::new(TokioClock::new(START));
    let took = one_poison_row_among_a_hundred_fails_alone(store, false).await;
    assert!(took < config(8).lease_ttl / 10, "the good rows took {took:?} of store time");
}

#[tokio::test(start_paused = true)]
async fn one_row_inserting_under_a_missing_parent_among_a_hundred_fails_alone_on_memstore() {
    let store = MemStore::new(TokioClock::new(START));
    let took = one_poison_row_among_a_hundred_fails_alone(store, true).await;
    assert!(took < config(8).lease_ttl / 10, "the good rows took {took:?} of store time");
}

#[tokio::test]
async fn one_row_inserting_under_a_missing_parent_among_a_hundred_fails_alone_on_postgres() {
    let harness = PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let took = one_poison_row_among_a_hundred_fails_alone(store, true).await;
    assert!(took < config(8).lease_ttl / 2, "the good rows took {took:?} of store time");
}

#[tokio::test]
async fn one_poison_row_among_a_hundred_fails_alone_on_postgres() {
    let harness = PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let took = one_poison_row_among_a_hundred_fails_alone(store, false).await;
    assert!(took < config(8).lease_ttl / 2, "the good rows took {took:?} of store time");
}

/// Runs a pipeline of one worker whose fetcher backs off 30 s after its second empty fetch, with `retry` (jitter
/// off), until row `id`, which fails every attempt, gives up: at most `polls` polls 10 ms apart.
async fn run_until_given_up<S: Store + Clone>(store: &S, id: RowId, retry: &RetryPolicy, polls: usize) {
    let config = PipelineConfig {
        workers: 1,
        fetch_backoff: vec![Duration::from_millis(500), Duration::from_secs(30)],
        fetch_jitter: 0.0,
        fetch_shortest_chance: 0.0,
        retry: RetryPolicy { jitter: 0.0, ..retry.clone() },
        ..PipelineConfig::new("tasks", "task", &["ready"])
    };
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    manager.register(config, Shared(Arc::new(Scripted::default()))).unwrap();
    manager.start();
    manager.hint_fetch("task", None).await.unwrap();
    let gave_up = || async { get(store, id).await.status == "failed" };
    wait_until("the failing row gave up", polls, gave_up).await;
    manager.shutdown().await;
}

/// A failed row is fetched again when its retry falls due, not when the fetcher's empty-fetch backoff next ends
/// (a new user's trial: a panicking handler's 1 s retry waited 3.6 s). The pipeline backs off 30 s after its second
/// empty fetch, so only a wake at the row's retry time fetches it again within the slack of it: each retry's fetch
/// comes after its delay (1, 2, 4 s, no jitter) and at most 100 ms later.
#[tokio::test(start_paused = true)]
async fn a_failed_row_is_fetched_again_when_its_retry_falls_due_not_a_fetch_backoff_later() {
    let store = MemStore::with_history(TokioClock::new(START));
    let id = store.insert(NewRow::new("task", "ready", json!({ "do": "fail" }))).await.unwrap().id;
    let retry = RetryPolicy { attempts_max: Some(4), jitter: 0.0, ..RetryPolicy::default() };
    run_until_given_up(&store, id, &retry, 20_000).await;
    let history = store.history();
    let fetched = |c: &lockstep::store::Commit| matches!(&c.op, CommitOp::Fetch { leases, .. } if leases.iter().any(|l| l.id == id));
    let fetches: Vec<Timestamp> = history.iter().filter(|c| fetched(c)).map(|c| c.at).collect();
    let failures: Vec<Timestamp> =
        history.iter().filter_map(|c| matches!(c.op, CommitOp::Failure { .. }).then_some(c.at)).collect();
    assert_eq!((fetches.len(), failures.len()), (4, 4), "fetches {fetches:?}, failures {failures:?}");
    for attempt in 1..=3u32 {
        let delay = retry.backoff(attempt, 0.0);
        let (failed, next) = (failures[attempt as usize - 1], fetches[attempt as usize]);
        let waited = Duration::from_micros((next.as_micros() - failed.as_micros()) as u64);
        assert!(
            waited >= delay && waited <= delay + Duration::from_millis(100),
            "attempt {attempt} failed at {failed}, fetched again {waited:?} later, its retry delay {delay:?}"
        );
    }
}

/// The same on PostgreSQL, in wall time: a row failing its first two attempts with 1.2 and 2.4 s delays gives up
/// (attempts_max 3) in about 3.6 s of store time, where waiting for the empty-fetch backoff would take over 30 s
/// (the fetcher's second empty fetch, 1 s after the first failure, comes before the row is due). The bound (10 s)
/// leaves a loaded machine room.
#[tokio::test]
async fn a_failed_row_is_fetched_again_when_its_retry_falls_due_on_postgres() {
    let harness = PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let id = store.insert(NewRow::new("task", "ready", json!({ "do": "fail" }))).await.unwrap().id;
    let retry =
        RetryPolicy { attempts_max: Some(3), backoff_base: Duration::from_millis(1_200), ..RetryPolicy::default() };
    let started = store.now().await.unwrap();
    run_until_given_up(&store, id, &retry, 6_000).await;
    let took = store.now().await.unwrap();
    let took = Duration::from_micros((took.as_micros() - started.as_micros()) as u64);
    assert!(took < Duration::from_secs(10), "three attempts took {took:?} of store time");
}

/// A retry that falls due on a replica with no room to fetch is handed to a replica with an idle worker by a fetch
/// hint, not left to the first replica's next free worker (the swarm saw claims fetched up to 0.5 s past
/// their retry while another replica's worker idled). Replica `busy` (one worker, a queue of two) fails row F, then
/// its worker sleeps through S1 for 10 s with S2 queued behind it; replica `idle`, started 0.1 s later, found
/// nothing twice and backed off for 30 s. F falls due 1 s after its failure: `idle` fetches it within 200 ms of that,
/// where without the hint `busy` would fetch it only when S1 ends, 9 s later.
#[tokio::test(start_paused = true)]
async fn a_retry_due_on_a_replica_without_room_is_taken_by_a_replica_with_an_idle_worker() {
    let store = MemStore::with_history(TokioClock::new(START));
    let failing = store.insert(NewRow::new("task", "ready", json!({ "do": "fail-once" }))).await.unwrap().id;
    for _ in 0..2 {
        store.insert(NewRow::new("task", "ready", json!({ "do": "sleep", "sleep_ms": 10_000 }))).await.unwrap();
    }
    let replica = |name: &str| {
        let config = PipelineConfig {
            workers: 1,
            fetch_backoff: vec![Duration::from_millis(500), Duration::from_secs(30)],
            fetch_jitter: 0.0,
            fetch_shortest_chance: 0.0,
            retry: RetryPolicy { jitter: 0.0, ..RetryPolicy::default() },
            ..PipelineConfig::new("tasks", "task", &["ready"])
        };
        let mut manager = PipelineManager::new(Arc::new(store.as_caller(name)), ManagerOptions { seed: 7 });
        manager.register(config, Shared(Arc::new(Scripted::default()))).unwrap();
        manager.start();
        manager
    };
    let mut busy = replica("busy");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut idle = replica("idle");
    let of_f = |c: &&lockstep::store::Commit| match &c.op {
        CommitOp::Failure { lease, .. } => lease.id == failing,
        CommitOp::Fetch { leases, .. } => leases.iter().any(|l| l.id == failing),
        _ => false,
    };
    let f_commits = || store.history().iter().filter(of_f).map(|c| (c.at, c.caller.clone())).collect::<Vec<_>>();
    wait_until("row F failed and was fetched again", 1_000, || async { f_commits().len() >= 3 }).await;
    let commits = f_commits();
    let (failed, by) = commits[1].clone();
    let (refetched, taker) = commits[2].clone();
    assert_eq!(by.as_deref(), Some("busy"), "the busy replica failed row F: {commits:?}");
    let retry = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() }.backoff(1, 0.0);
    let waited = Duration::from_micros((refetched.as_micros() - failed.as_micros()) as u64);
    assert!(
        waited >= retry && waited <= retry + Duration::from_millis(200),
        "row F failed at {failed}, fetched again {waited:?} later by {taker:?}, its retry delay {retry:?}"
    );
    assert_eq!(taker.as_deref(), Some("idle"), "the idle replica took the retry: {commits:?}");
    busy.shutdown().await;
    idle.shutdown().await;
}
