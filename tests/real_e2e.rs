//! Real mode end to end: the built `lockstep` binary as `serve` replicas and `agent` processes on one PostgreSQL
//! schema, running real shell commands, with short lease times. Needs PostgreSQL (DATABASE_URL); never skips.
//!
//! - the seed's gang example (3 jobs) survives a killed job process (one gang restart), a replica killed with
//!   SIGKILL while it holds the operation's lease (the other one takes over once the lease expires and finishes
//!   it) and an agent killed with SIGKILL (its job processes die with it, its jobs are declared lost and the gang
//!   restarts on the other nodes);
//! - the seed's master/slave example (1 + 100 short jobs) completes on 3 agents;
//! - a job sees only its own environment (not the agent's DATABASE_URL or LOCKSTEP_SCHEMA), in a private sandbox,
//!   and every process of a job whose agent was killed with SIGKILL (background children, a pipeline, an orphan,
//!   one that left the job's session) is gone once an agent starts again on the same work dir;
//! - SIGTERM stops an agent gracefully (its jobs restart elsewhere at once, long before its lease would expire) and
//!   drains a replica caught mid-pass (the lease is gone when it exits 0);
//! - `submit --wait` exits with the operation's outcome; bad input exits 2 naming the field;
//! - a task without gang_options of a gang operation has ranks and sizes (`YT_GANG_RANK`, `YT_TASK_GANG_SIZE`,
//!   counted in `YT_GANG_SIZE`) in real jobs, under `serve --gang-placement all_or_nothing`;
//! - the real-mode walk-through (docs/real-mode.md) names commands and flags that exist and a spec that parses.
//!
//! Each job of the gang tests appends `incarnation cookie rank pid` to `OUT/rank-$YT_GANG_RANK` when it starts and
//! then waits for the file `OUT/go`, so the test decides when a gang may complete.
#![cfg(not(madsim))]

use crate::support;

use support::command::clean_command;

