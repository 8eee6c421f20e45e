//! The workload: the rows a client inserts and the pipelines every replica runs over them (DESIGN §5).
//!
//! - `task` rows (`ready` → `finished`, or `failed`) are processed by the `tasks` pipeline: a simulated processing
//!   time, now and then longer than the lease ttl (heartbeats must keep the lease), and while faults are on, now
//!   and then a failure. A share of the tasks fails its first `task_fail_first_attempts` attempts, and a share fails
//!   every attempt (half of those by a panic), whatever the faults. A failure is recorded on the row and the row backs off (DESIGN §3,
//!   failures); at the pipeline's last attempt ([`WorkloadSpec::attempts_max`]) the row gives up as `failed`.
//! - `job` rows (`waiting` → `done`) are the tasks' parents (their ids are in the job's data). The `jobs` pipeline
//!   locks all of a job's tasks with `lock_related` (owner `jobs`), so it contends with `tasks` and resets for
//!   retry, and once every task is `finished` or `failed` it moves the finished ones and itself to `done` in one
//!   guarded apply (a `failed` task stays `failed`).
//! - `resource` rows are shared counters. Each `claims-{p}` pipeline (the extra pipelines competing for shared
//!   related rows) takes `claim-{p}` rows (`ready` → `done`), locks the claim's resource with `lock_shared` (owner
//!   `claims-{p}:{claim}`), and increments the resource's `count` in its guarded apply. A share of the claims
//!   goes to resource 0, a hot row. With `claim_resources` above 1 a claim locks that many resources at once, in
//!   a random order, and increments each.
//!
//! Every apply that does a row's work appends one `effect` event naming the pipeline (and the counter it
//! incremented), so the exactly-once checker can count effects against the rows and counters.
//!
//! The client inserts jobs and claims as two Poisson processes over the workload span. It retries every call
//! until it succeeds: inserts are keyed (a unique index at the database), so an insert whose reply was lost is
//! not duplicated by its retry.

#[cfg(madsim)]
use super::net_store::NetStore;
use super::rng;
#[cfg(madsim)]
use super::rpc::InsertHint;
#[cfg(madsim)]
use super::trace::Trace;
use crate::pipeline::{
    Changes, Failure, Handler, LoadCx, PipelineConfig, PipelineManager, RetryDecision, RetryPolicy, WorkError,
};
use crate::store::{Lease, NewEvent, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store, StoreError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::future::Future;
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Kind of the event every effectful apply appends.
pub const EFFECT_EVENT: &str = "effect";
/// Most attempts the client makes at one call before it fails the run (with its backoff, far past any fault).
pub const CLIENT_ATTEMPTS_MAX: u32 = 2_000;
/// The client's retry backoff: doubling from the first value, capped at the second.
pub const CLIENT_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));
/// The backoff of a failed row in every row pipeline ([`RetryPolicy`] `backoff_base`, `backoff_max`): short, so
/// that a row failing every attempt gives up (at the default 10 attempts) ≈ 13 s after its first failure, well
/// within a scenario's liveness bound.
pub const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// Status of a workload job until its tasks end: not a status of the gang controller's job rows (`running`), so
/// that the workload's `jobs` pipeline never leases a gang job of a scenario that runs both (it would fail on it,
/// for want of tasks, and in the end give it up).
pub const JOB_STATUS: &str = "waiting";
/// Status a row takes when its pipeline gives up on it.
pub const FAILED_STATUS: &str = "failed";

/// Workers of each pipeline on each replica.
#[derive(Clone, Debug)]
pub struct Workers {
    /// `tasks`.
    pub tasks: usize,
    /// `jobs`.
    pub jobs: usize,
    /// Each `claims-{p}`.
    pub claims: usize,
}

