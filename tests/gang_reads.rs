//! What a controller pass reads: rows, counted by a store wrapper, not time. A replica whose last pass
//! over an operation is the one that applied (its token is in the operation's data) takes the operation's jobs
//! and granted allocations as that pass left them, and reads only what changes under it: the undone inbox, the
//! nodes, the free allocations, the ids of the job rows its apply inserted and the incarnation's first job (whose
//! lock tells a revival). So its quiet passes read a few rows whatever the number of jobs, and a gang restart's
//! passes read what they consume. A replica without that state (the first pass, a takeover, passes alternating
//! between replicas) reads the current incarnation's jobs, the undone inbox, the nodes, and the allocations
//! granted to its operation and the free ones: an operation with 100 finished incarnations costs it what its first
//! incarnation cost, and the rows it reads grow linearly with the operation's jobs. Of the jobs and allocations it
//! reads, it decodes only those whose status or data changed since its own previous read, counted by the handler.

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, Rule, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, KIND_OPERATION};
use lockstep::gang::pipeline::{DecodeCounts, OperationHandler, Pass, operation_pipeline_config};
use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, Pipeline, PipelineManager, WorkError};
use lockstep::store::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
/// Run time of incarnation 0's process that fails (cookie 0): longer than a quiet window.
const FAIL_AFTER: Duration = Duration::from_secs(120);
/// How long the test watches passes while nothing happens: several `min_processing_interval`s (5 s).
const QUIET: Duration = Duration::from_secs(60);

/// What one pass read and locked, in rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PassRows {
    /// Rows its reads returned.
    read: usize,
    /// Rows it asked `lock_related` to lock (its children and shared rows).
    locked: usize,
}

/// A store that counts the rows each controller pass reads and locks: a fetch that leases an operation opens a
/// pass, and every row a read returns (fetch, refetch, get, list, query) and every row a related lock names counts
/// toward the last pass opened. Only the controller replica uses it (agents use the store itself), so passes never
/// interleave.
#[derive(Clone)]
struct Counting {
    inner: MemStore,
    passes: Arc<Mutex<Vec<PassRows>>>,
}

impl Counting {
    fn count(&self, rows: usize) {
        if let Some(last) = self.passes.lock().unwrap().last_mut() {
            last.read += rows;
        }
    }

    fn passes_len(&self) -> usize {
        self.passes.lock().unwrap().len()
    }

    /// Rows read and locked by each pass that began at or after pass `from`.
    fn rows_since(&self, from: usize) -> Vec<PassRows> {
        self.passes.lock().unwrap()[from..].to_vec()
    }
}

