//! The gang queue through the operation pipeline on MemStore (`gang::placement`, `gang::pipeline` step
//! 3): the queue row a waiting gang writes, and the version check that serializes the passes spending free
//! allocations while gangs wait. Pipelines and agents are driven pass by pass on tokio's paused clock.
#![cfg(not(madsim))]

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::placement::{GANG_QUEUE_STATUS, GangQueue, KIND_GANG_QUEUE, QueueEntry, canonical_queue};
use lockstep::gang::status::StatusReport;
use lockstep::pipeline::{ItemOutcome, Pipeline};
use lockstep::store::*;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
const GANG2: &str = "{tasks={w={job_count=2;command=w;gang_options={}}};gang_placement=all_or_nothing}";

async fn queue(store: &MemStore) -> Option<(RowId, GangQueue)> {
    canonical_queue(&store.list(KIND_GANG_QUEUE, None).await.unwrap()).unwrap()
}

/// Drives the pipeline by hand: a fetch, then every queued item; returns the items' outcomes.
async fn pass<S: Store>(pipeline: &Pipeline<S>) -> Vec<ItemOutcome> {
    pipeline.fetcher(1).run_once().await.unwrap();
    let mut outcomes = Vec::new();
    while let Some(outcome) = pipeline.work_one(&OperationHandler::default()).await {
        outcomes.push(outcome);
    }
    outcomes
}