/// What the client inserts and how the pipelines behave.
#[derive(Clone)]
pub struct WorkloadSpec {
    /// The client inserts during `[0, span)` of simulated time.
    pub span: Duration,
    /// Jobs per simulated minute (a Poisson process).
    pub jobs_per_minute: f64,
    /// Tasks per job, uniform.
    pub tasks_per_job: RangeInclusive<u64>,
    /// Claims per simulated minute over all claim pipelines (a Poisson process).
    pub claims_per_minute: f64,
    /// Claim pipelines competing for the resources: `claims-0`, `claims-1`, …
    pub claim_pipelines: usize,
    /// Shared resource rows.
    pub resources: usize,
    /// Share of claims that go to resource 0.
    pub hot_share: f64,
    /// Resources each claim locks together with `lock_and_read_shared` (distinct, in a random order), at least 1
    /// and at most `resources`. With 2 or more, claims of one pipeline can each hold an intent mark on a row
    /// another needs: a cycle of marks that only related locks' age rule breaks (a younger item's mark gives way
    /// to an older item; `store::related_available`). A new user's trial found that livelock outside the
    /// simulator, whose claims then all locked one row.
    pub claim_resources: usize,
    /// Most rows the client inserts; the processes stop there. 0 turns the row workload off: the client inserts
    /// nothing (not even resources) and replicas run no row pipelines (a gang-only scenario).
    pub rows_max: usize,
    /// A task's processing time, uniform.
    pub task_process: Range<Duration>,
    /// Chance that a task is slow: processing time from `task_slow` instead, longer than the lease ttl.
    pub task_slow_chance: f64,
    /// A slow task's processing time, uniform.
    pub task_slow: Range<Duration>,
    /// Chance that a task's processing fails while faults are on (the failure is recorded and the row backs off).
    pub task_failure_chance: f64,
    /// Share of tasks that fail their first `task_fail_first_attempts` attempts, faults or not, then succeed.
    pub task_fail_first_share: f64,
    /// Attempts that a task of `task_fail_first_share` fails before it succeeds.
    pub task_fail_first_attempts: u32,
    /// Share of tasks that fail every attempt, so that their pipeline gives up on them (`failed`).
    pub task_fail_always_share: f64,
    /// Share of claims that fail their first `task_fail_first_attempts` attempts, faults or not, then succeed: rows
    /// no parent locks, so that their retries meet no related lock (scenarios/rows-retry-wake.toml).
    pub claim_fail_first_share: f64,
    /// Attempts after which every row pipeline gives up on a row ([`RetryPolicy::attempts_max`]), at least 1.
    pub attempts_max: u32,
    /// A job's processing time, uniform.
    pub job_process: Range<Duration>,
    /// A claim's processing time, uniform.
    pub claim_process: Range<Duration>,
    /// Workers per pipeline per replica.
    pub workers: Workers,
    /// Lease ttl of every pipeline (short, so that expiry happens often within a run).
    pub lease_ttl: Duration,
    /// Local lease margin of every pipeline.
    pub lease_margin: Duration,
    /// Minimum processing interval of every pipeline.
    pub min_processing_interval: Duration,
    /// Fetch loops of every pipeline ([`PipelineConfig::fetchers`]).
    pub fetchers: usize,
    /// Every pipeline's [`PipelineConfig::park_waiters`].
    pub park_waiters: bool,
    /// TEST ONLY: every pipeline's [`PipelineConfig::waitlist_disabled_for_mutation_test`] (the scenario's
    /// `[mutation] waitlist_disabled`).
    pub waitlist_disabled: bool,
    /// TEST ONLY: every pipeline's [`PipelineConfig::retry_wake_disabled_for_mutation_test`] (the scenario's
    /// `[mutation] retry_wake_disabled`).
    pub retry_wake_disabled: bool,
    /// TEST ONLY: every pipeline's [`PipelineConfig::contention_backoff_disabled_for_mutation_test`] (the
    /// scenario's `[mutation] contention_backoff_disabled`).
    pub contention_backoff_disabled: bool,
    /// TEST ONLY: every pipeline's [`PipelineConfig::park_wake_disabled_for_mutation_test`] (the scenario's
    /// `[mutation] park_wake_disabled`).
    pub park_wake_disabled: bool,
    /// Every pipeline's [`PipelineConfig::handler_timeout`] (`[pipeline] handler_timeout`); `None`: the engine's
    /// default (1 minute).
    pub handler_timeout: Option<Duration>,
}

