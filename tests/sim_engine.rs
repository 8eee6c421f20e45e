//! The pipeline engine under the simulator (DESIGN §5), on a MemStore that records every commit.
//!
//! World: two replicas, each a madsim node running a [`PipelineManager`] with two pipelines over one shared
//! MemStore whose clock is simulated time:
//! - `tasks` leases `task` rows in `ready`, sleeps a simulated processing time, and marks them `finished`;
//!   while faults are on, some passes fail and leave their lease to expire;
//! - `jobs` leases `job` rows in `running`, locks all of the job's tasks with `lock_related` (so it contends
//!   with `tasks` and resets for retry), and once every task is `finished` moves them and itself to `done`.
//!
//! A client inserts jobs with their tasks over [`WORKLOAD_SPAN`], hinting fetchers; a fault process pauses a
//! replica for longer than the lease ttl (its leases expire and the other replica takes them over). Then faults
//! stop, the harness waits (within a budget of simulated time) until every row is `done`, and shuts the replicas
//! down. The trace is the store's commit history, one line per commit.
//!
//! All randomness is drawn from ChaCha streams seeded by the run's seed, one stream per purpose (DESIGN §5).
//! Replay one seed: `LOCKSTEP_SIM_SEED=<seed> cargo sim-test --test sim_engine`.
#![cfg(madsim)]

use lockstep::pipeline::{
    Changes, Handler, LoadCx, ManagerOptions, PipelineConfig, PipelineManager, ShutdownReport, WorkError,
};
use lockstep::store::{
    Commit, CommitOp, Lease, LockOutcome, LockToken, MemStore, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store,
    Timestamp, TokioClock,
};
use madsim::runtime::{Handle, Runtime};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Seeds every run of the invariant test uses (pinned, shared/notes/madsim.md pitfall 4).
const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];
/// Store time at the start of every run: 2023-11-14, an arbitrary fixed origin.
const ORIGIN: Timestamp = Timestamp(1_700_000_000_000_000);
/// Replicas, each a madsim node with its own manager.
const REPLICAS: usize = 2;
/// How long the client inserts jobs and faults run, simulated time.
const WORKLOAD_SPAN: Duration = Duration::from_secs(90);
/// Most simulated time after the workload for every row to reach `done`.
const CONVERGENCE_BUDGET: Duration = Duration::from_secs(600);
/// Simulated time limit of a run: a hang fails loudly instead of spinning.
const SIM_TIME_LIMIT: Duration = Duration::from_secs(3600);
/// Lease ttl of both pipelines; short so that expiry happens often within a run.
const LEASE_TTL: Duration = Duration::from_secs(6);
/// Chance that a task pass fails while faults are on (its lease is left to expire).
const TASK_FAILURE_CHANCE: f64 = 0.15;
/// Chance that a task pass is slow: longer than the lease ttl, so heartbeats must keep it.
const TASK_SLOW_CHANCE: f64 = 0.1;
/// Replica pauses per run, each for a span drawn in [`PAUSE_SPAN_MIN`, 3 × `LEASE_TTL`).
const PAUSES: usize = 3;
/// Shortest pause: past the lease ttl, so the paused replica's leases expire.
const PAUSE_SPAN_MIN: Duration = Duration::from_secs(8);

/// Purposes of the run's random streams (DESIGN §5: one stream per purpose).
const STREAM_WORKLOAD: u64 = 1;
const STREAM_FAULTS: u64 = 2;
const STREAM_TASK: u64 = 3;
const STREAM_JOB: u64 = 4;

/// What one run left behind.
struct Outcome {
    seed: u64,
    history: Vec<Commit>,
    rows: Vec<Row>,
    reports: Vec<ShutdownReport>,
}

impl Outcome {
    /// The store's history, one commit per line.
    fn trace(&self) -> String {
        self.history.iter().map(Commit::to_string).collect::<Vec<_>>().join("\n")
    }
}

/// A ChaCha stream for `purpose` seeded by the run's seed.
fn stream_rng(seed: u64, purpose: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(purpose);
    rng
}

