//! Batching (DESIGN §3, Batching): the apply batcher's group-commit rule, workers that go on while their applies
//! wait, the bound on unanswered applies, a drain that waits for them, fetches that grow when the workers
//! outrun them, and the refetch batcher's group-commit rule. On MemStore behind a wrapper that makes every store call take a fixed time, on tokio's paused
//! clock, so the timings are exact.
#![cfg(not(madsim))]

use lockstep::pipeline::queue::Marks;
use lockstep::pipeline::{
    Changes, FetchPass, Handler, ItemOutcome, LoadCx, ManagerOptions, Pipeline, PipelineConfig, PipelineManager,
    WorkError,
};
use lockstep::store::*;
use serde_json::json;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
/// How long every fetch, refetch and apply call (single or batched) of the [`Slow`] store takes.
const CALL: Duration = Duration::from_millis(10);

/// MemStore whose fetches, refetches and applies each take [`CALL`], recording the size and start of every apply
/// and refetch call.
#[derive(Clone)]
struct Slow {
    inner: MemStore,
    applies: Arc<Mutex<Vec<(Instant, usize)>>>,
    /// Start and size of every `refetch_batch` call.
    refetch_batches: Arc<Mutex<Vec<(Instant, usize)>>>,
    /// `refetch` calls (one lease each).
    refetches: Arc<Mutex<usize>>,
    /// Fetch calls: made, in the store now, and most in the store at once.
    fetches: Arc<Mutex<Fetches>>,
    /// While set, every fetch fails (after its [`CALL`]) as if the store were gone.
    fail_fetches: Arc<std::sync::atomic::AtomicBool>,
    /// A row whose apply the store refuses with `Invalid`, alone or in a batch (which then fails whole), as
    /// PostgreSQL refuses a value no check before SQL caught.
    refuse: Arc<Mutex<Option<RowId>>>,
    /// Sizes of the apply calls refused for [`Slow::refuse`], in order.
    refused: Arc<Mutex<Vec<usize>>>,
}

#[derive(Default)]
struct Fetches {
    calls: usize,
    in_flight: usize,
    in_flight_max: usize,
}

impl Slow {
    fn new() -> Slow {
        Slow {
            inner: MemStore::new(TokioClock::new(START)),
            applies: Arc::default(),
            refetch_batches: Arc::default(),
            refetches: Arc::default(),
            fetches: Arc::default(),
            fail_fetches: Arc::default(),
            refuse: Arc::default(),
            refused: Arc::default(),
        }
    }

    /// Fetch calls made, and most in the store at once.
    fn fetch_calls(&self) -> (usize, usize) {
        let fetches = self.fetches.lock().unwrap();
        (fetches.calls, fetches.in_flight_max)
    }

    fn refetch_batch_sizes(&self) -> Vec<usize> {
        self.refetch_batches.lock().unwrap().iter().map(|(_, len)| *len).collect()
    }

    fn refetch_batch_starts(&self) -> Vec<Instant> {
        self.refetch_batches.lock().unwrap().iter().map(|(at, _)| *at).collect()
    }

    fn single_refetches(&self) -> usize {
        *self.refetches.lock().unwrap()
    }

    fn apply_sizes(&self) -> Vec<usize> {
        self.applies.lock().unwrap().iter().map(|(_, len)| *len).collect()
    }

    fn record(&self, len: usize) {
        self.applies.lock().unwrap().push((Instant::now(), len));
    }

    fn refuses(&self, batch: &[ApplyParams]) -> Result<(), StoreError> {
        match *self.refuse.lock().unwrap() {
            Some(id) if batch.iter().any(|p| p.lease.id == id) => {
                self.refused.lock().unwrap().push(batch.len());
                Err(StoreError::Invalid(format!("row {id}: refused by the test")))
            }
            _ => Ok(()),
        }
    }
}