/// Written by hand so that a workload without `park_waiters`, `park_wake_disabled` or `handler_timeout` prints as
/// it did before those fields existed: the
/// scenario's content hash ([`crate::sim::ScenarioFile::content_hash`]) is taken over this text, and replay files
/// of older runs carry it.
impl std::fmt::Debug for WorkloadSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let WorkloadSpec {
            span,
            jobs_per_minute,
            tasks_per_job,
            claims_per_minute,
            claim_pipelines,
            resources,
            hot_share,
            claim_resources,
            rows_max,
            task_process,
            task_slow_chance,
            task_slow,
            task_failure_chance,
            task_fail_first_share,
            task_fail_first_attempts,
            task_fail_always_share,
            claim_fail_first_share,
            attempts_max,
            job_process,
            claim_process,
            workers,
            lease_ttl,
            lease_margin,
            min_processing_interval,
            fetchers,
            park_waiters,
            waitlist_disabled,
            retry_wake_disabled,
            contention_backoff_disabled,
            park_wake_disabled,
            handler_timeout,
        } = self;
        let mut spec = f.debug_struct("WorkloadSpec");
        spec.field("span", span);
        spec.field("jobs_per_minute", jobs_per_minute);
        spec.field("tasks_per_job", tasks_per_job);
        spec.field("claims_per_minute", claims_per_minute);
        spec.field("claim_pipelines", claim_pipelines);
        spec.field("resources", resources);
        spec.field("hot_share", hot_share);
        spec.field("claim_resources", claim_resources);
        spec.field("rows_max", rows_max);
        spec.field("task_process", task_process);
        spec.field("task_slow_chance", task_slow_chance);
        spec.field("task_slow", task_slow);
        spec.field("task_failure_chance", task_failure_chance);
        spec.field("task_fail_first_share", task_fail_first_share);
        spec.field("task_fail_first_attempts", task_fail_first_attempts);
        spec.field("task_fail_always_share", task_fail_always_share);
        spec.field("claim_fail_first_share", claim_fail_first_share);
        spec.field("attempts_max", attempts_max);
        spec.field("job_process", job_process);
        spec.field("claim_process", claim_process);
        spec.field("workers", workers);
        spec.field("lease_ttl", lease_ttl);
        spec.field("lease_margin", lease_margin);
        spec.field("min_processing_interval", min_processing_interval);
        spec.field("fetchers", fetchers);
        spec.field("waitlist_disabled", waitlist_disabled);
        spec.field("retry_wake_disabled", retry_wake_disabled);
        spec.field("contention_backoff_disabled", contention_backoff_disabled);
        if *park_waiters {
            spec.field("park_waiters", park_waiters);
        }
        if *park_wake_disabled {
            spec.field("park_wake_disabled", park_wake_disabled);
        }
        if let Some(timeout) = handler_timeout {
            spec.field("handler_timeout", timeout);
        }
        spec.finish()
    }
}

impl WorkloadSpec {
    /// Names of the pipelines every replica runs.
    pub fn pipelines(&self) -> Vec<String> {
        let mut names = vec!["tasks".to_string(), "jobs".to_string()];
        names.extend((0..self.claim_pipelines).map(|p| format!("claims-{p}")));
        names
    }

    /// The config of one of the workload's pipelines: `name` (its lock owner) over rows of `kind` in `status`,
    /// with `workers` workers and this spec's lease ttl, lease margin, minimum processing interval and fetch loops. The
    /// scenario file validates every pipeline's config with it before a run.
    pub fn config(&self, name: &str, kind: &str, status: &str, workers: usize) -> PipelineConfig {
        let mut config = PipelineConfig::new(name, kind, &[status]).with_lease_ttl(self.lease_ttl);
        config.workers = workers;
        config.lease_margin = self.lease_margin;
        config.min_processing_interval = self.min_processing_interval;
        config.fetchers = self.fetchers;
        config.park_waiters = self.park_waiters;
        config.waitlist_disabled_for_mutation_test = self.waitlist_disabled;
        config.retry_wake_disabled_for_mutation_test = self.retry_wake_disabled;
        config.contention_backoff_disabled_for_mutation_test = self.contention_backoff_disabled;
        config.park_wake_disabled_for_mutation_test = self.park_wake_disabled;
        config.retry = retry_policy(self.attempts_max);
        if let Some(timeout) = self.handler_timeout {
            config.handler_timeout = timeout;
        }
        config
    }
}