/// A ChaCha stream for one processing pass of one lease: what a pass does depends on (seed, lease) only, not on
/// which worker or replica runs it, nor on how passes interleave.
fn lease_rng(seed: u64, purpose: u64, lease: Lease) -> ChaCha8Rng {
    let key = seed
        ^ (lease.id.0 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (lease.token.0 as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    stream_rng(key, purpose)
}

fn config(name: &str, kind: &str, status: &str, workers: usize) -> PipelineConfig {
    let mut config = PipelineConfig::new(name, kind, &[status]).with_lease_ttl(LEASE_TTL);
    config.workers = workers;
    config.lease_margin = Duration::from_secs(1);
    config.min_processing_interval = Duration::from_secs(1);
    config
}

/// Processes `task` rows: a simulated processing time, sometimes a failure, then `finished`.
struct TaskHandler {
    seed: u64,
    faults: Arc<AtomicBool>,
}

impl Handler<MemStore> for TaskHandler {
    type Context = Lease;

    async fn load(&self, _row: &Row, cx: &LoadCx<'_, MemStore>) -> Result<Lease, WorkError> {
        Ok(cx.lease())
    }

    async fn process(&self, _row: Row, lease: Lease) -> Result<Changes, WorkError> {
        let mut rng = lease_rng(self.seed, STREAM_TASK, lease);
        let millis = if rng.random_bool(TASK_SLOW_CHANCE) {
            rng.random_range(7_000..15_000)
        } else {
            rng.random_range(20..2_000)
        };
        tokio::time::sleep(Duration::from_millis(millis)).await;
        let fail = rng.random_bool(TASK_FAILURE_CHANCE);
        if fail && self.faults.load(Ordering::SeqCst) {
            return Err(WorkError::Failed(format!("task {} failed (planted)", lease.id)));
        }
        Ok(Changes { hints: vec!["job".into()], ..Changes::status("finished") })
    }
}

/// Processes `job` rows: locks every task of the job, and completes the job once all of them finished.
struct JobHandler {
    seed: u64,
}

impl Handler<MemStore> for JobHandler {
    type Context = (Lease, Vec<Row>);

    async fn load(&self, row: &Row, cx: &LoadCx<'_, MemStore>) -> Result<(Lease, Vec<Row>), WorkError> {
        let tasks = cx.store().list("task", Some(row.id)).await?;
        cx.lock_related(tasks.iter().map(|task| task.id).collect()).await?;
        // Read again under the locks: a task may have finished between the list and the lock.
        Ok((cx.lease(), cx.store().list("task", Some(row.id)).await?))
    }

    async fn process(&self, row: Row, (lease, tasks): (Lease, Vec<Row>)) -> Result<Changes, WorkError> {
        let mut rng = lease_rng(self.seed, STREAM_JOB, lease);
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..300))).await;
        let expected = row.data["tasks"].as_u64().expect("a job row names its task count") as usize;
        let all_finished = tasks.len() == expected && tasks.iter().all(|task| task.status == "finished");
        if !all_finished {
            // Nothing to do yet: the apply only releases the locks and stamps `last_processed_at`.
            return Ok(Changes::default());
        }
        let related =
            tasks.iter().map(|task| RelatedUpdate { id: task.id, update: RowUpdate::status("done") }).collect();
        Ok(Changes { related, ..Changes::status("done") })
    }
}

/// One replica: a manager with both pipelines, from start until `stop`, then a drain.
async fn replica(store: MemStore, seed: u64, faults: Arc<AtomicBool>, stop: Arc<Notify>) -> ShutdownReport {
    let mut manager = PipelineManager::new(Arc::new(store), ManagerOptions { seed });
    manager.register(config("tasks", "task", "ready", 3), TaskHandler { seed, faults }).expect("tasks config");
    manager.register(config("jobs", "job", "running", 2), JobHandler { seed }).expect("jobs config");
    manager.start();
    stop.notified().await;
    manager.shutdown().await
}

/// The client: a job with 1–4 tasks every 0.5–4 s over the workload span, each insert followed by a hint.
async fn workload(store: MemStore, seed: u64) -> usize {
    let mut rng = stream_rng(seed, STREAM_WORKLOAD);
    let start = tokio::time::Instant::now();
    let mut jobs = 0;
    while start.elapsed() < WORKLOAD_SPAN {
        let tasks: u64 = rng.random_range(1..=4);
        let job = store.insert(NewRow::new("job", "running", json!({ "tasks": tasks }))).await.expect("insert job");
        for index in 0..tasks {
            let task = NewRow::new("task", "ready", json!({ "index": index })).with_parent(job.id);
            let task = store.insert(task).await.expect("insert task");
            store.hint("task", Some(task.id)).await.expect("hint task");
        }
        store.hint("job", Some(job.id)).await.expect("hint job");
        jobs += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..4_000))).await;
    }
    jobs
}