impl Store for Slow {
    async fn fetch(&self, p: FetchParams) -> Result<Vec<Row>, StoreError> {
        {
            let mut fetches = self.fetches.lock().unwrap();
            fetches.calls += 1;
            fetches.in_flight += 1;
            fetches.in_flight_max = fetches.in_flight_max.max(fetches.in_flight);
        }
        tokio::time::sleep(CALL).await;
        self.fetches.lock().unwrap().in_flight -= 1;
        if self.fail_fetches.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the test cut the store".into()));
        }
        self.inner.fetch(p).await
    }
    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        *self.refetches.lock().unwrap() += 1;
        tokio::time::sleep(CALL).await;
        self.inner.refetch(lease).await
    }
    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        self.refetch_batches.lock().unwrap().push((Instant::now(), leases.len()));
        tokio::time::sleep(CALL).await;
        self.inner.refetch_batch(leases).await
    }
    fn heartbeat(&self, p: HeartbeatParams) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send {
        self.inner.heartbeat(p)
    }
    fn lock_related(&self, p: LockRelatedParams) -> impl Future<Output = Result<LockOutcome, StoreError>> + Send {
        self.inner.lock_related(p)
    }
    async fn apply(&self, p: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.record(1);
        tokio::time::sleep(CALL).await;
        self.refuses(std::slice::from_ref(&p))?;
        self.inner.apply(p).await
    }
    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        self.record(batch.len());
        tokio::time::sleep(CALL).await;
        self.refuses(&batch)?;
        self.inner.apply_batch(batch).await
    }
    fn record_failure(
        &self,
        p: lockstep::store::FailureParams,
    ) -> impl Future<Output = Result<lockstep::store::FailureOutcome, StoreError>> + Send {
        self.inner.record_failure(p)
    }
    fn reset_for_retry(
        &self,
        lease: Lease,
        delay: std::time::Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.reset_for_retry(lease, delay)
    }
    fn release(&self, leases: Vec<Lease>) -> impl Future<Output = Result<usize, StoreError>> + Send {
        self.inner.release(leases)
    }
    fn insert(&self, row: NewRow) -> impl Future<Output = Result<Row, StoreError>> + Send {
        self.inner.insert(row)
    }
    fn get(&self, id: RowId) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send {
        self.inner.get(id)
    }
    fn list(&self, kind: &str, parent: Option<RowId>) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send {
        self.inner.list(kind, parent)
    }
    fn events(&self, row: RowId) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send {
        self.inner.events(row)
    }
    fn update_unleased(
        &self,
        id: RowId,
        update: RowUpdate,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send {
        self.inner.update_unleased(id, update)
    }
    fn hint(&self, kind: &str, row: Option<RowId>) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.hint(kind, row)
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.subscribe_hints()
    }
    fn now(&self) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        Store::now(&self.inner)
    }
}

/// Marks each row done after `process` of (simulated) processing time.
struct Done {
    process: Duration,
}

impl<S: Store> Handler<S> for Done {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
        tokio::time::sleep(self.process).await;
        Ok(Changes::status("done"))
    }
}

/// `workers` workers, no refetch, one fetch loop and one apply batch in flight (the rules these tests time are
/// each tested with more where they say so).
fn config(workers: usize) -> PipelineConfig {
    PipelineConfig {
        workers,
        refetch: false,
        fetchers: 1,
        apply_batches_in_flight: 1,
        ..PipelineConfig::new("tasks", "task", &["ready"])
    }
}

async fn insert_ready(store: &Slow, count: usize) {
    for i in 0..count {
        store.insert(NewRow::new("task", "ready", json!({ "n": i }))).await.unwrap();
    }
}

async fn all_done(store: &Slow) -> bool {
    store.list("task", None).await.unwrap().iter().all(|row| row.status == "done")
}