/// The retry policy of every row pipeline of the workload: [`RETRY_BACKOFF`], giving up as [`FAILED_STATUS`] at
/// attempt `attempts_max`, the default jitter.
pub fn retry_policy(attempts_max: u32) -> RetryPolicy {
    RetryPolicy {
        attempts_max: Some(attempts_max),
        backoff_base: RETRY_BACKOFF.0,
        backoff_max: RETRY_BACKOFF.1,
        failed_status: FAILED_STATUS.into(),
        ..RetryPolicy::default()
    }
}

/// Whether `row` reached the end of its life in this workload: done, or given up.
pub fn is_terminal(row: &Row) -> bool {
    row.kind == "resource" || row.status == "done" || row.status == FAILED_STATUS
}

/// Whether `row` is one of the rows the workload's pipelines process (tasks, jobs, claims).
pub fn is_processed(row: &Row) -> bool {
    row.kind != "resource"
}

/// The pipeline whose apply must record exactly one effect for `row`, if any (none for a row given up: it was
/// never applied).
pub fn expected_effect(row: &Row) -> Option<String> {
    if row.status == FAILED_STATUS {
        return None;
    }
    match row.kind.as_str() {
        "task" => Some("tasks".into()),
        "job" => Some("jobs".into()),
        kind => kind.strip_prefix("claim-").map(|p| format!("claims-{p}")),
    }
}

/// Registers the workload's pipelines on a replica's manager.
///
/// `seed` keys the handlers' random streams (what a pass does depends on the seed and the lease's token only);
/// while `faults_on` is set, tasks fail now and then; while `hang` is set, every handler's `process` that starts
/// hangs ([`Hanging`]).
pub fn register<S: Store>(
    manager: &mut PipelineManager<S>,
    spec: &Arc<WorkloadSpec>,
    seed: u64,
    faults_on: &Arc<AtomicBool>,
    hang: &Arc<AtomicBool>,
) {
    let w = &spec.workers;
    let tasks = Tasks { seed, spec: spec.clone(), faults_on: faults_on.clone() };
    let hanging = |handler| Hanging::new(handler, hang.clone());
    manager.register(spec.config("tasks", "task", "ready", w.tasks), hanging(tasks)).expect("tasks config");
    let jobs = Hanging::new(Jobs { seed, spec: spec.clone() }, hang.clone());
    manager.register(spec.config("jobs", "job", JOB_STATUS, w.jobs), jobs).expect("jobs config");
    for p in 0..spec.claim_pipelines {
        let name = format!("claims-{p}");
        let config = spec.config(&name, &format!("claim-{p}"), "ready", w.claims);
        let claims = Hanging::new(Claims { seed, spec: spec.clone(), name }, hang.clone());
        manager.register(config, claims).expect("claims config");
    }
}

/// A row handler whose `process` never returns while its replica's `hang` flag is set when it starts (the
/// `handler-hang` fault): the pipeline's `handler_timeout` is all that ends it. Otherwise it is `H`.
pub struct Hanging<H> {
    handler: H,
    hang: Arc<AtomicBool>,
}

impl<H> Hanging<H> {
    /// `handler`, hanging while `hang` is set.
    pub fn new(handler: H, hang: Arc<AtomicBool>) -> Hanging<H> {
        Hanging { handler, hang }
    }
}

impl<S: Store, H: Handler<S>> Handler<S> for Hanging<H> {
    type Context = H::Context;

    fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> impl Future<Output = Result<H::Context, WorkError>> + Send {
        self.handler.load(row, cx)
    }

    async fn process(&self, row: Row, context: H::Context) -> Result<Changes, WorkError> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.handler.process(row, context).await
    }

    fn retry(&self, failure: &Failure<'_>) -> RetryDecision {
        self.handler.retry(failure)
    }
}

