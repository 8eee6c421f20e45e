//! What a controller pass reads (issue 17): rows, counted by a store wrapper, not time. A pass reads the current
//! incarnation's jobs, the undone inbox, the nodes, and the allocations granted to its operation and the free ones,
//! so an operation with 100 finished incarnations costs a pass what its first incarnation cost, and the rows a pass
//! reads grow linearly with the operation's jobs. Of the jobs and allocations a pass reads, it decodes only those
//! whose status or data changed since the replica's previous pass, counted by the handler: none in a quiet pass, and
//! about what the restart wrote over a gang restart's passes.

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, Rule, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, KIND_OPERATION};
use lockstep::gang::pipeline::{DecodeCounts, OperationHandler, Pass, operation_pipeline_config};
use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineManager, WorkError};
use lockstep::store::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
/// Run time of incarnation 0's process that fails (cookie 0): longer than a quiet window.
const FAIL_AFTER: Duration = Duration::from_secs(120);
/// How long the test watches passes while nothing happens: several `min_processing_interval`s (5 s).
const QUIET: Duration = Duration::from_secs(60);

/// A store that counts the rows each controller pass reads: a fetch that leases an operation opens a pass, and
/// every row a read returns (fetch, refetch, get, list, query) counts toward the last pass opened. Only the
/// controller replica uses it (agents use the store itself), so passes never interleave.
#[derive(Clone)]
struct Counting {
    inner: MemStore,
    passes: Arc<Mutex<Vec<usize>>>,
}

impl Counting {
    fn count(&self, rows: usize) {
        if let Some(last) = self.passes.lock().unwrap().last_mut() {
            *last += rows;
        }
    }

    fn passes_len(&self) -> usize {
        self.passes.lock().unwrap().len()
    }

    /// Rows read by each pass that began at or after pass `from`.
    fn since(&self, from: usize) -> Vec<usize> {
        self.passes.lock().unwrap()[from..].to_vec()
    }
}

impl Store for Counting {
    async fn fetch(&self, params: FetchParams) -> Result<Vec<Row>, StoreError> {
        let rows = self.inner.fetch(params).await?;
        if rows.iter().any(|row| row.kind == KIND_OPERATION) {
            self.passes.lock().unwrap().push(rows.len());
        }
        Ok(rows)
    }
    async fn next_expiry(&self, params: FetchParams) -> Result<Option<Duration>, StoreError> {
        self.inner.next_expiry(params).await
    }
    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        let row = self.inner.refetch(lease).await?;
        self.count(row.iter().count());
        Ok(row)
    }
    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        let rows = self.inner.refetch_batch(leases).await?;
        self.count(rows.iter().flatten().count());
        Ok(rows)
    }
    async fn heartbeat(&self, params: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        self.inner.heartbeat(params).await
    }
    async fn lock_related(&self, params: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        self.inner.lock_related(params).await
    }
    async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.inner.apply(params).await
    }
    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        self.inner.apply_batch(batch).await
    }
    async fn record_failure(&self, params: FailureParams) -> Result<FailureOutcome, StoreError> {
        self.inner.record_failure(params).await
    }
    async fn reset_for_retry(&self, lease: Lease) -> Result<bool, StoreError> {
        self.inner.reset_for_retry(lease).await
    }
    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        self.inner.release(leases).await
    }
    async fn insert(&self, row: NewRow) -> Result<Row, StoreError> {
        self.inner.insert(row).await
    }
    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        let row = self.inner.get(id).await?;
        self.count(row.iter().count());
        Ok(row)
    }
    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        let rows = self.inner.list(kind, parent).await?;
        self.count(rows.len());
        Ok(rows)
    }
    async fn query(&self, queries: Vec<RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        let answers = self.inner.query(queries).await?;
        self.count(answers.iter().map(Vec::len).sum());
        Ok(answers)
    }
    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        self.inner.events(row).await
    }
    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        self.inner.update_unleased(id, update).await
    }
    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        self.inner.hint(kind, row).await
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.subscribe_hints()
    }
    async fn now(&self) -> Result<Timestamp, StoreError> {
        Store::now(&self.inner).await
    }
}