/// Runs a manager over `store` until every row is done; returns the simulated time it took and the manager.
async fn run_to_done(store: &Slow, config: PipelineConfig, process: Duration) -> (Duration, PipelineManager<Slow>) {
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(config, Done { process }).unwrap();
    let started = Instant::now();
    manager.start();
    manager.hint_fetch("task", None).await.unwrap();
    while !all_done(store).await {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (started.elapsed(), manager)
}

#[tokio::test(start_paused = true)]
async fn a_lone_apply_goes_to_the_store_at_once() {
    let store = Slow::new();
    insert_ready(&store, 1).await;
    let p = Pipeline::new(Arc::new(store.clone()), config(4)).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let started = Instant::now();
    let outcome = p.work_one(&Done { process: Duration::ZERO }).await;
    assert_eq!(outcome, Some(ItemOutcome::Applied));
    // One store call's time: no batch window was waited, since no other batch was in the store.
    assert_eq!(started.elapsed(), CALL);
    assert_eq!(store.apply_sizes(), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn applies_that_arrive_while_a_batch_is_in_the_store_go_together_next() {
    let store = Slow::new();
    insert_ready(&store, 40).await;
    // Processing 1 ms, calls 10 ms: while one batch is in the store, every worker finishes items and hands
    // their applies over, so batches grow far past one item; the window (2 ms) bounds how long they collect.
    let (_, mut manager) = run_to_done(&store, config(8), Duration::from_millis(1)).await;
    manager.shutdown().await;
    let sizes = store.apply_sizes();
    assert_eq!(sizes.iter().sum::<usize>(), 40, "every row applied once: {sizes:?}");
    assert!(sizes.iter().any(|&len| len > 8), "no batch larger than the workers: {sizes:?}");
    assert!(sizes.len() < 20, "applies did not batch: {sizes:?}");
}

/// Start instants (from `started`) of the apply calls of two items handed over 1 ms apart by a pipeline allowing
/// `in_flight` apply batches in the store at once.
async fn two_applies_one_ms_apart(in_flight: usize) -> Vec<Duration> {
    let store = Slow::new();
    insert_ready(&store, 2).await;
    let config = PipelineConfig { apply_batches_in_flight: in_flight, ..config(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let started = Instant::now();
    let done = Done { process: Duration::ZERO };
    let second = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        p.work_one(&done).await
    };
    let (first, second) = tokio::join!(p.work_one(&done), second);
    assert_eq!((first, second), (Some(ItemOutcome::Applied), Some(ItemOutcome::Applied)));
    store.applies.lock().unwrap().iter().map(|(at, _)| at.duration_since(started)).collect()
}

#[tokio::test(start_paused = true)]
async fn with_two_batches_in_flight_the_next_apply_goes_while_one_is_in_the_store() {
    // One batch in flight (the default): the second apply waits for the first batch's answer, at most the
    // window (2 ms after it arrived), then goes.
    let ms = Duration::from_millis;
    assert_eq!(two_applies_one_ms_apart(1).await, vec![ms(0), ms(3)]);
    // Two: it goes at once, beside the first.
    assert_eq!(two_applies_one_ms_apart(2).await, vec![ms(0), ms(1)]);
}

#[tokio::test(start_paused = true)]
async fn unanswered_applies_never_exceed_one_full_batch_per_batch_in_flight() {
    let store = Slow::new();
    insert_ready(&store, 60).await;
    let config = PipelineConfig { apply_batch_max: 5, apply_batches_in_flight: 2, ..config(8) };
    let (_, mut manager) = run_to_done(&store, config, Duration::ZERO).await;
    manager.shutdown().await;
    let applies = store.applies.lock().unwrap().clone();
    assert!(applies.iter().all(|(_, len)| *len <= 5), "a batch past apply_batch_max: {applies:?}");
    let mut most = 0;
    for (at, _) in &applies {
        let in_store: usize =
            applies.iter().filter(|(other, _)| *other <= *at && at.duration_since(*other) < CALL).map(|(_, l)| l).sum();
        most = most.max(in_store);
    }
    assert!(most <= 10, "{most} applies in the store at once: {applies:?}");
    assert!(most > 5, "never more than one batch's slots in use: {applies:?}");
}

#[tokio::test(start_paused = true)]
async fn workers_take_their_next_item_while_their_apply_waits() {
    let store = Slow::new();
    insert_ready(&store, 64).await;
    // One worker, 1 ms per item, 10 ms per store call: waiting for each apply, the worker would need at least
    // 64 × 11 ms; handing its applies over, it is bounded by processing and fetches.
    let (took, mut manager) = run_to_done(&store, config(1), Duration::from_millis(1)).await;
    manager.shutdown().await;
    assert!(took < Duration::from_millis(64 * 11 / 2), "one worker took {took:?} for 64 items");
}

#[tokio::test(start_paused = true)]
async fn unanswered_applies_never_exceed_apply_batch_max() {
    let store = Slow::new();
    insert_ready(&store, 60).await;
    let config = PipelineConfig { apply_batch_max: 5, ..config(8) };
    let (_, mut manager) = run_to_done(&store, config, Duration::ZERO).await;
    manager.shutdown().await;
    let applies = store.applies.lock().unwrap().clone();
    assert!(applies.iter().all(|(_, len)| *len <= 5), "a batch past apply_batch_max: {applies:?}");
    // Batches overlap in the store for CALL each: at no instant are more than 5 applies in calls started within
    // the last CALL.
    for (at, _) in &applies {
        let in_store: usize =
            applies.iter().filter(|(other, _)| *other <= *at && at.duration_since(*other) < CALL).map(|(_, l)| l).sum();
        assert!(in_store <= 5, "{in_store} applies in the store at once: {applies:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_the_applies_its_workers_handed_over() {
    let store = Slow::new();
    insert_ready(&store, 30).await;
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(config(4), Done { process: Duration::from_millis(1) }).unwrap();
    manager.start();
    manager.hint_fetch("task", None).await.unwrap();
    // Mid-run: some applies are in the store or waiting for it.
    tokio::time::sleep(Duration::from_millis(25)).await;
    manager.shutdown().await;
    let metrics = manager.metrics("tasks").unwrap();
    let rows = store.list("task", None).await.unwrap();
    let done = rows.iter().filter(|row| row.status == "done").count() as u64;
    assert!(metrics.applied > 0, "nothing applied before the drain");
    assert_eq!(done, metrics.applied, "every apply handed over was answered before the drain returned");
    assert!(rows.iter().all(|row| row.lock_token.is_none()), "a lease outlived the drain");
    assert_eq!(metrics.leases_held, 0);
}

#[tokio::test(start_paused = true)]
async fn fetches_grow_while_workers_outrun_them_and_shrink_when_rows_run_out() {
    let store = Slow::new();
    insert_ready(&store, 500).await;
    let config = PipelineConfig { workers: 4, fetch_limit_max: 64, ..config(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    let base = p.shared.marks();
    assert_eq!(base, Marks { max: 8, low: 2 });
    let mut fetcher = p.fetcher(1);
    let handler = Done { process: Duration::ZERO };
    let mut limits = Vec::new();
    loop {
        let pass = fetcher.run_once().await.unwrap();
        if let FetchPass::Fetched { fetched, limit } = pass {
            limits.push(limit);
            if fetched < limit {
                break;
            }
        }
        // Workers empty the queue and then wait on it: they outran the fetch.
        while p.work_one(&handler).await.is_some() {}
        starve(&p).await;
    }
    // dstack's 8 twice (no worker had waited before the first fetch), then doubling to the cap of 64, then the
    // cap, until the store has fewer rows than asked for.
    assert_eq!(&limits[..5], &[8, 8, 16, 32, 64], "limits {limits:?}");
    assert!(limits[5..].iter().all(|&limit| limit == 64), "limits {limits:?}");
    assert_eq!(p.shared.marks(), base, "a partial fetch brings the queue back to dstack's size");
}

/// A queue grown on fast items shrinks back to dstack's size once the items turn slow, while the backlog lasts:
/// each `fetchers` + 1 full fetches in a row after which no worker found the queue empty halve it. Before, only a
/// short fetch (the backlog's end) did, and a new user's trial saw a queue grown on fast items hold about 1 000
/// leases through 37 s of slow ones.
#[tokio::test(start_paused = true)]
async fn a_grown_queue_shrinks_back_when_the_items_turn_slow() {
    let store = Slow::new();
    insert_ready(&store, 2_000).await;
    let config = PipelineConfig { workers: 4, fetch_limit_max: 64, ..config(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    let base = p.shared.marks();
    // Fast items: the workers empty the queue after every fetch and wait; it grows to the cap.
    grow(&p).await;
    let mut fetcher = p.fetcher(1);
    let handler = Done { process: Duration::ZERO };
    // Slow items: the workers take items but never find the queue empty.
    let mut maxes = Vec::new();
    while p.shared.marks() != base {
        assert!(maxes.len() < 10, "the queue stayed grown: {maxes:?}");
        let pass = fetcher.run_once().await.unwrap();
        assert!(matches!(pass, FetchPass::Fetched { fetched, limit } if fetched == limit), "{pass:?}");
        maxes.push(p.shared.marks().max);
        let low = p.shared.marks().low;
        while p.shared.queue_len() >= low {
            p.work_one(&handler).await;
        }
    }
    // One fetch loop: every second full fetch in a row with no worker starved halves it (the first one still
    // follows the fast items' last wait).
    assert_eq!(maxes, [64, 64, 32, 32, 16, 16, 8]);
    let ready = store.list("task", None).await.unwrap().iter().filter(|row| row.status == "ready").count();
    assert!(ready > 1_000, "the backlog was still there ({ready} rows ready)");
}

#[tokio::test(start_paused = true)]
async fn fetches_keep_dstack_size_while_workers_are_busy() {
    let store = Slow::new();
    insert_ready(&store, 100).await;
    let p = Pipeline::new(Arc::new(store.clone()), config(4)).unwrap();
    let mut fetcher = p.fetcher(1);
    for _ in 0..5 {
        fetcher.run_once().await.unwrap();
        // The workers take items but never find the queue empty: they leave it just below the low mark.
        let low = p.shared.marks().low;
        while p.shared.queue_len() >= low {
            p.work_one(&Done { process: Duration::ZERO }).await;
        }
    }
    assert_eq!(p.shared.marks(), Marks { max: 8, low: 2 });
}

/// The defaults let a backlog's fetches and apply batches grow to 600 rows (`FETCH_LIMIT_MAX_DEFAULT`,
/// `APPLY_BATCH_MAX_DEFAULT`; 100 before), so each call's fixed cost is spread over six times the rows (on
/// PostgreSQL a 1 × 8 drain of no-op items ran 1.5–1.7 × as fast). Here every call takes the same 10 ms
/// whatever its size, so a drain with the defaults takes well under half the time it takes with 100 of each.
#[tokio::test(start_paused = true)]
async fn the_default_fetches_and_apply_batches_grow_to_600_rows() {
    let mut took = Vec::new();
    for limit in [100, 600] {
        let store = Slow::new();
        insert_ready(&store, 6_000).await;
        let defaults = PipelineConfig { workers: 8, ..PipelineConfig::new("tasks", "task", &["ready"]) };
        let config = if limit == 600 {
            defaults
        } else {
            PipelineConfig { fetch_limit_max: limit, apply_batch_max: limit, ..defaults }
        };
        assert_eq!((config.fetch_limit_max, config.apply_batch_max), (limit, limit));
        let (elapsed, mut manager) = run_to_done(&store, config, Duration::ZERO).await;
        manager.shutdown().await;
        let largest = store.apply_sizes().into_iter().max().unwrap_or(0);
        assert!(largest > limit * 2 / 3 && largest <= limit, "largest apply batch {largest} at {limit}");
        took.push(elapsed);
    }
    assert!(
        took[1].as_secs_f64() < took[0].as_secs_f64() * 0.5,
        "100 rows: {:?}, 600 (defaults): {:?}",
        took[0],
        took[1]
    );
}

/// While the workers outrun the fetches, the second fetcher's fetch overlaps the first's: two fetches are in the
/// store at once and the rows are done in about half the time one fetcher takes.
#[tokio::test(start_paused = true)]
async fn a_second_fetch_overlaps_the_first_while_the_queue_is_grown() {
    let mut took = Vec::new();
    for fetchers in [1, 2] {
        let store = Slow::new();
        insert_ready(&store, 2_000).await;
        // Applies in batches of up to 500, so that the fetches, not the applies, bound the pipeline.
        let config = PipelineConfig { fetchers, fetch_limit_max: 64, apply_batch_max: 500, ..config(8) };
        let (elapsed, mut manager) = run_to_done(&store, config, Duration::ZERO).await;
        manager.shutdown().await;
        let (_, in_flight_max) = store.fetch_calls();
        assert_eq!(in_flight_max, fetchers, "{fetchers} fetcher(s)");
        took.push(elapsed);
    }
    // One fetcher: 64 rows per 10 ms call. Two: twice that, less the grow-up and the applies' share.
    assert!(took[1].as_secs_f64() < took[0].as_secs_f64() * 0.65, "one fetcher {:?}, two {:?}", took[0], took[1]);
}

/// Per-item mode (a queue of one row that cannot grow, one row per fetch): while the workers outrun the fetches,
/// the other fetch loops fetch too, so up to `fetchers` one-row fetches are in the store at once; once the rows
/// run out only the first fetcher polls.
#[tokio::test(start_paused = true)]
async fn per_item_fetches_overlap_while_the_workers_outrun_them() {
    let mut took = Vec::new();
    for fetchers in [1, 4] {
        let store = Slow::new();
        insert_ready(&store, 200).await;
        let config = PipelineConfig {
            fetchers,
            queue_upper_factor: 0.25,
            queue_lower_factor: 0.25,
            fetch_limit_max: 1,
            apply_batch_window: Duration::ZERO,
            ..config(4)
        };
        let (elapsed, mut manager) = run_to_done(&store, config, Duration::ZERO).await;
        let (calls, in_flight_max) = store.fetch_calls();
        assert_eq!(in_flight_max, fetchers, "{fetchers} fetcher(s)");
        // Every row leased by a fetch of its own, and few empty fetches once they ran out.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (idle_calls, _) = store.fetch_calls();
        manager.shutdown().await;
        assert!(calls >= 200 && calls < 200 + 2 * fetchers, "{calls} fetch calls for 200 rows");
        assert!(idle_calls - calls <= 3, "{} fetches in the idle second after", idle_calls - calls);
        took.push(elapsed);
    }
    // One fetcher: one row per 10 ms call. Four: about four times that.
    assert!(took[1].as_secs_f64() < took[0].as_secs_f64() * 0.35, "one fetcher {:?}, four {:?}", took[0], took[1]);
}

/// Fetches in flight hold room in the queue: the queue and their reservations never exceed `fetchers` × the
/// queue's max, and a fetch never asks for more than the max.
#[tokio::test(start_paused = true)]
async fn fetches_in_flight_never_overfill_the_queue() {
    let store = Slow::new();
    insert_ready(&store, 600).await;
    let config = PipelineConfig { fetchers: 3, fetch_limit_max: 32, ..config(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    // Grown to the cap: the workers outran three full fetches.
    grow(&p).await;
    assert_eq!(p.shared.marks(), Marks { max: 32, low: 8 });
    let first = p.shared.reserve(0, Instant::now()).expect("an empty grown queue takes a fetch");
    assert_eq!(first.limit(), 32, "at most the queue's max per fetch");
    let second = p.shared.reserve(1, Instant::now()).expect("the second fetcher fetches while the queue is grown");
    let third = p.shared.reserve(2, Instant::now()).expect("and the third");
    assert_eq!((second.limit(), third.limit()), (32, 32));
    assert!(p.shared.reserve(0, Instant::now()).is_none(), "3 × 32 rows reserved: no room left");
    drop(third);
    assert_eq!(p.shared.reserved(), 64, "a dropped reservation gives its room back");
    assert_eq!(p.shared.reserve(2, Instant::now()).map(|r| r.limit()), Some(32));
}

/// A worker finds `p`'s queue empty and waits on it (then goes away): the workers outran the fetch.
async fn starve(p: &Pipeline<Slow>) {
    let waiting = tokio::spawn({
        let (shared, clock) = (p.shared.clone(), p.clock.clone());
        async move { shared.pop(&clock).await }
    });
    tokio::task::yield_now().await;
    waiting.abort();
}

/// Grows `p`'s queue to its cap (`fetch_limit_max`): the workers empty the queue after each full fetch and wait
/// on it, outrunning the fetches, until the marks reach the cap.
async fn grow(p: &Pipeline<Slow>) {
    let mut fetcher = p.fetcher(1);
    for _ in 0..10 {
        if p.shared.marks().max >= p.config.fetch_limit_max {
            return;
        }
        fetcher.run_once().await.unwrap();
        while p.work_one(&Done { process: Duration::ZERO }).await.is_some() {}
        starve(p).await;
    }
    panic!("the queue did not grow to its cap: {:?}", p.shared.marks());
}

/// A fetcher that found the room held by a fetch in flight waits for a refill; when that fetch gives its room back
/// with the queue below its lower mark (it leased nothing), the fetcher is woken, though no worker pops.
#[tokio::test(start_paused = true)]
async fn a_fetch_giving_its_room_back_below_the_low_mark_wakes_the_fetchers() {
    let store = Slow::new();
    insert_ready(&store, 600).await;
    let p = Pipeline::new(Arc::new(store.clone()), PipelineConfig { fetchers: 2, fetch_limit_max: 32, ..config(4) })
        .unwrap();
    grow(&p).await;
    let held = p.shared.reserve(1, Instant::now()).expect("the second fetcher fetches while the queue is grown");
    // The first fetcher's fetch came back partial meanwhile: the queue is back at dstack's size (max 8).
    p.shared.adapt(0, 32);
    assert_eq!(p.shared.marks(), Marks { max: 8, low: 2 });
    assert!(p.shared.reserve(0, Instant::now()).is_none(), "the room is held by the fetch in flight");
    // Any wake-up stored by the workers' pops is used up: the first fetcher now waits.
    let _ = tokio::time::timeout(Duration::from_millis(1), p.shared.refill.notified()).await;
    held.fill(Vec::new(), Instant::now(), Duration::from_secs(30), Duration::from_secs(2));
    let woken = tokio::time::timeout(Duration::from_millis(1), p.shared.refill.notified()).await;
    assert!(woken.is_ok(), "the returned room must wake the first fetcher");
    assert_eq!(p.shared.reserve(0, Instant::now()).map(|r| r.limit()), Some(8));
}

/// With several fetchers, a fetch that answers after its leases expired may bring a row that another fetch has
/// since leased again: the older lease is dropped, not queued, and the ledger keeps the newer one.
#[tokio::test(start_paused = true)]
async fn a_row_fetched_again_by_another_fetcher_keeps_only_its_newer_lease() {
    let store = Slow::new();
    insert_ready(&store, 1).await;
    let p = Pipeline::new(Arc::new(store.clone()), PipelineConfig { fetchers: 2, ..config(4) }).unwrap();
    let params = |config: &PipelineConfig| FetchParams {
        pipeline: config.name.clone(),
        kind: config.kind.clone(),
        statuses: config.statuses.clone(),
        limit: 1,
        lease_ttl: config.lease_ttl,
        min_processing_interval: config.min_processing_interval,
        retry_delay: config.retry_delay,
    };
    let item = |row: Row| {
        let token = row.lock_token.unwrap();
        lockstep::pipeline::queue::Item { lease: Lease { id: row.id, token }, row, fetched_at: Instant::now() }
    };
    let older = item(store.inner.fetch(params(&p.config)).await.unwrap().remove(0));
    tokio::time::advance(p.config.lease_ttl + Duration::from_secs(1)).await;
    let newer = item(store.inner.fetch(params(&p.config)).await.unwrap().remove(0));
    assert!(older.lease.token < newer.lease.token);
    // The queue is grown (a worker waited on it, and a fetch got all it asked for), so both fetchers fetch; both
    // fetches were in flight, and the newer one answers first.
    starve(&p).await;
    p.shared.adapt(8, 8);
    let stalled = p.shared.reserve(0, Instant::now()).unwrap();
    let (ttl, margin) = (p.config.lease_ttl, p.config.lease_margin);
    assert_eq!(p.shared.reserve(1, Instant::now()).unwrap().fill(vec![newer.clone()], Instant::now(), ttl, margin), 1);
    assert_eq!(stalled.fill(vec![older], Instant::now(), ttl, margin), 0, "the older lease is dropped");
    assert_eq!(p.shared.queue_len(), 1);
    assert_eq!(p.shared.leases().get(&newer.lease.id).map(|held| held.token), Some(newer.lease.token));
}

/// A drain ends while every fetch loop's store call fails: each of three loops, back from a failed fetch after the
/// queue closed, is woken (the close stores a wake-up per loop, and a failed fetch's returned room wakes them
/// too; with neither, all but one loop waited forever).
#[tokio::test(start_paused = true)]
async fn a_drain_with_three_fetch_loops_ends_while_the_store_fails_them() {
    let store = Slow::new();
    insert_ready(&store, 5_000).await;
    // Applies in large batches, so that the fetches bound the pipeline and every loop is in the store.
    let config = PipelineConfig { fetchers: 3, fetch_limit_max: 32, apply_batch_max: 500, ..config(4) };
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(config, Done { process: Duration::ZERO }).unwrap();
    manager.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.fetch_calls().1, 3, "three fetches in the store at once");
    // Every fetch in the store now fails, after the queue has closed.
    store.fail_fetches.store(true, std::sync::atomic::Ordering::SeqCst);
    let drained = tokio::time::timeout(Duration::from_secs(60), manager.shutdown()).await;
    assert!(drained.is_ok(), "the drain must end");
}

/// At dstack's size (no backlog: the store never has all the rows a fetch asks for) only the first fetcher
/// fetches, so the store sees the same fetches as with one fetcher, empty ones included.
#[tokio::test(start_paused = true)]
async fn an_idle_pipeline_fetches_as_with_one_fetcher() {
    let mut calls = Vec::new();
    for fetchers in [1, 2] {
        let store = Slow::new();
        insert_ready(&store, 6).await;
        let config = PipelineConfig { fetchers, ..config(4) }; // queue max 8
        let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
        manager.register(config, Done { process: Duration::from_millis(500) }).unwrap();
        manager.start();
        tokio::time::sleep(Duration::from_secs(30)).await;
        manager.shutdown().await;
        assert!(all_done(&store).await);
        let (fetch_calls, in_flight_max) = store.fetch_calls();
        assert_eq!(in_flight_max, 1, "{fetchers} fetcher(s)");
        calls.push(fetch_calls);
    }
    assert_eq!(calls[0], calls[1], "fetch calls with one fetcher and with two");
}

/// The pipeline of [`config`] with refetch on (the default) for every row however fresh, so every item's
/// refetch goes through the refetch batcher.
fn refetching(workers: usize) -> PipelineConfig {
    PipelineConfig { refetch: true, refetch_after: Duration::ZERO, ..config(workers) }
}

/// Runs one worker pass over `p`'s queue at once and `rest` more passes `after` later, all concurrently (as
/// `1 + rest` workers would); returns their outcomes in that order.
async fn one_then_more(p: &Pipeline<Slow>, rest: usize, after: Duration) -> Vec<Option<ItemOutcome>> {
    let pass = |p: Pipeline<Slow>| tokio::spawn(async move { p.work_one(&Done { process: Duration::ZERO }).await });
    let mut passes = vec![pass(p.clone())];
    tokio::time::sleep(after).await;
    passes.extend((0..rest).map(|_| pass(p.clone())));
    let mut outcomes = Vec::new();
    for pass in passes {
        outcomes.push(pass.await.unwrap());
    }
    outcomes
}

#[tokio::test(start_paused = true)]
async fn a_lone_refetch_goes_to_the_store_at_once() {
    let store = Slow::new();
    insert_ready(&store, 1).await;
    let p = Pipeline::new(Arc::new(store.clone()), refetching(4)).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let started = Instant::now();
    let outcome = p.work_one(&Done { process: Duration::ZERO }).await;
    assert_eq!(outcome, Some(ItemOutcome::Applied));
    // A refetch and an apply, one store call's time each: no batch window was waited, since no other batch was
    // in the store.
    assert_eq!(started.elapsed(), CALL * 2);
    assert_eq!(store.refetch_batch_sizes(), vec![1], "the refetch went through the batcher");
    assert_eq!(p.metrics().refetch_calls, 1);
}

#[tokio::test(start_paused = true)]
async fn refetches_that_arrive_while_one_is_in_the_store_go_together_next() {
    let store = Slow::new();
    insert_ready(&store, 4).await;
    // A window longer than a store call: the three later refetches wait for the first batch to be answered.
    let config = PipelineConfig { refetch_batch_window: CALL * 5, ..refetching(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let outcomes = one_then_more(&p, 3, Duration::from_millis(1)).await;
    assert_eq!(outcomes, vec![Some(ItemOutcome::Applied); 4]);
    assert_eq!(store.refetch_batch_sizes(), vec![1, 3], "refetch calls");
    let starts = store.refetch_batch_starts();
    assert_eq!(starts[1].duration_since(starts[0]), CALL, "the second batch went as the first was answered");
    assert_eq!(store.single_refetches(), 0);
    assert_eq!(p.metrics().refetch_calls, 2);
}

#[tokio::test(start_paused = true)]
async fn a_refetch_batch_waits_at_most_the_window() {
    let store = Slow::new();
    insert_ready(&store, 4).await;
    let config = refetching(4);
    let window = config.refetch_batch_window;
    assert!(window + Duration::from_millis(1) < CALL, "the window ends while the first batch is in the store");
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let outcomes = one_then_more(&p, 3, Duration::from_millis(1)).await;
    assert_eq!(outcomes, vec![Some(ItemOutcome::Applied); 4]);
    assert_eq!(store.refetch_batch_sizes(), vec![1, 3], "refetch calls");
    let starts = store.refetch_batch_starts();
    let waited = starts[1].duration_since(starts[0]) - Duration::from_millis(1);
    assert_eq!(waited, window, "the second batch went when its window ended, the first still in the store");
}

#[tokio::test(start_paused = true)]
async fn a_stale_lease_in_a_refetch_batch_drops_only_that_item() {
    let store = Slow::new();
    insert_ready(&store, 4).await;
    let rows = store.list("task", None).await.unwrap();
    let p = Pipeline::new(Arc::new(store.clone()), refetching(4)).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    // The store gives the third row's lease to someone else (as after a suspension this replica's clock did not
    // see): its token changes while the item waits in this pipeline's queue.
    let taken = store.get(rows[2].id).await.unwrap().unwrap();
    let lease = Lease { id: taken.id, token: taken.lock_token.expect("leased by the fetch") };
    assert_eq!(store.release(vec![lease]).await.unwrap(), 1);
    let thief = FetchParams {
        pipeline: "thief".into(),
        kind: "task".into(),
        statuses: vec!["ready".into()],
        limit: 10,
        lease_ttl: Duration::from_secs(30),
        min_processing_interval: Duration::from_secs(5),
        retry_delay: Duration::from_secs(1),
    };
    let stolen = store.inner.fetch(thief).await.unwrap();
    assert_eq!(stolen.iter().map(|row| row.id).collect::<Vec<_>>(), vec![taken.id]);
    // The first item's refetch goes alone; the other three, the taken one among them, in one batch.
    let outcomes = one_then_more(&p, 3, Duration::from_millis(1)).await;
    assert_eq!(store.refetch_batch_sizes(), vec![1, 3], "refetch calls");
    let applied = Some(ItemOutcome::Applied);
    assert_eq!(outcomes, vec![applied, applied, Some(ItemOutcome::Stale), applied], "outcomes in row order");
    let metrics = p.metrics();
    assert_eq!((metrics.applied, metrics.stale), (3, 1));
    assert_eq!(metrics.leases_held, 0);
    let applies: usize = store.apply_sizes().iter().sum();
    assert_eq!(applies, 3, "the taken item was processed and applied (stale) instead of dropped at its refetch");
    for row in store.list("task", None).await.unwrap() {
        if row.id == taken.id {
            assert_eq!(row.status, "ready", "the taken row {} was processed", row.id);
            assert_eq!(row.lock_token, stolen[0].lock_token, "the taken row {} lost its new lease", row.id);
        } else {
            assert_eq!(row.status, "done", "row {} was not processed", row.id);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_zero_refetch_window_each_refetch_is_its_own_store_call() {
    let store = Slow::new();
    insert_ready(&store, 4).await;
    let config = PipelineConfig { refetch_batch_window: Duration::ZERO, ..refetching(4) };
    let p = Pipeline::new(Arc::new(store.clone()), config).unwrap();
    p.fetcher(1).run_once().await.unwrap();
    let outcomes = one_then_more(&p, 3, Duration::from_millis(1)).await;
    assert_eq!(outcomes, vec![Some(ItemOutcome::Applied); 4]);
    assert_eq!(store.refetch_batch_sizes(), Vec::<usize>::new(), "refetch batches");
    assert_eq!(store.single_refetches(), 4);
    assert_eq!(p.metrics().refetch_calls, 4);
}

#[tokio::test(start_paused = true)]
async fn a_running_pipelines_workers_refetch_in_batches() {
    let store = Slow::new();
    insert_ready(&store, 40).await;
    let (_, mut manager) = run_to_done(&store, refetching(8), Duration::from_millis(1)).await;
    manager.shutdown().await;
    let sizes = store.refetch_batch_sizes();
    assert_eq!(sizes.iter().sum::<usize>(), 40, "every item refetched once: {sizes:?}");
    assert!(sizes.iter().any(|&len| len > 1), "no refetch batch of two or more: {sizes:?}");
    assert!(sizes.iter().all(|&len| len <= 8), "a refetch batch larger than the workers: {sizes:?}");
    assert_eq!(manager.metrics("tasks").unwrap().refetch_calls, sizes.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn a_batch_the_store_refuses_whole_is_split_so_only_the_bad_item_fails() {
    let store = Slow::new();
    insert_ready(&store, 40).await;
    let bad = store.list("task", None).await.unwrap()[17].id;
    *store.refuse.lock().unwrap() = Some(bad);
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 1 });
    manager.register(config(8), Done { process: Duration::from_millis(1) }).unwrap();
    manager.start();
    manager.hint_fetch("task", None).await.unwrap();
    let done = || async { store.list("task", None).await.unwrap().iter().filter(|r| r.status == "done").count() };
    for _ in 0..1000 {
        if done().await == 39 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let metrics = manager.metrics("tasks").unwrap();
    manager.shutdown().await;
    for row in store.list("task", None).await.unwrap() {
        if row.id == bad {
            assert_eq!((row.status.as_str(), row.attempts), ("ready", 1), "the refused row {bad}");
            assert!(row.errors[0].error.contains("refused by the test"), "{:?}", row.errors);
        } else {
            assert_eq!((row.status.as_str(), row.attempts), ("done", 0), "row {} batched with the refused one", row.id);
        }
    }
    assert_eq!((metrics.applied, metrics.failures, metrics.errors), (39, 1, 0));
    // The refused row went in a batch with others, which failed whole; then alone, refused again.
    let refused = store.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 2, "refused apply calls: {refused:?}");
    assert!(refused[0] > 1 && refused[1] == 1, "refused apply calls: {refused:?}");
}