/// Store connections the pipelines [`register`] registers need together (each one's workers, fetcher and
/// heartbeater): the pool size a replica running them on PostgreSQL asks for (`lockstep chaos run`).
pub fn connections_needed(spec: &WorkloadSpec) -> usize {
    let w = &spec.workers;
    let mut configs =
        vec![spec.config("tasks", "task", "ready", w.tasks), spec.config("jobs", "job", JOB_STATUS, w.jobs)];
    for p in 0..spec.claim_pipelines {
        configs.push(spec.config(&format!("claims-{p}"), &format!("claim-{p}"), "ready", w.claims));
    }
    configs.iter().map(PipelineConfig::connections_needed).sum()
}

/// The effect event of `row`'s apply by `pipeline`, naming the `counters` it incremented: `counter` for one,
/// `counters` for several.
fn effect(row: RowId, pipeline: &str, counters: &[RowId]) -> NewEvent {
    let data = match counters {
        [] => json!({ "pipeline": pipeline }),
        [counter] => json!({ "pipeline": pipeline, "counter": counter.0 }),
        counters => json!({ "pipeline": pipeline, "counters": counters.iter().map(|id| id.0).collect::<Vec<_>>() }),
    };
    NewEvent { row_id: row, kind: EFFECT_EVENT.into(), data }
}

fn draw(rng: &mut ChaCha8Rng, range: &Range<Duration>) -> Duration {
    if range.is_empty() {
        return range.start;
    }
    Duration::from_micros(rng.random_range(range.start.as_micros() as u64..range.end.as_micros() as u64))
}

/// The stream of one processing pass: keyed by the lease's token, unique in the run.
fn pass_rng(seed: u64, purpose: &str, lease: Lease) -> ChaCha8Rng {
    rng::keyed(seed, purpose, lease.token.0 as u64)
}

/// `task` rows: `ready` → `finished`.
struct Tasks {
    seed: u64,
    spec: Arc<WorkloadSpec>,
    faults_on: Arc<AtomicBool>,
}

impl<S: Store> Handler<S> for Tasks {
    type Context = Lease;

    async fn load(&self, _row: &Row, cx: &LoadCx<'_, S>) -> Result<Lease, WorkError> {
        Ok(cx.lease())
    }

    async fn process(&self, row: Row, lease: Lease) -> Result<Changes, WorkError> {
        let mut rng = pass_rng(self.seed, "task", lease);
        let slow = rng.random_bool(self.spec.task_slow_chance);
        let span = draw(&mut rng, if slow { &self.spec.task_slow } else { &self.spec.task_process });
        tokio::time::sleep(span).await;
        let fail = rng.random_bool(self.spec.task_failure_chance);
        if fail && self.faults_on.load(Ordering::SeqCst) {
            return Err(WorkError::Failed(format!("task {} failed (planted)", row.id)));
        }
        match self.fate(row.id) {
            // Half of them panic: a panicking handler fails its item, not its worker (DESIGN §3).
            Fate::FailsAlways if row.id.0 % 2 == 0 => panic!("task {} always panics (planted)", row.id),
            Fate::FailsAlways => return Err(WorkError::Failed(format!("task {} always fails", row.id))),
            Fate::FailsFirst if row.attempts < self.spec.task_fail_first_attempts => {
                let attempt = row.attempts + 1;
                return Err(WorkError::Failed(format!("task {} fails attempt {attempt}", row.id)));
            }
            Fate::FailsFirst | Fate::Succeeds => {}
        }
        let events = vec![effect(row.id, "tasks", &[])];
        Ok(Changes { events, hints: vec!["job".into()], ..Changes::status("finished") })
    }
}

/// What a task does whatever the faults.
enum Fate {
    Succeeds,
    /// Fails its first `task_fail_first_attempts` attempts.
    FailsFirst,
    FailsAlways,
}

impl Tasks {
    /// Task `row`'s fate: a draw from its own stream (the seed and the row id), the same on every replica and
    /// at every attempt.
    fn fate(&self, row: RowId) -> Fate {
        let draw: f64 = rng::keyed(self.seed, "task-fate", row.0 as u64).random_range(0.0..1.0);
        if draw < self.spec.task_fail_always_share {
            Fate::FailsAlways
        } else if draw < self.spec.task_fail_always_share + self.spec.task_fail_first_share {
            Fate::FailsFirst
        } else {
            Fate::Succeeds
        }
    }
}