/// Starts one agent, `node-0` with `jobs` slots, whose jobs run until killed unless one of `rules` says otherwise,
/// and submits a gang of `jobs` `worker` jobs (1 000 failed jobs allowed); returns the agent's task and the
/// operation's id.
async fn start_gang(store: &MemStore, jobs: u32, rules: Vec<Rule>) -> (tokio::task::JoinHandle<()>, RowId) {
    let script = JobScript { seed: 0, default: Behaviour::exit_after(Duration::from_secs(1_000_000), 0), rules };
    let executor = SimulatedExecutor::new(script, ProcessLog::default());
    let agent = Agent::new(Arc::new(store.clone()), executor, AgentConfig::new("node-0", jobs));
    let agent = tokio::spawn(agent.run());
    let spec =
        format!("{{tasks={{worker={{job_count={jobs};command=w;gang_options={{}}}}}};max_failed_job_count=1000}}");
    let op = api::submit_text(store, &spec, SpecFormat::Yson).await.unwrap();
    (agent, op)
}

/// Rows read by the quiet passes (nothing to handle, every job running) of one gang of `jobs` jobs: while its
/// incarnation 0 runs, and, when `restarts` > 0, while incarnation `restarts` runs after that many gang restarts
/// (cookie 0 fails after [`FAIL_AFTER`] in every incarnation before it).
async fn quiet_pass_reads(jobs: u32, restarts: u32) -> (Vec<usize>, Vec<usize>) {
    let store = MemStore::new(TokioClock::new(START));
    let counting = Counting { inner: store.clone(), passes: Arc::default() };
    let mut manager = PipelineManager::new(Arc::new(counting.clone()), ManagerOptions { seed: 7 });
    manager.register(operation_pipeline_config(), OperationHandler::default()).unwrap();
    manager.start();
    let rules = (0..restarts)
        .map(|attempt| Rule {
            task: Some("worker".into()),
            job_cookie: Some(0),
            attempt: Some(attempt),
            // Incarnation 0's failure waits for the quiet window; the others come fast, to keep the test short.
            behaviour: Behaviour::exit_after(if attempt == 0 { FAIL_AFTER } else { Duration::from_secs(5) }, 1),
        })
        .collect();
    let (agent, op) = start_gang(&store, jobs, rules).await;
    let mut reads = Vec::new();
    for incarnation in [0, restarts] {
        all_running(&store, op, incarnation, jobs).await;
        let from = counting.passes_len();
        tokio::time::sleep(QUIET).await;
        let passes = counting.since(from);
        assert!(passes.len() >= 4, "incarnation {incarnation}: only {} passes in {QUIET:?}", passes.len());
        reads.push(passes);
    }
    agent.abort();
    let late = reads.pop().unwrap();
    (reads.pop().unwrap(), late)
}