/// The fault process: pauses a random replica at random times, each for longer than the lease ttl.
async fn pauses(nodes: Vec<madsim::task::NodeId>, seed: u64) {
    let mut rng = stream_rng(seed, STREAM_FAULTS);
    let handle = Handle::current();
    let slot = WORKLOAD_SPAN / PAUSES as u32;
    for _ in 0..PAUSES {
        let span = Duration::from_millis(
            rng.random_range(PAUSE_SPAN_MIN.as_millis() as u64..(LEASE_TTL * 3).as_millis() as u64),
        );
        let before = Duration::from_millis(rng.random_range(0..(slot - span).as_millis() as u64));
        let node = nodes[rng.random_range(0..nodes.len())];
        tokio::time::sleep(before).await;
        handle.pause(node);
        tokio::time::sleep(span).await;
        handle.resume(node);
        tokio::time::sleep(slot - before - span).await;
    }
}

/// Rows not yet `done`, by id.
fn unfinished(store: &MemStore) -> Vec<RowId> {
    store.rows().into_iter().filter(|row| row.status != "done").map(|row| row.id).collect()
}

/// One run of the world on the current (simulated) runtime.
async fn scenario(seed: u64) -> Outcome {
    let store = MemStore::with_history(TokioClock::new(ORIGIN));
    RUN_STORE.with(|cell| *cell.borrow_mut() = Some(store.clone()));
    let faults = Arc::new(AtomicBool::new(true));
    let handle = Handle::current();
    let mut replicas = Vec::new();
    for index in 0..REPLICAS {
        let node = handle
            .create_node()
            .name(format!("replica-{index}"))
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, index as u8 + 1)))
            .build();
        let stop = Arc::new(Notify::new());
        let replica_seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(index as u64);
        let task = node.spawn(replica(store.clone(), replica_seed, faults.clone(), stop.clone()));
        replicas.push((node.id(), stop, task));
    }
    let fault_process = tokio::spawn(pauses(replicas.iter().map(|(id, ..)| *id).collect(), seed));
    let jobs = workload(store.clone(), seed).await;
    assert!(jobs > 0, "seed {seed}: the workload inserted no job");
    fault_process.await.expect("fault process");
    // Faults stop; every row must now reach `done` within the budget.
    faults.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    loop {
        let left = unfinished(&store);
        if left.is_empty() {
            break;
        }
        assert!(
            healed.elapsed() < CONVERGENCE_BUDGET,
            "seed {seed}: rows {left:?} not done {CONVERGENCE_BUDGET:?} after faults stopped"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut reports = Vec::new();
    for (_, stop, task) in replicas {
        stop.notify_one();
        reports.push(task.await.expect("replica task"));
    }
    Outcome { seed, history: store.history(), rows: store.rows(), reports }
}

/// Lines of a failing run's trace printed with its failure; the whole trace goes to [`failed_trace_path`].
const FAILED_TRACE_TAIL: usize = 40;

thread_local! {
    /// The store of the run on this thread, so that a failing run can still print its trace.
    static RUN_STORE: std::cell::RefCell<Option<MemStore>> = const { std::cell::RefCell::new(None) };
}

/// Where a failing run's whole trace is written.
fn failed_trace_path(seed: u64) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lockstep-sim-engine-seed-{seed}.trace"))
}

/// Runs `seed` in a fresh runtime on a fresh thread (one world per runtime; a fresh thread keeps std `HashMap`
/// seeding deterministic, shared/notes/madsim.md pitfall 2). A failing run prints the tail of its trace, writes
/// the whole trace to a file, and prints the command that replays it. With `LOCKSTEP_SIM_TRACE_DIR` set, every
/// run writes its trace there as `seed-<seed>.trace`.
fn run(seed: u64) -> Outcome {
    std::thread::spawn(move || {
        let mut runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.set_time_limit(SIM_TIME_LIMIT);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(scenario(seed))));
        if let (Ok(outcome), Ok(dir)) = (&result, std::env::var("LOCKSTEP_SIM_TRACE_DIR")) {
            let path = std::path::Path::new(&dir).join(format!("seed-{seed}.trace"));
            std::fs::write(&path, outcome.trace()).expect("LOCKSTEP_SIM_TRACE_DIR must be a writable directory");
        }
        result.unwrap_or_else(|panic| {
            if let Some(store) = RUN_STORE.with(|cell| cell.borrow_mut().take()) {
                let lines: Vec<String> = store.history().iter().map(Commit::to_string).collect();
                let path = failed_trace_path(seed);
                let written = std::fs::write(&path, lines.join("\n"));
                let tail = lines[lines.len().saturating_sub(FAILED_TRACE_TAIL)..].join("\n");
                eprintln!("seed {seed}: last {FAILED_TRACE_TAIL} commits:\n{tail}");
                eprintln!("seed {seed}: whole trace written to {} ({written:?})", path.display());
            }
            eprintln!("replay: LOCKSTEP_SIM_SEED={seed} cargo sim-test --test sim_engine");
            std::panic::resume_unwind(panic)
        })
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The seeds to run: `LOCKSTEP_SIM_SEED` alone when set (replay); seeds 1 to `LOCKSTEP_SIM_SEED_COUNT` when that
/// is set (a sweep); else the pinned [`SEEDS`].
fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("LOCKSTEP_SIM_SEED") {
        return vec![seed.parse().expect("LOCKSTEP_SIM_SEED must be a u64")];
    }
    if let Ok(count) = std::env::var("LOCKSTEP_SIM_SEED_COUNT") {
        let count: u64 = count.parse().expect("LOCKSTEP_SIM_SEED_COUNT must be a u64");
        return (1..=count).collect();
    }
    SEEDS.to_vec()
}