#[tokio::test(start_paused = true)]
async fn a_waiting_gang_is_written_to_the_queue_row_and_placed_whole_when_the_first_gang_ends() {
    let store = Arc::new(MemStore::new(TokioClock::new(START)));
    let script = JobScript::uniform(Duration::from_secs(20));
    let executor = SimulatedExecutor::new(script, ProcessLog::default());
    let log = executor.log().clone();
    let mut agents: Vec<_> =
        (0..3).map(|i| Agent::new(store.clone(), executor.clone(), AgentConfig::new(format!("node-{i}"), 1))).collect();
    let replica = Pipeline::new(store.clone(), operation_pipeline_config()).unwrap();
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let a = api::submit_text(store.as_ref(), GANG2, SpecFormat::Yson).await.unwrap();
    let b = api::submit_text(store.as_ref(), GANG2, SpecFormat::Yson).await.unwrap();
    assert!(queue(&store).await.is_none(), "no queue until a gang waits");
    pass(&replica).await;
    let (_, written) = queue(&store).await.expect("b's pass created the queue");
    assert_eq!(written.entries.iter().map(|e| (e.operation, e.need)).collect::<Vec<_>>(), [(b, 2)]);
    assert_eq!(written.version, 1);
    let b_view = api::status(store.as_ref(), b).await.unwrap();
    assert!(b_view.jobs.iter().all(|j| j.status == JobStatus::Pending && j.data.allocation.is_none()));
    // `lockstep status` shows the wait and the place in the queue.
    let report = StatusReport::read(store.as_ref(), b, false).await.unwrap();
    let waiting = report.waiting.clone().expect("b waits");
    assert_eq!((waiting.need, waiting.position), (2, Some((0, 1))));
    let text = report.render();
    assert!(text.contains("placement   all_or_nothing"), "{text}");
    assert!(text.contains("waiting     for 2 allocations at once since "), "{text}");
    assert!(text.contains(", position 1 of 1 in the gang queue"), "{text}");
    let mut one = report.clone();
    one.waiting.as_mut().expect("b waits").need = 1;
    assert!(one.render().contains("waiting     for 1 allocation at once since "), "a need of one in the singular");

    for _ in 0..60 {
        for agent in &mut agents {
            agent.run_once().await.unwrap();
        }
        pass(&replica).await;
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    for op in [a, b] {
        let view = api::status(store.as_ref(), op).await.unwrap();
        assert_eq!(view.status, OperationStatus::Completed, "operation {op}: {:?}", view.data.result);
    }
    let (_, last) = queue(&store).await.unwrap();
    assert!(last.entries.is_empty());
    assert_eq!(last.version, 2, "joined once, left once");
    // Each gang's two processes started together, and b's only after a's ended.
    let events = log.events();
    let starts = |op: RowId| {
        let at: Vec<_> = events
            .iter()
            .filter(|e| e.job.operation == op && e.kind == lockstep::agent::ProcessEventKind::Started)
            .map(|e| e.at)
            .collect();
        assert_eq!(at.len(), 2, "operation {op} started {} processes", at.len());
        at
    };
    let (a_starts, b_starts) = (starts(a), starts(b));
    assert!(a_starts[1] - a_starts[0] < Duration::from_secs(2));
    assert!(b_starts[1] - b_starts[0] < Duration::from_secs(2));
    assert!(b_starts[0] > a_starts[1] + Duration::from_secs(19), "b ran after a, not beside it");
}

/// What a [`Racing`] store runs once, before the first lock of the queue row.
type Race = Box<dyn FnOnce(MemStore) + Send>;

/// MemStore behind a hook: just before the first lock of the queue row alone, `race` runs, as the apply of a
/// concurrent pass would land between this pass's read and its lock.
#[derive(Clone)]
struct Racing {
    inner: MemStore,
    queue_row: RowId,
    queue_locks: Arc<AtomicUsize>,
    race: Arc<Mutex<Option<Race>>>,
}

impl Store for Racing {
    fn fetch(&self, p: FetchParams) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send {
        self.inner.fetch(p)
    }
    fn refetch(&self, lease: Lease) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send {
        self.inner.refetch(lease)
    }
    fn heartbeat(&self, p: HeartbeatParams) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send {
        self.inner.heartbeat(p)
    }
    fn lock_related(&self, p: LockRelatedParams) -> impl Future<Output = Result<LockOutcome, StoreError>> + Send {
        if p.related == [self.queue_row] {
            self.queue_locks.fetch_add(1, Ordering::SeqCst);
            let race = self.race.lock().unwrap().take();
            if let Some(race) = race {
                race(self.inner.clone());
            }
        }
        self.inner.lock_related(p)
    }
    fn apply(&self, p: ApplyParams) -> impl Future<Output = Result<ApplyOutcome, StoreError>> + Send {
        self.inner.apply(p)
    }
    fn reset_for_retry(
        &self,
        lease: Lease,
        delay: std::time::Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.reset_for_retry(lease, delay)
    }
    fn record_failure(&self, p: FailureParams) -> impl Future<Output = Result<FailureOutcome, StoreError>> + Send {
        self.inner.record_failure(p)
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

fn entry(operation: i64, need: u32) -> QueueEntry {
    QueueEntry { operation: RowId(operation), incarnation: 0, need, since: START, arrived: None }
}

#[tokio::test(start_paused = true)]
async fn a_pass_whose_queue_changed_between_its_read_and_its_lock_is_retried_and_then_leaves_the_reserved_slots() {
    let store = MemStore::new(TokioClock::new(START));
    let executor = SimulatedExecutor::new(
        JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() },
        ProcessLog::default(),
    );
    for i in 0..2 {
        let config = AgentConfig::new(format!("node-{i}"), 1);
        Agent::new(Arc::new(store.clone()), executor.clone(), config).run_once().await.unwrap();
    }
    // The queue holds a gang that can never fit (it reserves nothing): a plain operation may take a free slot, but
    // must lock the queue to do so.
    let data = GangQueue { version: 4, entries: vec![entry(900_001, 99)] }.to_json();
    let queue_row = store.insert(NewRow::new(KIND_GANG_QUEUE, GANG_QUEUE_STATUS, data)).await.unwrap().id;
    let plain = api::submit_text(&store, "{tasks={p={job_count=1;command=p}}}", SpecFormat::Yson).await.unwrap();
    // Between the plain operation's read and its lock, a gang needing both slots begins to wait.
    let race: Race = Box::new(move |store: MemStore| {
        let data = GangQueue { version: 5, entries: vec![entry(900_001, 99), entry(900_002, 2)] }.to_json();
        let write = store.update_unleased(queue_row, RowUpdate { status: None, data: Some(data) });
        assert_eq!(futures_now(write).unwrap(), WriteOutcome::Written);
    });
    let racing =
        Racing { inner: store.clone(), queue_row, queue_locks: Arc::default(), race: Arc::new(Mutex::new(Some(race))) };
    let replica = Pipeline::new(Arc::new(racing.clone()), operation_pipeline_config()).unwrap();
    assert_eq!(
        pass(&replica).await,
        [ItemOutcome::Retried { behind_other_replica: false }],
        "the queue's version moved: contended"
    );
    let view = api::status(&store, plain).await.unwrap();
    assert_eq!(view.status, OperationStatus::Starting, "nothing written");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(pass(&replica).await, [ItemOutcome::Applied]);
    let view = api::status(&store, plain).await.unwrap();
    assert_eq!(view.status, OperationStatus::Running);
    assert!(view.jobs.iter().all(|j| j.status == JobStatus::Pending), "the retry saw the reservation: {:?}", view.jobs);
    assert_eq!(racing.queue_locks.load(Ordering::SeqCst), 1, "the retry took nothing, so it locked nothing");
    let (_, after) = queue(&store).await.unwrap();
    assert_eq!(after.version, 5, "untouched by the plain operation");
}

/// Runs a MemStore future that completes without waiting (MemStore never awaits).
fn futures_now<F: Future>(future: F) -> F::Output {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a MemStore call awaited"),
    }
}