/// `job` rows: lock every task, and once all are `finished` (or `failed`), move the finished ones and the job to
/// `done`.
struct Jobs {
    seed: u64,
    spec: Arc<WorkloadSpec>,
}

impl<S: Store> Handler<S> for Jobs {
    type Context = (Lease, Vec<Row>);

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(Lease, Vec<Row>), WorkError> {
        let ids = task_ids(row)?;
        // Read under the locks, every task in the lock's own call (a get per task was a tenth of a
        // 10 000-row run's store calls, then a query after the lock a twentieth): a task may have finished between
        // the fetch and the lock.
        let tasks = cx.lock_and_read_related(ids.clone()).await?;
        if let Some(id) = ids.iter().find(|id| !tasks.iter().any(|task| task.id == **id)) {
            return Err(WorkError::Failed(format!("job {}: task {id} missing", row.id)));
        }
        Ok((cx.lease(), tasks))
    }

    async fn process(&self, row: Row, (lease, tasks): (Lease, Vec<Row>)) -> Result<Changes, WorkError> {
        let mut rng = pass_rng(self.seed, "job", lease);
        tokio::time::sleep(draw(&mut rng, &self.spec.job_process)).await;
        if !tasks.iter().all(|task| task.status == "finished" || task.status == FAILED_STATUS) {
            // Not yet: the apply only releases the locks and stamps `last_processed_at`.
            return Ok(Changes::default());
        }
        let finished = tasks.iter().filter(|task| task.status == "finished");
        let related = finished.map(|task| RelatedUpdate { id: task.id, update: RowUpdate::status("done") }).collect();
        Ok(Changes { related, events: vec![effect(row.id, "jobs", &[])], ..Changes::status("done") })
    }
}

fn task_ids(job: &Row) -> Result<Vec<RowId>, WorkError> {
    let ids = job.data["tasks"].as_array().ok_or_else(|| WorkError::Failed(format!("job {}: no tasks", job.id)))?;
    Ok(ids.iter().filter_map(|id| id.as_i64()).map(RowId).collect())
}

/// `claim-{p}` rows: lock the claim's resource (shared with every other claim), increment its counter.
struct Claims {
    seed: u64,
    spec: Arc<WorkloadSpec>,
    name: String,
}

impl<S: Store> Handler<S> for Claims {
    type Context = (Lease, Vec<Row>);

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(Lease, Vec<Row>), WorkError> {
        let wanted = claim_resources(row);
        if wanted.is_empty() {
            return Err(WorkError::Failed(format!("claim {}: no resource", row.id)));
        }
        let resources = cx.lock_and_read_shared(wanted.clone()).await?;
        if resources.len() != wanted.len() {
            return Err(WorkError::Failed(format!("claim {}: a resource is missing", row.id)));
        }
        Ok((cx.lease(), resources))
    }

    async fn process(&self, row: Row, (lease, resources): (Lease, Vec<Row>)) -> Result<Changes, WorkError> {
        let mut rng = pass_rng(self.seed, "claim", lease);
        tokio::time::sleep(draw(&mut rng, &self.spec.claim_process)).await;
        if row.attempts < self.spec.task_fail_first_attempts && self.fails_first(row.id) {
            let attempt = row.attempts + 1;
            return Err(WorkError::Failed(format!("claim {} fails attempt {attempt}", row.id)));
        }
        let increment = |resource: &Row| {
            let count = resource.data["count"].as_u64().unwrap_or(0) + 1;
            RelatedUpdate { id: resource.id, update: RowUpdate { status: None, data: Some(json!({ "count": count })) } }
        };
        let counters: Vec<RowId> = resources.iter().map(|resource| resource.id).collect();
        Ok(Changes {
            related: resources.iter().map(increment).collect(),
            events: vec![effect(row.id, &self.name, &counters)],
            ..Changes::status("done")
        })
    }
}