/// Lease exclusivity (DESIGN §5): replays the history, tracking the latest token handed out per row (by a fetch,
/// or to a related row by a successful `lock_related`), and fails at the first commit that succeeded with any
/// other token: an applied apply (main and related rows), a heartbeat that extended, a held reset, a release, or a
/// lock. Also checks that a fetch's token is larger than every earlier token of the row.
fn check_lease_exclusivity(history: &[Commit]) -> Result<(), String> {
    let mut latest: BTreeMap<RowId, LockToken> = BTreeMap::new();
    for (index, commit) in history.iter().enumerate() {
        let check = |latest: &BTreeMap<RowId, LockToken>, id: RowId, token: LockToken| {
            let current = latest.get(&id).copied();
            if current == Some(token) {
                return Ok(());
            }
            Err(format!("commit {index} `{commit}`: row {id} used token {token}, latest handed out is {current:?}"))
        };
        match &commit.op {
            CommitOp::Fetch { leases, .. } => {
                for lease in leases {
                    if let Some(previous) = latest.get(&lease.id).filter(|previous| **previous >= lease.token) {
                        return Err(format!(
                            "commit {index} `{commit}`: token {} of row {} is not above its previous token {previous}",
                            lease.token, lease.id
                        ));
                    }
                    latest.insert(lease.id, lease.token);
                }
            }
            CommitOp::LockRelated { holder, related, outcome: LockOutcome::Locked, .. } => {
                check(&latest, holder.id, holder.token)?;
                for id in related {
                    latest.insert(*id, holder.token);
                }
            }
            CommitOp::Apply { lease, applied: true, related, .. } => {
                check(&latest, lease.id, lease.token)?;
                for id in related {
                    check(&latest, *id, lease.token)?;
                }
            }
            CommitOp::Heartbeat { held } => held.iter().try_for_each(|lease| check(&latest, lease.id, lease.token))?,
            CommitOp::Release { released } => {
                released.iter().try_for_each(|lease| check(&latest, lease.id, lease.token))?
            }
            CommitOp::Reset { lease, held: true } => check(&latest, lease.id, lease.token)?,
            _ => {}
        }
    }
    Ok(())
}