impl Store for Counting {
    async fn fetch(&self, params: FetchParams) -> Result<Vec<Row>, StoreError> {
        let rows = self.inner.fetch(params).await?;
        if rows.iter().any(|row| row.kind == KIND_OPERATION) {
            self.passes.lock().unwrap().push(PassRows { read: rows.len(), locked: 0 });
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
        if let Some(last) = self.passes.lock().unwrap().last_mut() {
            last.locked += params.related.len();
        }
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
    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        self.inner.reset_for_retry(lease, delay).await
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

/// Which operation handler the controller replica runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replica {
    /// One handler for every pass: each pass has what the replica's last pass left.
    Kept,
    /// A new handler for every pass: each pass is as a replica's that never ran the operation before.
    Forgetful,
}

/// The operation handler of a replica that never ran the operation's last pass (as after a takeover): each pass on
/// a handler of its own, with nothing kept from the passes before.
struct Forgetful;

impl<S: Store> Handler<S> for Forgetful {
    type Context = Pass;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<Pass, WorkError> {
        OperationHandler::default().load(row, cx).await
    }

    async fn process(&self, row: Row, pass: Pass) -> Result<Changes, WorkError> {
        Handler::<S>::process(&OperationHandler::default(), row, pass).await
    }
}

/// A controller replica on `store` (counted), running `replica`'s handler.
fn start_replica(counting: &Counting, replica: Replica) -> PipelineManager<Counting> {
    let mut manager = PipelineManager::new(Arc::new(counting.clone()), ManagerOptions { seed: 7 });
    match replica {
        Replica::Kept => manager.register(operation_pipeline_config(), OperationHandler::default()).unwrap(),
        Replica::Forgetful => manager.register(operation_pipeline_config(), Forgetful).unwrap(),
    }
    manager.start();
    manager
}

/// The rows read and locked by the quiet passes (nothing to handle, every job running) of one gang of `jobs` jobs on
/// a `replica`: while its incarnation 0 runs, and, when `restarts` > 0, while incarnation `restarts` runs after that
/// many gang restarts (cookie 0 fails after [`FAIL_AFTER`] in every incarnation before it).
async fn quiet_pass_reads(jobs: u32, restarts: u32, replica: Replica) -> (Vec<PassRows>, Vec<PassRows>) {
    let store = MemStore::new(TokioClock::new(START));
    let counting = Counting { inner: store.clone(), passes: Arc::default() };
    let _manager = start_replica(&counting, replica);
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
        let passes = counting.rows_since(from);
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

fn most_read(passes: &[PassRows]) -> usize {
    passes.iter().map(|pass| pass.read).max().unwrap()
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_pass_after_100_finished_incarnations_reads_no_more_rows_than_one_of_the_first() {
    let jobs = 4;
    for replica in [Replica::Kept, Replica::Forgetful] {
        let (first, after_100) = quiet_pass_reads(jobs, 100, replica).await;
        // The same reads either way: the operation row, its node, and its jobs and allocations or (kept) only the
        // first job. Finished incarnations (400 job rows) and the consumed inbox (hundreds of messages) are never
        // read again.
        assert!(
            most_read(&after_100) <= most_read(&first) + 2,
            "{replica:?}: quiet passes read {first:?} rows in incarnation 0 and {after_100:?} in incarnation 100"
        );
    }
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_replica_without_the_last_passs_state_reads_rows_that_grow_linearly_with_the_jobs() {
    let mut per_size = Vec::new();
    for jobs in [4, 16, 64] {
        let (quiet, _) = quiet_pass_reads(jobs, 0, Replica::Forgetful).await;
        let most = most_read(&quiet);
        // The operation, its jobs, its node, its allocations, and a few rows more (the gang queue, a message).
        assert!(most <= 2 * jobs as usize + 4, "{jobs} jobs: quiet passes read {quiet:?} rows");
        assert!(most >= 2 * jobs as usize, "{jobs} jobs: quiet passes read {quiet:?} rows: not every job?");
        per_size.push((jobs, most));
    }
    eprintln!("rows read by a quiet pass without the last pass's state, by jobs: {per_size:?}");
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_quiet_pass_of_the_replica_that_applied_the_last_reads_and_locks_a_few_rows_whatever_the_jobs() {
    for jobs in [4, 16, 64] {
        let (quiet, _) = quiet_pass_reads(jobs, 0, Replica::Kept).await;
        for pass in &quiet {
            // The operation row, its node, and the incarnation's first job: no other job and no allocation.
            assert!(pass.read <= 4, "{jobs} jobs: quiet passes read {quiet:?}");
            // The first job of the incarnation only (the one a revival looks at): a pass locks no job it does not
            // write.
            assert_eq!(pass.locked, 1, "{jobs} jobs: quiet passes locked {quiet:?}");
        }
    }
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_gang_restarts_passes_read_what_they_consume_not_every_job_each() {
    let jobs: u32 = 64;
    let mut totals = Vec::new();
    for replica in [Replica::Kept, Replica::Forgetful] {
        let store = MemStore::new(TokioClock::new(START));
        let counting = Counting { inner: store.clone(), passes: Arc::default() };
        let _manager = start_replica(&counting, replica);
        let (agent, op) = start_gang(&store, jobs, vec![first_job_fails()]).await;
        all_running(&store, op, 0, jobs).await;
        let from = counting.passes_len();
        all_running(&store, op, 1, jobs).await;
        let passes = counting.rows_since(from);
        agent.abort();
        let read: usize = passes.iter().map(|pass| pass.read).sum();
        let locked: usize = passes.iter().map(|pass| pass.locked).sum();
        // Locks follow the writes, whatever the replica kept: the 64 jobs aborted and the 64 new ones set running,
        // their 64 allocations, the 128 reports consumed, and the first job in every pass.
        let n = jobs as usize;
        assert!(locked <= 5 * n + passes.len(), "{replica:?}: the restart's passes locked {passes:?}");
        match replica {
            // The reports the passes consume (a failure, 63 kills, 64 starts), the ids of the 64 jobs the restart
            // inserted, and a few rows per pass.
            Replica::Kept => assert!(read <= 3 * n + 5 * passes.len(), "{replica:?}: the restart read {passes:?}"),
            Replica::Forgetful => {
                for pass in &passes {
                    assert!(pass.read >= 2 * n, "{replica:?}: a pass read fewer than every job: {passes:?}");
                }
            }
        }
        totals.push((replica, passes.len(), read, locked));
    }
    eprintln!("a 64-job gang restart: (replica, passes, rows read, rows locked): {totals:?}");
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
        let counts = DecodeCounts {
            decoded: after.decoded - before.decoded,
            reused: after.reused - before.reused,
            known: after.known - before.known,
        };
        self.passes.lock().unwrap().push(counts);
        pass
    }

    async fn process(&self, row: Row, pass: Pass) -> Result<Changes, WorkError> {
        Handler::<S>::process(&self.inner, row, pass).await
    }
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn passes_of_the_replica_that_applied_the_last_decode_nothing_they_kept() {
    let jobs: u32 = 64;
    let store = MemStore::new(TokioClock::new(START));
    let passes: Arc<Mutex<Vec<DecodeCounts>>> = Arc::default();
    let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
    let handler = PerPass { inner: OperationHandler::default(), passes: passes.clone() };
    manager.register(operation_pipeline_config(), handler).unwrap();
    manager.start();
    let (agent, op) = start_gang(&store, jobs, vec![first_job_fails()]).await;
    let passes_len = || passes.lock().unwrap().len();
    let since = |from: usize| passes.lock().unwrap()[from..].to_vec();
    let n = u64::from(jobs);

    // Quiet: every job runs and nothing changes; each pass takes every job and allocation as the pass before left
    // them, and decodes none.
    all_running(&store, op, 0, jobs).await;
    let from = passes_len();
    tokio::time::sleep(QUIET).await;
    let quiet = since(from);
    assert!(quiet.len() >= 4, "only {} passes in {QUIET:?}", quiet.len());
    for pass in &quiet {
        assert_eq!(*pass, DecodeCounts { decoded: 0, reused: 0, known: 2 * n }, "quiet passes: {quiet:?}");
    }

    // The gang restart: its passes take the jobs and allocations from the pass before too (the new jobs with the
    // ids the store gave them), so they decode none of the 64 aborted jobs, the 64 new ones or the allocations
    // given them, but for the trigger's: released by the restart (it is not reused, DESIGN §4), it is read among
    // the free ones and granted again.
    let from = passes_len();
    all_running(&store, op, 1, jobs).await;
    let restart = since(from);
    let decoded: u64 = restart.iter().map(|p| p.decoded).sum();
    assert!(decoded <= 1, "the restart's {} passes decoded rows: {restart:?}", restart.len());
    for pass in &restart {
        assert!(pass.known >= 2 * n - 1, "a pass of the restart did not have every job and allocation: {restart:?}");
    }
    agent.abort();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn passes_alternating_between_two_replicas_decode_only_the_rows_written_since_their_own_read() {
    let jobs: u32 = 16;
    let store = Arc::new(MemStore::new(TokioClock::new(START)));
    let replicas = [
        Pipeline::new(store.clone(), operation_pipeline_config()).unwrap(),
        Pipeline::new(store.clone(), operation_pipeline_config()).unwrap(),
    ];
    let passes: [Arc<Mutex<Vec<DecodeCounts>>>; 2] = Default::default();
    let handlers = passes.clone().map(|passes| PerPass { inner: OperationHandler::default(), passes });
    let (agent, op) = start_gang(&store, jobs, Vec::new()).await;
    // Pass by pass, each replica in turn: the operation's data always names the other replica's pass, so neither
    // takes the jobs and allocations from its own last pass; each reads them all and compares with its own read of
    // two passes before.
    let mut quiet = [Vec::new(), Vec::new()];
    for turn in 0..16 {
        tokio::time::sleep(Duration::from_secs(6)).await; // past min_processing_interval
        let r = turn % 2;
        let from = passes[r].lock().unwrap().len();
        replicas[r].fetcher(1).run_once().await.unwrap();
        while replicas[r].work_one(&handlers[r]).await.is_some() {}
        let view = api::status(store.as_ref(), op).await.unwrap();
        let running = view.jobs.iter().filter(|j| j.status == JobStatus::Running).count();
        if turn >= 8 && running == jobs as usize {
            quiet[r].extend(passes[r].lock().unwrap()[from..].iter().copied());
        }
    }
    agent.abort();
    let n = u64::from(jobs);
    for (r, counts) in quiet.iter().enumerate() {
        assert!(counts.len() >= 3, "replica {r}: only {} quiet passes: {counts:?}", counts.len());
        for pass in counts {
            assert_eq!(pass.known, 0, "replica {r} took rows from its last pass, which another pass followed");
            assert_eq!(*pass, DecodeCounts { decoded: 0, reused: 2 * n, known: 0 }, "replica {r}: {counts:?}");
        }
    }
}

/// Job cookie 0 of incarnation 0 exits with code 1 after [`FAIL_AFTER`]: the gang restarts once.
fn first_job_fails() -> Rule {
    Rule {
        task: Some("worker".into()),
        job_cookie: Some(0),
        attempt: Some(0),
        behaviour: Behaviour::exit_after(FAIL_AFTER, 1),
    }
}