impl Claims {
    /// Whether claim `row` is one of the `claim_fail_first_share`: a draw from its own stream (the seed and the
    /// row id), the same on every replica and at every attempt; no draw at all when the share is zero.
    fn fails_first(&self, row: RowId) -> bool {
        let share = self.spec.claim_fail_first_share;
        share > 0.0 && rng::keyed(self.seed, "claim-fate", row.0 as u64).random_range(0.0..1.0) < share
    }
}

/// A claim's `claim_resources` distinct rows of `resources` (at least one): the first the hot one (the first) with
/// chance `hot_share`, else uniform, the others uniform among the rest, in the order drawn (so claims lock the same
/// rows in different orders). The simulator's client and `lockstep chaos run`'s draw the same.
pub fn pick_resources(spec: &WorkloadSpec, resources: &[RowId], rng: &mut ChaCha8Rng) -> Vec<RowId> {
    let uniform = |rng: &mut ChaCha8Rng| resources[rng.random_range(0..resources.len())];
    let first = if rng.random_bool(spec.hot_share) { resources[0] } else { uniform(rng) };
    let mut picked = vec![first];
    let wanted = spec.claim_resources.min(resources.len()).max(1);
    while picked.len() < wanted {
        let resource = uniform(rng);
        if !picked.contains(&resource) {
            picked.push(resource);
        }
    }
    picked
}

/// A `claim-{pipeline}` row over `resources`: data `resource` for one, `resources` for several.
pub fn claim_row(pipeline: usize, resources: &[RowId]) -> NewRow {
    let data = match resources {
        [resource] => json!({ "resource": resource.0 }),
        resources => json!({ "resources": resources.iter().map(|id| id.0).collect::<Vec<_>>() }),
    };
    NewRow::new(format!("claim-{pipeline}"), "ready", data)
}

/// The resources a claim locks: its data's `resource`, or its `resources` when it locks several.
fn claim_resources(row: &Row) -> Vec<RowId> {
    match row.data.get("resources").and_then(|ids| ids.as_array()) {
        Some(ids) => ids.iter().filter_map(|id| id.as_i64()).map(RowId).collect(),
        None => row.data["resource"].as_i64().map(RowId).into_iter().collect(),
    }
}

/// What the client inserted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientReport {
    /// Jobs inserted.
    pub jobs: usize,
    /// Tasks inserted.
    pub tasks: usize,
    /// Claims inserted.
    pub claims: usize,
    /// Resources inserted.
    pub resources: usize,
    /// Rows a user's workload inserted ([`super::user::WorkloadClient::insert`]).
    pub user_rows: usize,
}

impl ClientReport {
    /// Rows inserted.
    pub fn rows(&self) -> usize {
        self.jobs + self.tasks + self.claims + self.resources + self.user_rows
    }
}

#[cfg(madsim)]
/// The workload client: resources first, then jobs and claims as two Poisson processes over the span.
pub struct Client {
    store: NetStore,
    spec: Arc<WorkloadSpec>,
    seed: u64,
    trace: Trace,
    node: Arc<str>,
    report: ClientReport,
    resources: Vec<RowId>,
}

#[cfg(madsim)]
impl Client {
    /// A client over `store`.
    pub fn new(store: NetStore, spec: Arc<WorkloadSpec>, seed: u64, trace: Trace, node: Arc<str>) -> Client {
        Client { store, spec, seed, trace, node, report: ClientReport::default(), resources: Vec::new() }
    }