#[test]
fn same_seed_gives_a_byte_identical_trace() {
    let seed = seeds()[0];
    let first = run(seed).trace();
    let second = run(seed).trace();
    assert!(first.lines().count() > 100, "seed {seed}: trace too short to mean anything:\n{first}");
    if first != second {
        let (index, (a, b)) = first
            .lines()
            .zip(second.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((first.lines().count().min(second.lines().count()), ("<end>", "<end>")));
        panic!("seed {seed}: traces diverge at line {index}:\n  first:  {a}\n  second: {b}");
    }
}

#[test]
fn different_seeds_give_different_traces() {
    let one = run(11).trace();
    let other = run(12).trace();
    assert_ne!(one, other, "seeds 11 and 12 gave the same trace: the seed does not reach the world");
}

#[test]
fn every_row_ends_done_unlocked_and_applied_only_by_its_latest_lease() {
    let outcomes: Vec<Outcome> = seeds().into_iter().map(run).collect();
    let mut exercised = Exercised::default();
    for outcome in &outcomes {
        let seed = outcome.seed;
        let replay = format!("replay: LOCKSTEP_SIM_SEED={seed} cargo sim-test --test sim_engine");
        if let Err(violation) = check_lease_exclusivity(&outcome.history) {
            panic!("seed {seed}: lease exclusivity: {violation}\n{replay}");
        }
        for row in &outcome.rows {
            assert_eq!(row.status, "done", "seed {seed}: row {} ({}) ended {}\n{replay}", row.id, row.kind, row.status);
            assert_eq!(row.lock_token, None, "seed {seed}: row {} still carries a token\n{replay}", row.id);
            assert_eq!(row.lock_owner, None, "seed {seed}: row {} still has an owner\n{replay}", row.id);
            assert_eq!(row.lock_expires_at, None, "seed {seed}: row {} still has an expiry\n{replay}", row.id);
        }
        assert!(outcome.rows.iter().any(|row| row.kind == "job"), "seed {seed}: no job ran");
        for report in &outcome.reports {
            assert_eq!(report.release_errors, 0, "seed {seed}: a release on shutdown failed");
        }
        exercised.add(&outcome.history);
    }
    // The scenario must keep reaching the paths it exists for, or the invariants above hold vacuously.
    assert!(exercised.resets > 0, "no reset-and-retry happened in any seed: {exercised:?}");
    assert!(exercised.takeovers > 0, "no expired lease was taken over in any seed: {exercised:?}");
    assert!(exercised.stale_applies > 0, "no apply was stale in any seed: {exercised:?}");
    assert!(exercised.contended > 0, "no related lock was contended in any seed: {exercised:?}");
}

/// How often a run went through the paths the faults are there to reach.
#[derive(Debug, Default)]
struct Exercised {
    /// Held reset-and-retry commits.
    resets: usize,
    /// Fetches of a row whose previous lease was never applied, reset or released: it expired.
    takeovers: usize,
    /// Applies that found their token superseded.
    stale_applies: usize,
    /// Contended related locks.
    contended: usize,
}

impl Exercised {
    fn add(&mut self, history: &[Commit]) {
        let mut open: BTreeMap<RowId, bool> = BTreeMap::new();
        for commit in history {
            match &commit.op {
                CommitOp::Fetch { leases, .. } => {
                    for lease in leases {
                        if open.insert(lease.id, true) == Some(true) {
                            self.takeovers += 1;
                        }
                    }
                }
                CommitOp::Apply { lease, applied, .. } => {
                    if *applied {
                        open.insert(lease.id, false);
                    } else {
                        self.stale_applies += 1;
                    }
                }
                CommitOp::Reset { lease, held: true } => {
                    self.resets += 1;
                    open.insert(lease.id, false);
                }
                CommitOp::Release { released } => {
                    for lease in released {
                        open.insert(lease.id, false);
                    }
                }
                CommitOp::LockRelated { outcome: LockOutcome::Contended, .. } => self.contended += 1,
                _ => {}
            }
        }
    }
}

#[test]
fn lease_exclusivity_checker_fires_on_an_apply_with_a_superseded_token() {
    let at = ORIGIN;
    let lease = |id, token| Lease { id: RowId(id), token: LockToken(token) };
    let fetch = |l: Lease| Commit { at, op: CommitOp::Fetch { pipeline: "p".into(), leases: vec![l] } };
    let apply = |l: Lease| Commit {
        at,
        op: CommitOp::Apply { lease: l, applied: true, related: Vec::new(), inserted: Vec::new() },
    };
    let clean = vec![fetch(lease(1, 1)), fetch(lease(1, 2)), apply(lease(1, 2))];
    assert_eq!(check_lease_exclusivity(&clean), Ok(()));
    // Planted bug: the first holder's apply succeeds after the row was leased again.
    let planted = vec![fetch(lease(1, 1)), fetch(lease(1, 2)), apply(lease(1, 1))];
    let violation = check_lease_exclusivity(&planted).expect_err("the checker missed a superseded apply");
    assert!(violation.contains("row 1 used token 1"), "{violation}");
    // Planted bug: a related row applied under a token whose lock it never got.
    let mut related = apply(lease(1, 1));
    if let CommitOp::Apply { related: rows, .. } = &mut related.op {
        rows.push(RowId(2));
    }
    let lock = Commit {
        at,
        op: CommitOp::LockRelated {
            holder: lease(1, 1),
            related: vec![RowId(2)],
            owner: "p".into(),
            outcome: LockOutcome::Locked,
        },
    };
    let planted = vec![fetch(lease(1, 1)), lock, fetch(lease(2, 5)), related];
    let violation = check_lease_exclusivity(&planted).expect_err("the checker missed a superseded related row");
    assert!(violation.contains("row 2 used token 1"), "{violation}");
}