/// Waits (simulated time, bounded) until every job of `incarnation` runs.
async fn all_running(store: &MemStore, op: RowId, incarnation: u32, jobs: u32) {
    for _ in 0..100_000 {
        let view = api::status(store, op).await.unwrap();
        assert!(!view.status.is_terminal(), "operation {op} ended: {:?}", view.data.result);
        let running =
            view.jobs.iter().filter(|j| j.data.incarnation == incarnation && j.status == JobStatus::Running).count();
        if view.data.incarnation == incarnation && running == jobs as usize {
            return;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    panic!("incarnation {incarnation} of operation {op} never ran whole");
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_pass_after_100_finished_incarnations_reads_no_more_rows_than_one_of_the_first() {
    let jobs = 4;
    let (first, after_100) = quiet_pass_reads(jobs, 100).await;
    let (first_max, later_max) = (first.iter().max().unwrap(), after_100.iter().max().unwrap());
    // The same reads either way: the operation row, its N jobs, its one node and its N allocations. Finished
    // incarnations (400 job rows) and the consumed inbox (hundreds of messages) are never read again.
    assert!(
        *later_max <= first_max + 2,
        "quiet passes read {first:?} rows in incarnation 0 and {after_100:?} in incarnation 100"
    );
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn the_rows_a_pass_reads_grow_linearly_with_the_jobs() {
    let mut per_size = Vec::new();
    for jobs in [4, 16, 64] {
        let (quiet, _) = quiet_pass_reads(jobs, 0).await;
        let most = *quiet.iter().max().unwrap();
        // The operation, its jobs, its node, its allocations, and a few rows more (the gang queue, a message).
        assert!(most <= 2 * jobs as usize + 4, "{jobs} jobs: quiet passes read {quiet:?} rows");
        assert!(most >= 2 * jobs as usize, "{jobs} jobs: quiet passes read {quiet:?} rows: not every job?");
        per_size.push((jobs, most));
    }
    eprintln!("rows read by a quiet pass, by jobs: {per_size:?}");
}

/// The operation handler, recording the rows each pass decoded and the rows it reused decoded from the pass before.
struct PerPass {
    inner: OperationHandler,
    passes: Arc<Mutex<Vec<DecodeCounts>>>,
}

impl<S: Store> Handler<S> for PerPass {
    type Context = Pass;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<Pass, WorkError> {
        let before = self.inner.decode_counts();
        let pass = self.inner.load(row, cx).await;
        let after = self.inner.decode_counts();
        let counts = DecodeCounts { decoded: after.decoded - before.decoded, reused: after.reused - before.reused };
        self.passes.lock().unwrap().push(counts);
        pass
    }

    async fn process(&self, row: Row, pass: Pass) -> Result<Changes, WorkError> {
        Handler::<S>::process(&self.inner, row, pass).await
    }
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn passes_decode_the_jobs_and_allocations_that_changed_not_every_one_they_read() {
    let jobs: u32 = 64;
    let store = MemStore::new(TokioClock::new(START));
    let passes: Arc<Mutex<Vec<DecodeCounts>>> = Arc::default();
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    let handler = PerPass { inner: OperationHandler::default(), passes: passes.clone() };
    manager.register(operation_pipeline_config(), handler).unwrap();
    manager.start();
    let rule = Rule {
        task: Some("worker".into()),
        job_cookie: Some(0),
        attempt: Some(0),
        behaviour: Behaviour::exit_after(FAIL_AFTER, 1),
    };
    let (agent, op) = start_gang(&store, jobs, vec![rule]).await;
    let passes_len = || passes.lock().unwrap().len();
    let since = |from: usize| passes.lock().unwrap()[from..].to_vec();

    // Quiet: every job runs and nothing changes, so a pass reads every job and allocation and decodes none, but
    // for the first: it decodes the jobs the pass before it set running.
    all_running(&store, op, 0, jobs).await;
    let from = passes_len();
    tokio::time::sleep(QUIET).await;
    let quiet = since(from);
    assert!(quiet.len() >= 4, "only {} passes in {QUIET:?}", quiet.len());
    assert!(quiet[0].decoded <= u64::from(jobs), "the first pass decoded more than the jobs set running: {quiet:?}");
    for pass in &quiet {
        assert_eq!(pass.decoded + pass.reused, 2 * u64::from(jobs), "a pass read other rows: {quiet:?}");
    }
    for pass in &quiet[1..] {
        assert_eq!(pass.decoded, 0, "a quiet pass decoded rows: {quiet:?}");
    }

    // The gang restart: its passes read the incarnation's jobs and allocations each, but decode only the rows the
    // pass before wrote (the 64 aborted jobs, the 64 new ones as they are inserted, placed and start running, the
    // 64 allocations given the new jobs): a few per job over the whole restart, whatever the number of passes.
    let from = passes_len();
    all_running(&store, op, 1, jobs).await;
    let restart = since(from);
    let decoded: u64 = restart.iter().map(|p| p.decoded).sum();
    let read: u64 = restart.iter().map(|p| p.decoded + p.reused).sum();
    assert!(
        decoded <= 5 * u64::from(jobs),
        "the restart's {} passes decoded {decoded} rows: {restart:?}",
        restart.len()
    );
    assert!(read >= decoded + 2 * u64::from(jobs), "the restart's passes reused nothing: {restart:?}");
    eprintln!(
        "restart passes (decoded, reused): {:?}",
        restart.iter().map(|p| (p.decoded, p.reused)).collect::<Vec<_>>()
    );
    agent.abort();
}