    /// Runs the workload to the end of its span (or its row bound) and reports what it inserted.
    pub async fn run(mut self) -> ClientReport {
        if self.spec.rows_max == 0 {
            return self.report;
        }
        for index in 0..self.spec.resources {
            let row = NewRow::new("resource", "free", json!({ "count": 0 }));
            let row = self
                .retry("insert resource", || self.store.insert_keyed(format!("resource-{index}"), row.clone()))
                .await;
            self.resources.push(row.id);
            self.report.resources += 1;
        }
        let mut jobs_rng = rng::stream(self.seed, "workload-jobs");
        let mut claims_rng = rng::stream(self.seed, "workload-claims");
        let start = tokio::time::Instant::now();
        let mut next_job = exponential(&mut jobs_rng, self.spec.jobs_per_minute);
        let mut next_claim = exponential(&mut claims_rng, self.spec.claims_per_minute);
        loop {
            let (at, is_job) = if next_job <= next_claim { (next_job, true) } else { (next_claim, false) };
            if at >= self.spec.span || self.report.rows() >= self.spec.rows_max {
                break;
            }
            tokio::time::sleep_until(start + at).await;
            if is_job {
                self.insert_job(&mut jobs_rng).await;
                next_job += exponential(&mut jobs_rng, self.spec.jobs_per_minute);
            } else {
                let resources = pick_resources(&self.spec, &self.resources, &mut claims_rng);
                let pipeline = claims_rng.random_range(0..self.spec.claim_pipelines.max(1));
                self.insert_claim(format!("claim-{}", self.report.claims), pipeline, &resources).await;
                next_claim += exponential(&mut claims_rng, self.spec.claims_per_minute);
            }
        }
        self.trace.record(&self.node, "workload-done", format!("{:?}", self.report));
        self.report
    }

    /// `claims` claims at once on resource 0 (lock contention on one row), keyed by `burst`.
    pub async fn burst(mut self, burst: u64, claims: usize) -> ClientReport {
        let row = NewRow::new("resource", "free", json!({ "count": 0 }));
        let hot = self.retry("find resource 0", || self.store.insert_keyed("resource-0".into(), row.clone())).await;
        for index in 0..claims {
            let pipeline = index % self.spec.claim_pipelines.max(1);
            self.insert_claim(format!("burst-{burst}-{index}"), pipeline, &[hot.id]).await;
        }
        self.report
    }

    async fn insert_job(&mut self, rng: &mut ChaCha8Rng) {
        let key = format!("job-{}", self.report.jobs);
        let count = rng.random_range(self.spec.tasks_per_job.clone());
        // The tasks, then the job naming them, in one call of keyed inserts (one round trip per job, not
        // one per row), which hints the tasks and the job (marked hinted, so it is fetched at once): safe to
        // retry. (Inserting the job `pending` and starting it with `update_unleased` is not: that write is blind,
        // and a retry of one whose reply was lost can land after the job finished and set it back to `running`,
        // for good; the simulator found exactly that, seed 6 of the mixed scenario.)
        let tasks: Vec<NewRow> =
            (0..count).map(|index| NewRow::new("task", "ready", json!({ "index": index, "job": key }))).collect();
        let job = NewRow::new("job", JOB_STATUS, json!({ "tasks": [] }));
        let insert = || self.store.insert_job(key.clone(), tasks.clone(), job.clone());
        self.retry("insert job", insert).await;
        self.report.jobs += 1;
        self.report.tasks += tasks.len();
    }

    async fn insert_claim(&mut self, key: String, pipeline: usize, resources: &[RowId]) {
        let claim = claim_row(pipeline, resources);
        let insert = || self.store.insert_keyed_hinting(key.clone(), claim.clone(), Some(InsertHint::Kind));
        self.retry("insert claim", insert).await;
        self.report.claims += 1;
    }

    async fn retry<T, F, Fut>(&self, what: &str, call: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        retry_call(what, call).await
    }
}

/// Repeats `call` until it succeeds, backing off ([`CLIENT_BACKOFF`]); fails the run (panics naming `what`)
/// after [`CLIENT_ATTEMPTS_MAX`] attempts. Only for calls safe to repeat (keyed inserts, reads, hints).
pub async fn retry_call<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = CLIENT_BACKOFF.0;
    for _ in 0..CLIENT_ATTEMPTS_MAX {
        match call().await {
            Ok(value) => return value,
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(CLIENT_BACKOFF.1);
            }
        }
    }
    panic!("client: {what} failed {CLIENT_ATTEMPTS_MAX} times in a row")
}

/// A Poisson process's next gap at `per_minute` events per minute (never, for a rate of 0).
pub fn exponential(rng: &mut ChaCha8Rng, per_minute: f64) -> Duration {
    if per_minute <= 0.0 {
        return Duration::MAX / 4;
    }
    let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
    Duration::from_secs_f64(-uniform.ln() * 60.0 / per_minute)
}