use lockstep::gang::api::{self, OperationView};
use lockstep::gang::audit;
use lockstep::gang::model::{Allocation, JobStatus, KIND_ALLOCATION, KIND_NODE, OperationStatus};
use lockstep::gang::status::StatusReport;
use lockstep::gang::{OperationSpec, SpecFormat};
use lockstep::store::conformance::Harness;
use lockstep::store::{LockToken, PgStore, RowId, Store, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use support::pg::PgHarness;
use support::procs::{Reaper, alive_with, process_gone};

const BIN: &str = env!("CARGO_BIN_EXE_lockstep");
const SEED_GANG: &str = include_str!("../scenarios/specs/seed-gang.yson");
const SEED_GANG_COMMAND: &str =
    "echo rank $YT_GANG_RANK of $YT_GANG_SIZE, cookie $YT_JOB_COOKIE, incarnation $YT_OPERATION_INCARNATION; sleep 30";

/// Operation lease of the replicas in these tests (`serve --lease-ttl`).
const REPLICA_LEASE_TTL: Duration = Duration::from_secs(4);
/// Flags of every replica: a short lease, passes over running operations every second.
const REPLICA_FLAGS: &[&str] = &[
    "--workers",
    "4",
    "--lease-ttl",
    "4s",
    "--lease-margin",
    "500ms",
    "--heartbeat-interval",
    "250ms",
    "--min-processing-interval",
    "1s",
];
/// Node lease of the agents in these tests (`agent --lease-ttl`).
const AGENT_LEASE_TTL: Duration = Duration::from_secs(3);
/// Flags of the agents: a short node lease, a pass every 200 ms.
const AGENT_FLAGS: &[&str] = &["--lease-ttl", "3s", "--lease-margin", "1s", "--poll-interval", "200ms"];

/// A fresh directory under the system's temp dir, removed when dropped (kept when the test failed).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lockstep-real-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} of the failed test", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The child processes of a test. Dropping it kills (SIGKILL) and reaps every one still running, and prints the
/// end of each one's log when the test is failing.
struct Processes {
    children: BTreeMap<String, Child>,
    logs: PathBuf,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (name, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                let log = std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- {name} (last lines) ----");
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Replicas and agents on a schema of their own. Fields drop in order: processes, then the temp dir, then the
/// schema (which cannot be dropped while the processes hold sessions on it).
struct Cluster {
    processes: Processes,
    dir: TempDir,
    harness: PgHarness,
}

fn signal(child: &Child, signal: i32) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: kill only sends a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to {pid}");
}

/// Waits up to `limit` for `child` to exit.
async fn exit_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < limit, "process {} still running after {limit:?}", child.id());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Cluster {
    async fn new(name: &str) -> Cluster {
        let harness = PgHarness::with(|options| options.max_connections = 4).await;
        let dir = TempDir::new(name);
        let logs = dir.0.join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let cluster = Cluster { processes: Processes { children: BTreeMap::new(), logs }, dir, harness };
        let migrate = cluster.cli(&["migrate"]);
        assert!(migrate.status.success(), "migrate: {}", String::from_utf8_lossy(&migrate.stderr));
        cluster
    }

    fn store(&self) -> &PgStore {
        self.harness.store()
    }

    fn database_args(&self) -> Vec<String> {
        let schema = self.store().schema().to_string();
        vec!["--database-url".into(), support::pg::database_url(), "--schema".into(), schema]
    }

    fn spawn(&mut self, name: &str, args: &[&str]) {
        self.spawn_with_env(name, args, &[]);
    }

    /// [`Cluster::spawn`] with these variables added to the process's environment.
    fn spawn_with_env(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) {
        let log = std::fs::File::create(self.processes.logs.join(format!("{name}.log"))).unwrap();
        let child = clean_command(BIN)
            .args(args)
            .args(self.database_args())
            .envs(env.iter().copied())
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.processes.children.insert(name.to_string(), child);
    }

    fn start_replica(&mut self, name: &str) {
        self.start_replica_with(name, &[]);
    }

    fn start_replica_with(&mut self, name: &str, extra: &[&str]) {
        let replica = self.replica_name(name);
        let mut args = vec!["serve", "--replica", &replica];
        args.extend(REPLICA_FLAGS);
        args.extend(extra);
        self.spawn(name, &args);
    }

    fn start_agent(&mut self, name: &str, slots: u32, extra: &[&str]) {
        self.start_agent_with_env(name, slots, extra, &[]);
    }

    /// An agent whose work dir is `nodes/{name}`, with these variables added to its environment.
    fn start_agent_with_env(&mut self, name: &str, slots: u32, extra: &[&str], env: &[(&str, &str)]) {
        let work_dir = self.dir.0.join("nodes").join(name);
        let (work_dir, slots) = (work_dir.to_str().unwrap().to_string(), slots.to_string());
        let mut args = vec!["agent", "--node", name, "--slots", &slots, "--work-dir", &work_dir];
        args.extend(extra);
        self.spawn_with_env(name, &args, env);
    }

    /// The sandbox of `job` on `node`.
    fn sandbox(&self, node: &str, job: &lockstep::gang::model::JobId) -> PathBuf {
        self.dir.0.join("nodes").join(node).join(job.to_string())
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.processes.logs.join(format!("{name}.log"))).unwrap()
    }

    /// The `--replica` name of replica `name`: scoped to this run's schema, so that the guards below never look
    /// at another test run's sessions.
    fn replica_name(&self, name: &str) -> String {
        format!("{name}@{}", self.store().schema())
    }

    /// PostgreSQL's `application_name` of the sessions of replica `name`, as `serve` names them.
    fn session_name(&self, name: &str) -> String {
        format!("lockstep serve {}", self.replica_name(name))
    }

    /// The server pids of the PostgreSQL sessions of process `name` now (`pg_stat_activity`, by the
    /// `application_name` its `serve` gives them). Panics when there is none: a guard that waits on the sessions
    /// of `name` would otherwise wait for nothing and pass (a process of the cluster always holds one, its hint
    /// listener's).
    async fn sessions(&self, name: &str) -> Vec<i32> {
        let application = self.session_name(name);
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
        )
        .bind(&application)
        .fetch_all(&mut self.monitor().await)
        .await
        .unwrap();
        assert!(!pids.is_empty(), "no PostgreSQL session is named {application:?}: the guard would wait for nothing");
        pids
    }

    /// A session of the test's own (not the harness store's), for reading `pg_stat_activity`.
    async fn monitor(&self) -> sqlx::PgConnection {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&support::pg::database_url()).await.unwrap()
    }

    /// Waits until no session of replica `name` is running a statement (`pg_stat_activity`, state `active`): a
    /// statement it sent before it froze has committed or failed by then (a transaction it left open, `idle in
    /// transaction`, never commits: its holder is frozen, then killed). Bounded: panics after 30 s, and at once
    /// when `name` has no session ([`Cluster::sessions`]).
    async fn wait_until_idle(&self, name: &str) {
        let pids = self.sessions(name).await;
        let query = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND state = 'active'";
        self.wait_for_none(&pids, query, &format!("{name} still runs a statement after 30 s frozen")).await;
    }

    /// Waits until none of the sessions `pids` (those [`Cluster::sessions`] found before the process's end) is left
    /// in PostgreSQL: a backend ends once it finds its client gone, after running any statement that was already in
    /// its socket. Bounded: panics after 30 s.
    async fn wait_until_gone(&self, name: &str, pids: &[i32]) {
        let query = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)";
        self.wait_for_none(pids, query, &format!("{name} has sessions 30 s after its end")).await;
    }

    /// Waits until `query` (a count over the sessions `$1`, a non-empty set of pids) finds none; panics with
    /// `stuck` after 30 s.
    async fn wait_for_none(&self, pids: &[i32], query: &'static str, stuck: &str) {
        assert!(!pids.is_empty(), "a wait on no session would wait for nothing");
        let mut monitor = self.monitor().await;
        let started = Instant::now();
        loop {
            let sessions: i64 = sqlx::query_scalar(query).bind(pids).fetch_one(&mut monitor).await.unwrap();
            if sessions == 0 {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{stuck}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn child(&mut self, name: &str) -> &mut Child {
        self.processes.children.get_mut(name).unwrap_or_else(|| panic!("no process {name}"))
    }

    /// Runs a client command to its end.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        clean_command(BIN).args(args).args(self.database_args()).env("RUST_LOG", "warn").output().unwrap()
    }

    /// Writes `text` to `name` in the temp dir and submits it; returns the printed operation id.
    fn submit(&self, name: &str, text: &str) -> RowId {
        let path = self.dir.0.join(name);
        std::fs::write(&path, text).unwrap();
        let output = self.cli(&["submit", path.to_str().unwrap()]);
        assert!(output.status.success(), "submit: {}", String::from_utf8_lossy(&output.stderr));
        RowId(String::from_utf8(output.stdout).unwrap().trim().parse().expect("submit prints the operation id"))
    }

    /// `lockstep status OP --json`.
    fn status_json(&self, op: RowId) -> StatusReport {
        let output = self.cli(&["status", &op.to_string(), "--json"]);
        assert!(output.status.success(), "status: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).expect("status --json is a StatusReport")
    }

    async fn view(&self, op: RowId) -> OperationView {
        api::status(self.store(), op).await.unwrap()
    }

    async fn wait_for(&self, op: RowId, limit: Duration, what: &str, done: impl Fn(&OperationView) -> bool) {
        let started = Instant::now();
        loop {
            let view = self.view(op).await;
            if done(&view) {
                return;
            }
            assert!(started.elapsed() < limit, "operation {op}: not {what} after {limit:?}: {:?}", view.status);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Freezes replica `name` (SIGSTOP) and waits until none of its sessions runs a statement; returns the
    /// database's clock then. A freeze alone does not stop its writes: a statement it sent just before (its fetch of
    /// an operation) still runs and may lease a row, and a test that took that lease for another replica's waited
    /// for the wrong process (a loaded run saw "taken over" a lease the frozen replica had taken itself).
    async fn freeze(&mut self, name: &str) -> Frozen {
        signal(self.child(name), libc::SIGSTOP);
        self.wait_until_idle(name).await;
        let since: String =
            sqlx::query_scalar("SELECT clock_timestamp()::text").fetch_one(&mut self.monitor().await).await.unwrap();
        Frozen { name: name.to_string(), since }
    }

    /// Whether the frozen replica has started no statement since it was seen idle ([`Cluster::freeze`]): then
    /// every write committed after that is another process's. Panics if it has no session.
    async fn quiet_since_frozen(&self, frozen: &Frozen) -> bool {
        self.sessions(&frozen.name).await;
        let busy: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 \
             AND (state = 'active' OR query_start >= $2::timestamptz)",
        )
        .bind(self.session_name(&frozen.name))
        .bind(&frozen.since)
        .fetch_one(&mut self.monitor().await)
        .await
        .unwrap();
        busy == 0
    }

    /// Waits until replica `name` is seen holding `op`'s lease in the middle of a pass, and leaves it frozen
    /// (SIGSTOP) there: a live lease on the row is frozen with its holder, then read again once the holder's
    /// sessions are idle; if the holder applied before it froze, it is let go on (SIGCONT) to the next pass. The
    /// other replica is `frozen`: a lease is `name`'s only if it was taken after the frozen replica's last
    /// statement, so the wait starts once no lease is live, and a lease caught while the frozen replica ran a
    /// statement it had sent before it froze is waited out too. Returns the lease's token and expiry.
    async fn catch_lease_holder(&mut self, op: RowId, name: &str, frozen: &mut Frozen) -> (LockToken, Timestamp) {
        let started = Instant::now();
        let live = |row: &lockstep::store::Row, now: Timestamp| {
            row.lock_token.zip(row.lock_expires_at).filter(|(_, expires)| *expires > now)
        };
        'caught: loop {
            loop {
                let now = self.store().now().await.unwrap();
                if live(&self.store().get(op).await.unwrap().unwrap(), now).is_none() {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(30), "operation {op} stays leased");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            loop {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{name} never seen holding operation {op}'s lease"
                );
                let row = self.store().get(op).await.unwrap().unwrap();
                let now = self.store().now().await.unwrap();
                let Some((token, expires)) = live(&row, now) else { continue };
                signal(self.child(name), libc::SIGSTOP);
                // A statement the holder sent before it froze may still commit: wait until it has.
                self.wait_until_idle(name).await;
                if !self.quiet_since_frozen(frozen).await {
                    // The frozen replica ran a statement it had sent before it froze: the lease may be its own.
                    // It is idle again (it is frozen); wait this lease out too.
                    eprintln!("{} ran a statement after it froze; waiting out lease {token}", frozen.name);
                    signal(self.child(name), libc::SIGCONT);
                    let name = frozen.name.clone();
                    self.wait_until_idle(&name).await;
                    *frozen = self.freeze(&name).await;
                    continue 'caught;
                }
                if self.store().get(op).await.unwrap().unwrap().lock_token == Some(token) {
                    return (token, expires);
                }
                signal(self.child(name), libc::SIGCONT);
            }
        }
    }

    /// The node name of each allocation row.
    async fn allocation_nodes(&self) -> BTreeMap<RowId, String> {
        let rows = self.store().list(KIND_ALLOCATION, None).await.unwrap();
        rows.iter().map(|row| Allocation::from_row(row).unwrap()).map(|a| (a.row, a.data.node_name.clone())).collect()
    }
}

/// A replica frozen by [`Cluster::freeze`]: its name, and the database's clock (text) when it was seen idle.
struct Frozen {
    name: String,
    since: String,
}

/// One line of a rank file: what a job saw when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Start {
    incarnation: String,
    cookie: u32,
    rank: u32,
    pid: i32,
}

/// A gang of the seed's example whose jobs record their starts under `out` and wait for `out/go`.
struct Gang {
    out: PathBuf,
}

impl Gang {
    fn new(cluster: &Cluster, name: &str) -> Gang {
        let out = cluster.dir.0.join(name);
        std::fs::create_dir_all(&out).unwrap();
        Gang { out }
    }

    /// The seed's gang example with this gang's command in place of its own.
    fn spec(&self) -> String {
        let out = self.out.display();
        let command = format!(
            "echo $YT_OPERATION_INCARNATION $YT_JOB_COOKIE $YT_GANG_RANK $$ >> {out}/rank-$YT_GANG_RANK; \
             while [ ! -e {out}/go ]; do sleep 0.05; done"
        );
        assert!(SEED_GANG.contains(SEED_GANG_COMMAND));
        SEED_GANG.replace(SEED_GANG_COMMAND, &command)
    }

    fn starts(&self, rank: u32) -> Vec<Start> {
        let text = std::fs::read_to_string(self.out.join(format!("rank-{rank}"))).unwrap_or_default();
        text.lines()
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(fields.len(), 4, "rank file line {line:?}");
                Start {
                    incarnation: fields[0].into(),
                    cookie: fields[1].parse().unwrap(),
                    rank: fields[2].parse().unwrap(),
                    pid: fields[3].parse().unwrap(),
                }
            })
            .collect()
    }

    /// Waits until every rank 0..3 recorded `count` starts.
    async fn wait_for_starts(&self, count: usize, limit: Duration) -> Vec<Vec<Start>> {
        let started = Instant::now();
        loop {
            let starts: Vec<Vec<Start>> = (0..3).map(|rank| self.starts(rank)).collect();
            if starts.iter().all(|s| s.len() >= count) {
                return starts;
            }
            assert!(started.elapsed() < limit, "not {count} starts per rank after {limit:?}: {starts:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn release(&self) {
        std::fs::write(self.out.join("go"), "").unwrap();
    }
}

/// Every rank recorded exactly the starts of `incarnations`, in order, each with its own rank as job cookie (the
/// cookie and rank a job of a new incarnation keeps).
fn assert_starts(starts: &[Vec<Start>], incarnations: &[&str]) {
    for (rank, starts) in starts.iter().enumerate() {
        let seen: Vec<&str> = starts.iter().map(|s| s.incarnation.as_str()).collect();
        assert_eq!(seen, incarnations, "rank {rank}: incarnations of its starts");
        for start in starts {
            assert_eq!(start.rank as usize, rank, "rank file {rank}: {start:?}");
            assert_eq!(start.cookie as usize, rank, "rank {rank} keeps job cookie {rank}: {start:?}");
        }
    }
}

/// The trigger of the operation's one gang restart (its `incarnation_started` event of index 1): job, task,
/// job_cookie, gang_rank, status, reason.
fn restart_trigger(view: &OperationView) -> serde_json::Value {
    let events = view.incarnation_events();
    assert_eq!(events.len(), 2, "one gang restart: {events:?}");
    events[1].data["trigger"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_gang_survives_a_killed_job_a_killed_replica_and_a_killed_agent() {
    let mut cluster = Cluster::new("gang").await;
    cluster.start_replica("replica-a");
    cluster.start_replica("replica-b");
    for node in ["node-1", "node-2", "node-3"] {
        cluster.start_agent(node, 2, AGENT_FLAGS);
    }

    // 1. A job's process is killed: one gang restart, every rank starts again in the new incarnation with its
    //    cookie and rank, and the operation completes.
    let gang = Gang::new(&cluster, "job-kill");
    let op = cluster.submit("job-kill.yson", &gang.spec());
    let first = gang.wait_for_starts(1, Duration::from_secs(30)).await;
    let i0 = format!("{op}-i0");
    assert_starts(&first, &[&i0]);
    let victim = first[1][0].pid;
    // SAFETY: killpg sends SIGKILL to the job's process group (the shell and its sleep).
    assert_eq!(unsafe { libc::killpg(victim, libc::SIGKILL) }, 0);
    let starts = gang.wait_for_starts(2, Duration::from_secs(30)).await;
    let i1 = format!("{op}-i1");
    assert_starts(&starts, &[&i0, &i1]);
    gang.release();
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.incarnation_events().len(), 2, "one gang restart");
    let killed: Vec<_> = view.jobs.iter().filter(|j| j.status == JobStatus::Failed).collect();
    assert_eq!(killed.len(), 1, "the killed job failed");
    assert_eq!((killed[0].data.gang_rank, killed[0].data.exit_code), (Some(1), Some(128 + libc::SIGKILL)));
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    assert_starts(&(0..3).map(|rank| gang.starts(rank)).collect::<Vec<_>>(), &[&i0, &i1]);
    let report = cluster.status_json(op);
    assert_eq!((report.state, report.incarnation.as_str(), report.gang_restarts), (view.status, i1.as_str(), 1));
    let ranks: Vec<(Option<u32>, u32)> = report.tasks[0].jobs.iter().map(|j| (j.gang_rank, j.job_cookie)).collect();
    assert_eq!(ranks, vec![(Some(0), 0), (Some(1), 1), (Some(2), 2)]);

    // 2. A replica is killed with SIGKILL in the middle of a pass over the running operation, holding its lease:
    //    the other replica takes the operation over once the lease expires (no earlier: the lease is exclusive;
    //    no later than the lease time plus its fetcher's longest empty-fetch backoff, 5 s × 1.2), restarts no
    //    gang (a revival, when replica-a had locked the jobs, finds every rank alive), and completes it. To catch
    //    replica-a holding the lease, replica-b is frozen meanwhile (SIGSTOP; a lease is caught only if it was taken
    //    after replica-b's last statement, so it cannot be one replica-b's last fetch took), and replica-a is frozen
    //    first and killed only once the frozen process is seen to still hold the lease.
    let gang = Gang::new(&cluster, "replica-kill");
    let op = cluster.submit("replica-kill.yson", &gang.spec());
    gang.wait_for_starts(1, Duration::from_secs(30)).await;
    let mut frozen = cluster.freeze("replica-b").await;
    let (token, expires) = cluster.catch_lease_holder(op, "replica-a", &mut frozen).await;
    let sessions = cluster.sessions("replica-a").await;
    signal(cluster.child("replica-a"), libc::SIGKILL);
    let killed_at = Instant::now();
    exit_within(cluster.child("replica-a"), Duration::from_secs(5)).await;
    // A statement replica-a wrote just before it froze may still sit unread in its backend's socket, which
    // `catch_lease_holder` cannot see (the backend shows idle): the backend runs it before it ends. replica-b is
    // still frozen, so a change of the lease now is replica-a's own last write (CI's loaded run saw its apply
    // release the operation 52 ms after the kill), not a takeover.
    cluster.wait_until_gone("replica-a", &sessions).await;
    let released = cluster.store().get(op).await.unwrap().unwrap().lock_token != Some(token);
    let now = cluster.store().now().await.unwrap();
    let lease_left = Duration::from_micros(u64::try_from(expires.as_micros() - now.as_micros()).unwrap_or(0));
    signal(cluster.child("replica-b"), libc::SIGCONT);
    let backoff_max = *lockstep::pipeline::config::FETCH_BACKOFF_DEFAULT.last().unwrap();
    let bound = REPLICA_LEASE_TTL + backoff_max.mul_f64(1.2) + Duration::from_secs(2);
    loop {
        let row = cluster.store().get(op).await.unwrap().unwrap();
        if row.lock_token != Some(token) {
            break;
        }
        assert!(killed_at.elapsed() < bound, "replica-b did not take operation {op} over within {bound:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took_over = killed_at.elapsed();
    eprintln!(
        "replica kill: replica-a died holding lease {token} ({lease_left:?} left); taken over after {took_over:?}"
    );
    if released {
        eprintln!("replica kill: replica-a's last write, sent before it froze, released the lease after its kill");
    } else {
        assert!(took_over + Duration::from_millis(200) >= lease_left, "taken over before the lease expired");
    }
    gang.release();
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.incarnation_events().len(), 1, "revival found every rank alive: no gang restart");
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    assert_starts(&(0..3).map(|rank| gang.starts(rank)).collect::<Vec<_>>(), &[&format!("{op}-i0")]);

    // 3. An agent is killed with SIGKILL: its job processes die with it, its jobs are declared lost once its node
    //    lease expires, and the gang restarts with every rank placed on the other nodes.
    let gang = Gang::new(&cluster, "agent-kill");
    let op = cluster.submit("agent-kill.yson", &gang.spec());
    let first = gang.wait_for_starts(1, Duration::from_secs(30)).await;
    let i0 = format!("{op}-i0");
    let nodes = cluster.allocation_nodes().await;
    let view = cluster.view(op).await;
    let node_of = |job: &lockstep::gang::model::Job| nodes[&job.data.allocation.unwrap().row].clone();
    let victim = node_of(view.current_jobs().find(|j| j.data.gang_rank == Some(0)).unwrap());
    let lost: BTreeSet<u32> =
        view.current_jobs().filter(|j| node_of(j) == victim).filter_map(|j| j.data.gang_rank).collect();
    signal(cluster.child(&victim), libc::SIGKILL);
    let killed_at = Instant::now();
    exit_within(cluster.child(&victim), Duration::from_secs(5)).await;
    for rank in &lost {
        let pid = first[*rank as usize][0].pid;
        let started = Instant::now();
        while !process_gone(pid) {
            assert!(started.elapsed() < Duration::from_secs(5), "job process {pid} outlived its killed agent");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let starts = gang.wait_for_starts(2, AGENT_LEASE_TTL + Duration::from_secs(20)).await;
    eprintln!("agent kill: gang restarted {:?} after the kill of {victim}", killed_at.elapsed());
    let i1 = format!("{op}-i1");
    assert_starts(&starts, &[&i0, &i1]);
    let view = cluster.view(op).await;
    // The first lost job found triggers the restart ("node lost"); the restart aborts the rest.
    let trigger = restart_trigger(&view);
    assert_eq!(trigger["reason"], "node lost", "{trigger}");
    assert!(lost.contains(&(trigger["gang_rank"].as_u64().unwrap() as u32)), "{trigger}");
    for job in view.jobs.iter().filter(|j| j.data.incarnation == 0 && node_of(j) == victim) {
        assert_eq!(job.status, JobStatus::Aborted, "job {} on {victim}", job.data.id);
    }
    for job in view.current_jobs() {
        assert_ne!(node_of(job), victim, "job {} of the new incarnation placed on the dead node", job.data.id);
    }
    gang.release();
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.incarnation_events().len(), 2, "one gang restart");
    assert_eq!(audit::operation(&view), Vec::<String>::new());
}

/// The agent runs with the variables a controller host has (DATABASE_URL with its password, LOCKSTEP_SCHEMA, and
/// any other): its job sees none of them, only the allow-list, the spec's `environment`, the `YT_*` variables and
/// its marker, and its sandbox is its user's only. Then a job whose processes take every shape (background
/// children, a pipeline, an orphaned grandchild, one that left the job's session) loses its agent to SIGKILL: the
/// kernel kills only its shell, and the agent started again on the same work dir ends the rest before it does
/// anything else; a second agent on that work dir is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sees_only_its_environment_and_its_processes_end_when_its_killed_agent_restarts() {
    let mut cluster = Cluster::new("isolation").await;
    cluster.start_replica("replica-a");
    let schema = cluster.store().schema().to_string();
    let secret_url = "postgres://lockstep:s3cret@db.example:5432/prod";
    let agent_env = [("DATABASE_URL", secret_url), ("LOCKSTEP_SCHEMA", schema.as_str()), ("E2E_UNRELATED", "x")];
    cluster.start_agent_with_env("node-1", 1, AGENT_FLAGS, &agent_env);

    let spec = r#"{"tasks": {"t": {"job_count": 1, "command": "env", "environment": {"GREETING": "hi"}}}}"#;
    let op = cluster.submit("env.json", spec);
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    let sandbox = cluster.sandbox("node-1", &view.jobs[0].data.id);
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    let seen: BTreeMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('=')).collect();
    // The real-mode page's allow-list, the spec's variable, the marker, and what `sh` sets itself.
    let allowed = ["PATH", "HOME", "LANG", "TZ", "USER", "GREETING", "LOCKSTEP_JOB", "PWD", "SHLVL", "_"];
    for name in seen.keys() {
        assert!(allowed.contains(name) || name.starts_with("YT_"), "the job saw {name}:\n{stdout}");
    }
    assert!(!stdout.contains("s3cret") && !stdout.contains(&schema), "{stdout}");
    assert_eq!((seen["GREETING"], seen["YT_JOB_COOKIE"]), ("hi", "0"), "{stdout}");
    let mode = |path: PathBuf| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(sandbox.clone()), 0o700);
    assert_eq!((mode(sandbox.join("stdout")), mode(sandbox.join("stderr"))), (0o600, 0o600));

    let markers: Vec<String> = (0..6).map(|n| format!("2000.{}{n}", std::process::id())).collect();
    let _reaper = Reaper(markers.clone());
    let m = &markers;
    let command = format!(
        "sleep {} & sleep {} | sleep {} & (sleep {} &) ; setsid sleep {} & env -i /bin/sleep {} & wait",
        m[0], m[1], m[2], m[3], m[4], m[5]
    );
    let spec = serde_json::json!({"tasks": {"t": {"job_count": 1, "command": command}}}).to_string();
    cluster.submit("tree.json", &spec);
    let started = Instant::now();
    while !markers.iter().all(|m| !alive_with(m).is_empty()) {
        assert!(started.elapsed() < Duration::from_secs(30), "the job's processes never all ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(cluster.child("node-1"), libc::SIGKILL);
    exit_within(cluster.child("node-1"), Duration::from_secs(5)).await;
    // The agent's death kills the shell alone: what it started runs on, until the next agent.
    assert!(markers.iter().all(|m| !alive_with(m).is_empty()), "the shell's children outlive their agent");
    cluster.start_agent("node-1", 1, AGENT_FLAGS);
    let restarted = Instant::now();
    while markers.iter().any(|m| !alive_with(m).is_empty()) {
        let alive: Vec<_> = markers.iter().filter(|m| !alive_with(m).is_empty()).collect();
        assert!(restarted.elapsed() < Duration::from_secs(10), "still alive after the agent's restart: {alive:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("agent restart: the killed agent's job processes ended {:?} after the restart", restarted.elapsed());
    let log = cluster.log("node-1");
    assert!(log.contains("ended the processes of jobs an earlier agent left running"), "{log}");

    // One agent per work dir: a second one on the same work dir is refused (exit 2), not let loose on the first
    // one's jobs.
    let work_dir = cluster.dir.0.join("nodes").join("node-1");
    let args = ["agent", "--node", "node-1-twin", "--slots", "1", "--work-dir", work_dir.to_str().unwrap()];
    cluster.spawn("node-1-twin", &args);
    let status = exit_within(cluster.child("node-1-twin"), Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{}", cluster.log("node-1-twin"));
    assert!(cluster.log("node-1-twin").contains("in use by another agent"), "{}", cluster.log("node-1-twin"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_master_slave_example_completes_on_three_agents() {
    let mut cluster = Cluster::new("master-slave").await;
    let files = cluster.dir.0.join("cypress");
    std::fs::create_dir_all(files.join("tmp")).unwrap();
    for file in ["run_master.py", "run_slave.py", "duties_180124.dat"] {
        std::fs::write(files.join("tmp").join(file), "x\n").unwrap();
    }
    cluster.start_replica("replica-a");
    cluster.start_replica("replica-b");
    let files_root = files.to_str().unwrap().to_string();
    for node in ["node-1", "node-2", "node-3"] {
        let mut flags = AGENT_FLAGS.to_vec();
        flags.extend(["--files-root", &files_root]);
        cluster.start_agent(node, 4, &flags);
    }
    // The seed's spec with short shell commands that need the files their sandboxes must hold.
    let spec = include_str!("../scenarios/specs/seed-master-slave.yson")
        .replace("python run_master.py < duties.dat", "test -f run_master.py && cat duties.dat")
        .replace("python run_slave.py", "test -f run_slave.py");
    let started = Instant::now();
    let op = cluster.submit("master-slave.yson", &spec);
    cluster.wait_for(op, Duration::from_secs(90), "ended", |v| v.status.is_terminal()).await;
    eprintln!("master/slave: 101 jobs on 3 agents × 4 slots in {:?}", started.elapsed());
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.jobs.iter().filter(|j| j.status == JobStatus::Completed).count(), 101);
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    let nodes = cluster.allocation_nodes().await;
    let used: BTreeSet<&String> = view.jobs.iter().filter_map(|j| j.data.allocation).map(|a| &nodes[&a.row]).collect();
    assert_eq!(used.len(), 3, "jobs ran on every agent: {used:?}");
    let master = view.jobs.iter().find(|j| j.data.task == "master").unwrap();
    let sandbox = cluster.dir.0.join("nodes").join(&nodes[&master.data.allocation.unwrap().row]);
    let stdout = std::fs::read_to_string(sandbox.join(master.data.id.to_string()).join("stdout")).unwrap();
    assert_eq!(stdout, "x\n", "the master read duties.dat, copied under its file_name");
}

/// Issue 14: in a gang operation every task is a gang task for ranks and sizes. Task `a` (job_count 3, size 2) and
/// task `b` (job_count 2, no gang_options): every job sees `YT_GANG_SIZE=4`, `b`'s jobs have ranks 0 and 1 and
/// `YT_TASK_GANG_SIZE=2`. Each job appends what it saw to a file and exits 42 when a variable is wrong (the
/// YTsaurus tests' way); `max_failed_job_count = 1` fails the operation at the first such job. The replica places
/// gang operations all-or-nothing by default (`serve --gang-placement`), which `status` shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_without_gang_options_of_a_gang_operation_has_ranks_and_sizes_in_real_jobs() {
    let mut cluster = Cluster::new("gang-env").await;
    cluster.start_replica_with("replica-a", &["--gang-placement", "all_or_nothing"]);
    cluster.start_agent("node-1", 5, AGENT_FLAGS);
    let out = cluster.dir.0.join("env");
    std::fs::create_dir_all(&out).unwrap();
    let line = format!(
        "echo $YT_TASK_NAME $YT_JOB_COOKIE ${{YT_GANG_RANK-none}} $YT_GANG_SIZE ${{YT_TASK_GANG_SIZE-none}} >> {}/seen",
        out.display()
    );
    let a = format!("{line}; [ \"$YT_GANG_SIZE\" = 4 ] || exit 42");
    let b = format!(
        "{line}; [ \"$YT_GANG_SIZE\" = 4 ] && [ \"$YT_TASK_GANG_SIZE\" = 2 ] && [ -n \"$YT_GANG_RANK\" ] || exit 42"
    );
    let spec = serde_json::json!({
        "tasks": {
            "a": {"job_count": 3, "command": a, "gang_options": {"size": 2}},
            "b": {"job_count": 2, "command": b},
        },
        "max_failed_job_count": 1,
    });
    let op = cluster.submit("gang-env.json", &spec.to_string());
    cluster.wait_for(op, Duration::from_secs(60), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    let seen = std::fs::read_to_string(out.join("seen")).unwrap();
    let mut lines: Vec<&str> = seen.lines().collect();
    lines.sort();
    lines.dedup();
    for expected in ["a 0 0 4 2", "a 1 1 4 2", "b 0 0 4 2", "b 1 1 4 2"] {
        assert!(lines.contains(&expected), "no job saw {expected:?}: {lines:?}");
    }
    assert!(lines.iter().all(|l| !l.starts_with("b ") || !l.contains("none")), "{lines:?}");
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    let status = cluster.status_json(op);
    assert_eq!(status.placement, Some(lockstep::gang::GangPlacement::AllOrNothing));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_an_agent_gracefully_and_drains_a_replica() {
    let mut cluster = Cluster::new("sigterm").await;
    cluster.start_replica("replica-a");
    cluster.start_replica("replica-b");
    // A long node lease: without the graceful stop, the controller would wait about 30 s to see the node gone.
    let long_lease = ["--lease-ttl", "30s", "--lease-margin", "2s", "--poll-interval", "200ms"];
    cluster.start_agent("node-1", 3, &long_lease);
    cluster.start_agent("node-2", 3, &long_lease);
    let gang = Gang::new(&cluster, "sigterm");
    let op = cluster.submit("sigterm.yson", &gang.spec());
    let first = gang.wait_for_starts(1, Duration::from_secs(30)).await;
    let nodes = cluster.allocation_nodes().await;
    let view = cluster.view(op).await;
    let node_of = |job: &lockstep::gang::model::Job| nodes[&job.data.allocation.unwrap().row].clone();
    let stopped = node_of(view.current_jobs().find(|j| j.data.gang_rank == Some(0)).unwrap());
    let interrupted: BTreeSet<u32> =
        view.current_jobs().filter(|j| node_of(j) == stopped).filter_map(|j| j.data.gang_rank).collect();

    signal(cluster.child(&stopped), libc::SIGTERM);
    let stopped_at = Instant::now();
    let status = exit_within(cluster.child(&stopped), Duration::from_secs(10)).await;
    assert!(status.success(), "agent {stopped} exit: {status}");
    let log = cluster.log(&stopped);
    let expected = format!("interrupted={}", interrupted.len());
    assert!(log.contains("agent stopped") && log.contains(&expected), "{stopped} log:\n{log}");
    assert!(log.contains("lease_released=true"), "{stopped} log:\n{log}");
    for rank in &interrupted {
        assert!(process_gone(first[*rank as usize][0].pid), "rank {rank}'s process outlived its stopped agent");
    }
    let node = cluster.store().list(KIND_NODE, None).await.unwrap().into_iter().find(|r| r.status == stopped).unwrap();
    assert_eq!(node.lock_token, None, "{stopped} gave its node lease back");

    let starts = gang.wait_for_starts(2, Duration::from_secs(10)).await;
    let restarted = stopped_at.elapsed();
    eprintln!("agent SIGTERM: gang restarted {restarted:?} after the signal (node lease 30 s)");
    assert!(restarted < Duration::from_secs(10), "the restart waited for the lease: {restarted:?}");
    assert_starts(&starts, &[&format!("{op}-i0"), &format!("{op}-i1")]);
    let view = cluster.view(op).await;
    // Read again: an agent that came up after the first read (a loaded machine) has allocations the first lacks.
    let nodes = cluster.allocation_nodes().await;
    let node_of = |job: &lockstep::gang::model::Job| nodes[&job.data.allocation.unwrap().row].clone();
    // The first report consumed triggers the restart and the restart aborts the rest ("incarnation changed"). A
    // pass whose reads straddle the agent's report-and-release sees the node gone first ("node lost").
    let trigger = restart_trigger(&view);
    let reasons = ["interrupted: node stopping", "node lost"];
    assert!(reasons.iter().any(|reason| trigger["reason"] == *reason), "{trigger}");
    eprintln!("agent SIGTERM: restart trigger {}", trigger["reason"]);
    assert!(interrupted.contains(&(trigger["gang_rank"].as_u64().unwrap() as u32)), "{trigger}");
    for job in view.jobs.iter().filter(|j| j.data.incarnation == 0 && node_of(j) == stopped) {
        assert_eq!(job.status, JobStatus::Aborted, "job {}", job.data.id);
    }
    for job in view.current_jobs() {
        assert_ne!(node_of(job), stopped, "job {} placed on the stopped node", job.data.id);
    }
    gang.release();
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    assert_eq!(cluster.view(op).await.status, OperationStatus::Completed);

    // A replica that gets SIGTERM in the middle of a pass (holding the operation's lease) finishes the pass or
    // gives the lease back before it exits 0: the lease is gone at once, not when it expires (as after SIGKILL).
    let gang = Gang::new(&cluster, "sigterm-replica");
    let op = cluster.submit("sigterm-replica.yson", &gang.spec());
    gang.wait_for_starts(1, Duration::from_secs(30)).await;
    let mut frozen = cluster.freeze("replica-b").await;
    let (token, expires) = cluster.catch_lease_holder(op, "replica-a", &mut frozen).await;
    signal(cluster.child("replica-a"), libc::SIGTERM);
    signal(cluster.child("replica-a"), libc::SIGCONT);
    let stopped_at = Instant::now();
    let status = exit_within(cluster.child("replica-a"), Duration::from_secs(10)).await;
    assert!(status.success(), "replica exit: {status}");
    let row = cluster.store().get(op).await.unwrap().unwrap();
    let now = cluster.store().now().await.unwrap();
    let lease_left = Duration::from_micros(u64::try_from(expires.as_micros() - now.as_micros()).unwrap_or(0));
    assert_ne!(row.lock_token, Some(token), "replica-a exited still holding the lease ({lease_left:?} left)");
    eprintln!("replica SIGTERM: drained and exited in {:?}; its lease had {lease_left:?} left", stopped_at.elapsed());
    let log = cluster.log("replica-a");
    assert!(log.contains("replica drained"), "replica log:\n{log}");
    signal(cluster.child("replica-b"), libc::SIGCONT);
    gang.release();
    cluster.wait_for(op, Duration::from_secs(30), "ended", |v| v.status.is_terminal()).await;
    let view = cluster.view(op).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.incarnation_events().len(), 1, "no gang restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_follows_an_operation_to_its_end_and_exits_with_its_outcome() {
    let mut cluster = Cluster::new("submit-wait").await;
    cluster.start_replica("replica-a");
    cluster.start_agent("node-1", 3, AGENT_FLAGS);
    let spec = |command: &str| SEED_GANG.replace(SEED_GANG_COMMAND, command);
    std::fs::write(cluster.dir.0.join("ok.yson"), spec("true")).unwrap();
    std::fs::write(
        cluster.dir.0.join("fails.json"),
        r#"{"tasks": {"t": {"job_count": 1, "command": "exit 3"}}, "max_failed_job_count": 1}"#,
    )
    .unwrap();
    let ok = cluster.dir.0.join("ok.yson");
    let output = cluster.cli(&["submit", ok.to_str().unwrap(), "--wait", "--poll-interval", "100ms"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("completed"), "{stderr}");
    let op = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let table = cluster.cli(&["status", &op]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("state       completed"), "{table}");
    assert_eq!(table.matches(" completed  node-1 ").count(), 3, "three ranks completed on node-1:\n{table}");
    let fails = cluster.dir.0.join("fails.json");
    let output = cluster.cli(&["submit", fails.to_str().unwrap(), "--wait", "--poll-interval", "100ms"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed"), "{stderr}");
    let op = RowId(String::from_utf8(output.stdout).unwrap().trim().parse().unwrap());
    assert_eq!(cluster.view(op).await.status, OperationStatus::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_naming_the_field_and_client_commands_report_missing_operations() {
    let cluster = Cluster::new("bad-input").await;
    let bad = cluster.dir.0.join("bad.yson");
    std::fs::write(&bad, "{tasks={trainer={job_count=8;command=x;gang_options={size=9}}}}").unwrap();
    let output = cluster.cli(&["submit", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tasks.trainer.gang_options.size: 9 exceeds job_count 8"), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing submitted");
    let unknown = cluster.dir.0.join("spec.txt");
    std::fs::write(&unknown, "{}").unwrap();
    let output = cluster.cli(&["submit", unknown.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--format"));
    let output = cluster.cli(&["serve", "--lease-ttl", "4s"]);
    assert_eq!(output.status.code(), Some(2), "a lease too short for the default margin and heartbeat");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--lease-ttl 4s: too short for --lease-margin 2s and --heartbeat-interval 1s"), "{stderr}");
    assert!(!stderr.contains("heartbeat_trigger"), "serve has no such flag: {stderr}");
    for command in ["status", "abort"] {
        let output = cluster.cli(&[command, "999999999"]);
        assert_eq!(output.status.code(), Some(1), "{command}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("operation 999999999 not found"), "{command}");
    }
}

/// A second agent for a node whose agent is alive waits for the node lease, and says so once at the default log
/// level (a warning), not silently and not every pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_for_a_held_node_warns_once_that_it_waits() {
    let mut cluster = Cluster::new("second-agent").await;
    cluster.start_agent("node-1", 1, AGENT_FLAGS);
    let first = Instant::now();
    while !cluster.log("node-1").contains("node session started") {
        assert!(
            first.elapsed() < Duration::from_secs(20),
            "the first agent got no session:\n{}",
            cluster.log("node-1")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let work_dir = cluster.dir.0.join("nodes").join("node-1-second");
    let work_dir = work_dir.to_str().unwrap().to_string();
    let mut args = vec!["agent", "--node", "node-1", "--slots", "1", "--work-dir", &work_dir];
    args.extend(AGENT_FLAGS);
    cluster.spawn("node-1-second", &args);
    let warning = "node node-1 is held by another agent session; waiting for its lease";
    let started = Instant::now();
    while !cluster.log("node-1-second").contains(warning) {
        let log = cluster.log("node-1-second");
        assert!(started.elapsed() < Duration::from_secs(20), "no warning from the second agent:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several more passes (one every 200 ms) while the first agent keeps its lease: still one warning.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = cluster.log("node-1-second");
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    assert!(!log.contains("node session started"), "the second agent took a held lease:\n{log}");
}

/// The real-mode page (`docs/real-mode.md`): its spec file parses as the seed's gang example, and every `lockstep`
/// command it shows exists with the flags it uses (`--help` after them exits 0; clap refuses unknown flags
/// first).
#[test]
fn the_readme_real_mode_walkthrough_uses_commands_flags_and_a_spec_that_exist() {
    let section = include_str!("../docs/real-mode.md");
    assert!(section.contains("scenarios/specs/seed-gang.yson"), "the walk-through submits the seed's gang example");
    let spec = OperationSpec::parse(SEED_GANG, SpecFormat::Yson).expect("seed-gang.yson parses");
    assert_eq!(spec.tasks.keys().collect::<Vec<_>>(), ["worker"]);
    assert_eq!((spec.tasks["worker"].job_count, spec.gang_size()), (3, 3));
    assert_eq!(spec.tasks["worker"].command, SEED_GANG_COMMAND);

    let mut commands = BTreeSet::new();
    // A command continued on the next line (`\` at the end) is one command.
    let section = section.replace("\\\n", " ");
    for line in section.lines().map(str::trim) {
        // A command starts a line, or follows `$(` or `watch -n 1 `; `$op` stands for an operation id.
        let starts = ["$(lockstep ", "watch -n 1 lockstep "];
        let Some(rest) = line
            .strip_prefix("lockstep ")
            .or_else(|| starts.iter().find_map(|start| line.find(start).map(|at| &line[at + start.len()..])))
        else {
            continue;
        };
        let rest = rest.split('#').next().unwrap().trim().trim_end_matches(['&', ')']).trim();
        let args: Vec<&str> = rest.split_whitespace().map(|arg| if arg == "$op" { "1" } else { arg }).collect();
        let output = clean_command(BIN).args(&args).arg("--help").output().unwrap();
        assert!(output.status.success(), "`lockstep {rest} --help`: {}", String::from_utf8_lossy(&output.stderr));
        commands.insert(args[0].to_string());
    }
    for command in ["migrate", "serve", "agent", "submit", "status"] {
        assert!(commands.contains(command), "the walk-through runs `lockstep {command}`");
    }
    // The prose names `lockstep abort $op` inline.
    assert!(section.contains("`lockstep abort $op`"));
    let output = clean_command(BIN).args(["abort", "1", "--help"]).output().unwrap();
    assert!(output.status.success(), "abort 1 --help");
}

/// The real-mode page's way to find a job's `sleep 30` picks the processes whose working directory is under the
/// node's work dir, and no other `sleep 30` (a new user's trial killed the first PID `pgrep -f 'sleep 30'` gave,
/// another user's process). Run as the page shows it, with the page's work dir replaced by a test's own, while a
/// `sleep 30` runs in a sandbox under it and another outside it.
#[test]
fn the_real_mode_page_finds_a_jobs_sleep_by_its_sandbox_and_no_other() {
    let page = include_str!("../docs/real-mode.md");
    let start = page.find("for pid in $(pgrep -x sleep); do").expect("the page's snippet");
    let snippet = &page[start..start + page[start..].find("```").expect("the snippet's end")];
    let dir = std::env::temp_dir().join(format!("lockstep-pgrep-{}", std::process::id()));
    let sandbox = dir.join("node-1").join("7-0");
    let outside = dir.join("elsewhere");
    std::fs::create_dir_all(&sandbox).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let sleep = |cwd: &PathBuf| clean_command("sleep").arg("30").current_dir(cwd).spawn().unwrap();
    let (mut job, mut other) = (sleep(&sandbox), sleep(&outside));
    // `pgrep -x sleep` matches a child only once it has exec'd `sleep`.
    let exec_d =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "sleep");
    let started = Instant::now();
    while !(exec_d(job.id()) && exec_d(other.id())) {
        assert!(started.elapsed() < Duration::from_secs(30), "the sleeps never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let node_dir = format!("{}/", dir.join("node-1").display());
    assert!(snippet.contains("/tmp/lockstep/node-1/"), "{snippet}");
    let script = snippet.replace("/tmp/lockstep/node-1/", &node_dir);
    let output = clean_command("sh").arg("-c").arg(&script).output().unwrap();
    let (_, _) = (job.kill(), other.kill());
    let (_, _) = (job.wait(), other.wait());
    std::fs::remove_dir_all(&dir).unwrap();
    let found: Vec<u32> = String::from_utf8_lossy(&output.stdout).lines().map(|line| line.parse().unwrap()).collect();
    assert_eq!(found, vec![job.id()], "the snippet found {found:?}: job {}, other {}", job.id(), other.id());
}
