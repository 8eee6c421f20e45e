//! The jobs and the agent-side record of `lockstep chaos run`'s gang scenarios.
//!
//! - **Jobs** ([`ChaosExecutor`]): each agent runs its jobs through the real [`OsExecutor`] (sandbox, cleared
//!   environment, process tree ended with the job, records for the restart cleanup), with the job's command
//!   replaced by what the scenario's `[jobs]` rules say, drawn as the simulator draws it ([`JobScript::draw`]:
//!   the job's own ChaCha stream of the run's seed): `sleep` for the drawn duration and exit with the code, or
//!   hang until killed. Every job first writes its `YT_*` variables to `yt-env` in its sandbox. A job's start
//!   number (the rules' `attempt`) is counted across every agent of the run in one directory of the run
//!   (`attempts/`, one file created per start), since agents share no memory.
//! - **Record** ([`RecordLog`]): every process start and end, every fence and new node session of an agent, one
//!   JSON line each in `agent-N.records`, appended and flushed to disk (`fsync`) before the agent goes on, so
//!   the record survives the agent's SIGKILL. Times are microseconds since the Unix epoch on this machine's
//!   clock, which is PostgreSQL's clock too when the server runs on the same machine (as `chaos run` expects for
//!   its proxies). The harness adds the ends the dead agent could not write (its job shells die with it, Linux
//!   `PR_SET_PDEATHSIG`) and the pauses of an `agent-pause`, then turns the records into the simulator's process
//!   log ([`process_events`]) for the gang checkers.

use crate::agent::executor::process_pair;
use crate::agent::process::{OsExecutor, PreparedJob};
use crate::agent::{
    AgentPass, End, Executor, ExecutorError, ExitStatus, JobScript, ProcessEvent, ProcessEventKind, ProcessHandle,
    StartRequest,
};
use crate::gang::model::{AllocationRef, JobId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most starts of one (operation, task, job cookie) the attempt counter counts; past it a start fails (a runaway).
pub const ATTEMPTS_MAX: u32 = 100_000;

/// The name of the file, in a job's sandbox, that holds the `YT_*` variables the job saw (`NAME=value` lines).
pub const YT_ENV_FILE: &str = "yt-env";

/// Microseconds since the Unix epoch, this machine's clock.
pub fn wall_now_us() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// How a recorded process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordedEnd {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it that its agent did not send.
    Signaled(i32),
    /// Its agent killed it (the controller moved on, a fence, a stop).
    Killed,
    /// It died with its agent (SIGKILL of the agent: the kernel ends the job shell); written by the harness.
    DiedWithAgent,
}

/// One line of an agent's record. Every `at_us` is when the line was written: microseconds since the Unix epoch
/// on this machine's wall clock ([`wall_now_us`]), the clock the harness compares with PostgreSQL's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "kebab-case")]
pub enum AgentRecord {
    /// A job's process started.
    Start {
        /// When the process was spawned.
        at_us: i64,
        /// The agent's node name, from the start request.
        node: String,
        /// The allocation the job runs in, from the start request.
        allocation: AllocationRef,
        /// The job.
        job: JobId,
        /// Id of the job's operation incarnation (`YT_OPERATION_INCARNATION`), from the job's launch.
        incarnation: String,
        /// The job's task, from its launch.
        task: String,
        /// The job's cookie within its task (`YT_JOB_COOKIE`), from its launch.
        job_cookie: u32,
        /// The job's gang rank (`YT_GANG_RANK`) if its task is a gang with ranks, from its launch.
        gang_rank: Option<u32>,
        /// The job shell's pid (it leads the job's session).
        pid: Option<u32>,
        /// How long the rules drew the job to run, in milliseconds of wall time, already scaled by
        /// `--time-scale`.
        duration_ms: u64,
        /// How the rules drew it to end: `exit N`, or `hang` (it sleeps until killed).
        behaviour: String,
    },
    /// A job could not start (a `start_failure` rule, or the executor failed).
    StartFailed {
        /// When the start failed.
        at_us: i64,
        /// The agent's node name.
        node: String,
        /// The allocation the job was to run in.
        allocation: AllocationRef,
        /// The job.
        job: JobId,
        /// Why: the `start_failure` rule's message, or the executor's error.
        error: String,
    },
    /// A job's process ended.
    End {
        /// When the process was seen to end (by the agent, or by the harness after the agent died).
        at_us: i64,
        /// The job.
        job: JobId,
        /// How it ended.
        end: RecordedEnd,
    },
    /// The job's processes were frozen (`agent-pause`: SIGSTOP); written by the harness.
    Pause {
        /// When the harness sent SIGSTOP.
        at_us: i64,
        /// The job whose processes it froze.
        job: JobId,
    },
    /// They run again (SIGCONT); written by the harness.
    Resume {
        /// When the harness sent SIGCONT.
        at_us: i64,
        /// The job whose processes run again.
        job: JobId,
    },
    /// The agent fenced itself: it killed `killed` because its node lease ran out locally.
    Fence {
        /// When the pass that fenced ended.
        at_us: i64,
        /// Why the agent fenced, as its pass reports it ([`AgentPass::fenced`]).
        reason: String,
        /// The jobs whose processes the fence killed ([`AgentPass::fence_killed`]).
        killed: Vec<JobId>,
    },
    /// The agent took a new node lease (a session).
    Session {
        /// When the pass that took the lease ended.
        at_us: i64,
        /// The node lease's lock token (the session's fencing token, [`AgentPass::session`]).
        token: i64,
    },
}

impl AgentRecord {
    /// When it was written (µs since the Unix epoch).
    pub fn at_us(&self) -> i64 {
        match self {
            AgentRecord::Start { at_us, .. }
            | AgentRecord::StartFailed { at_us, .. }
            | AgentRecord::End { at_us, .. }
            | AgentRecord::Pause { at_us, .. }
            | AgentRecord::Resume { at_us, .. }
            | AgentRecord::Fence { at_us, .. }
            | AgentRecord::Session { at_us, .. } => *at_us,
        }
    }
}

/// An append-only record file: each [`RecordLog::append`] writes one JSON line and flushes it to disk before it
/// returns. Clones share the file.
#[derive(Clone, Debug)]
pub struct RecordLog {
    file: Arc<Mutex<File>>,
    path: PathBuf,
}

impl RecordLog {
    /// Opens `path` for appending, creating it if missing.
    ///
    /// Errors: the file cannot be opened.
    pub fn open(path: impl Into<PathBuf>) -> std::io::Result<RecordLog> {
        let path = path.into();
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(RecordLog { file: Arc::new(Mutex::new(file)), path })
    }

    /// Appends `record` and flushes it to disk (`fsync` of its data). A record that cannot be written is logged:
    /// the harness then misses it and its checkers say what they could not see.
    pub fn append(&self, record: &AgentRecord) {
        let mut line = serde_json::to_string(record).expect("an agent record serializes");
        line.push('\n');
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let written = (&*file).write_all(line.as_bytes()).and_then(|()| file.sync_data());
        if let Err(error) = written {
            tracing::error!(path = %self.path.display(), %error, "cannot write the chaos agent record");
        }
    }

    /// Every record of the file at `path`, in order; a torn last line (the writer died in the middle of it) is
    /// left out.
    ///
    /// Errors: the file cannot be read, or a line other than the last does not parse.
    pub fn read(path: &Path) -> Result<Vec<AgentRecord>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(format!("{}: {error}", path.display())),
        };
        let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
        let mut records = Vec::with_capacity(lines.len());
        for (index, line) in lines.iter().enumerate() {
            match serde_json::from_str(line) {
                Ok(record) => records.push(record),
                Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => {}
                Err(error) => return Err(format!("{} line {}: {error}", path.display(), index + 1)),
            }
        }
        Ok(records)
    }

    /// The observer of an agent's passes that records its fences and new sessions.
    pub fn pass_observer(&self) -> crate::agent::PassObserver {
        let log = self.clone();
        Arc::new(move |pass: &AgentPass| {
            if pass.leased
                && let Some(token) = pass.session
            {
                log.append(&AgentRecord::Session { at_us: wall_now_us(), token: token.0 });
            }
            if let Some(reason) = &pass.fenced {
                let killed = pass.fence_killed.clone();
                log.append(&AgentRecord::Fence { at_us: wall_now_us(), reason: reason.clone(), killed });
            }
        })
    }
}

/// The shell command of a job that runs `duration` and ends with `end` (never a start failure): it writes its
/// `YT_*` variables to [`YT_ENV_FILE`] in its sandbox first. A job that exits 0 or hangs `exec`s its `sleep`, so
/// its whole process tree is the one process its agent started.
pub fn job_command(duration: Duration, end: &End) -> String {
    let record = format!("env | grep '^YT_' | sort > {YT_ENV_FILE}; ");
    let secs = format!("{:.3}", duration.as_secs_f64());
    match end {
        End::Exit(0) => format!("{record}exec sleep {secs}"),
        End::Exit(code) => format!("{record}sleep {secs}; exit {code}"),
        End::Hang | End::StartFailure(_) => format!("{record}exec sleep infinity"),
    }
}

/// Counts one more start of (operation, task, cookie) in `dir` (shared by every agent of a run): returns the
/// start's number, from 0. Blocking.
///
/// Errors: the directory cannot be written, or [`ATTEMPTS_MAX`] starts were counted.
fn count_attempt(dir: &Path, job: JobId, task: &str, cookie: u32) -> Result<u32, String> {
    let task_hex: String = task.bytes().map(|byte| format!("{byte:02x}")).collect();
    for attempt in 0..ATTEMPTS_MAX {
        let path = dir.join(format!("{}.{cookie}.{task_hex}.{attempt}", job.operation));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => return Ok(attempt),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(format!("cannot count the start in {}: {error}", dir.display())),
        }
    }
    Err(format!("job {job}: more than {ATTEMPTS_MAX} starts of task {task} cookie {cookie}"))
}

/// The executor of a chaos agent: [`OsExecutor`] with the scenario's jobs (module docs).
#[derive(Clone, Debug)]
pub struct ChaosExecutor {
    inner: OsExecutor,
    script: Arc<JobScript>,
    log: RecordLog,
    attempts: PathBuf,
    /// Jobs' durations are multiplied by this (`--time-scale`).
    time_scale: f64,
}

impl ChaosExecutor {
    /// Runs the jobs of `script` (its seed set to the run's) through `inner`, recording to `log`, counting starts
    /// in `attempts` (a directory every agent of the run shares; created if missing), durations scaled by
    /// `time_scale`.
    ///
    /// Errors: the attempts directory cannot be created.
    pub fn new(
        inner: OsExecutor,
        script: JobScript,
        log: RecordLog,
        attempts: PathBuf,
        time_scale: f64,
    ) -> std::io::Result<ChaosExecutor> {
        std::fs::create_dir_all(&attempts)?;
        Ok(ChaosExecutor { inner, script: Arc::new(script), log, attempts, time_scale })
    }
}

/// A chaos job ready to spawn: the real executor's prepared job and what the record of its start says.
#[derive(Debug)]
pub struct PreparedChaosJob {
    prepared: PreparedJob,
    request: StartRequest,
    duration: Duration,
    behaviour: String,
}

impl Executor for ChaosExecutor {
    type Prepared = PreparedChaosJob;

    fn prepare(
        &self,
        mut request: StartRequest,
    ) -> impl Future<Output = Result<PreparedChaosJob, ExecutorError>> + Send + 'static {
        let executor = self.clone();
        async move {
            let launch = &request.launch;
            let (dir, job, task, cookie) =
                (executor.attempts.clone(), launch.job, launch.task.clone(), launch.job_cookie);
            let attempt = tokio::task::spawn_blocking(move || count_attempt(&dir, job, &task, cookie))
                .await
                .map_err(|error| ExecutorError(format!("job {job}: counting its start failed: {error}")))?
                .map_err(ExecutorError)?;
            let (duration, end) = executor.script.draw(job, &launch.task, cookie, attempt);
            let duration = duration.mul_f64(executor.time_scale);
            if let End::StartFailure(message) = &end {
                executor.log.append(&AgentRecord::StartFailed {
                    at_us: wall_now_us(),
                    node: request.node.clone(),
                    allocation: request.allocation,
                    job,
                    error: message.clone(),
                });
                return Err(ExecutorError(message.clone()));
            }
            let behaviour = match end {
                End::Exit(code) => format!("exit {code}"),
                _ => "hang".to_string(),
            };
            request.launch.command = job_command(duration, &end);
            let prepared = executor.inner.prepare(request.clone()).await?;
            Ok(PreparedChaosJob { prepared, request, duration, behaviour })
        }
    }

    fn spawn(&self, prepared: PreparedChaosJob) -> Result<ProcessHandle, ExecutorError> {
        let PreparedChaosJob { prepared, request, duration, behaviour } = prepared;
        let launch = &request.launch;
        let mut inner = match self.inner.spawn(prepared) {
            Ok(handle) => handle,
            Err(error) => {
                self.log.append(&AgentRecord::StartFailed {
                    at_us: wall_now_us(),
                    node: request.node.clone(),
                    allocation: request.allocation,
                    job: launch.job,
                    error: error.0.clone(),
                });
                return Err(error);
            }
        };
        let pid = inner.pid();
        self.log.append(&AgentRecord::Start {
            at_us: wall_now_us(),
            node: request.node.clone(),
            allocation: request.allocation,
            job: launch.job,
            incarnation: launch.incarnation.clone(),
            task: launch.task.clone(),
            job_cookie: launch.job_cookie,
            gang_rank: launch.gang_rank,
            pid,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            behaviour,
        });
        let (handle, mut control) = process_pair();
        let (log, job) = (self.log.clone(), launch.job);
        tokio::spawn(async move {
            let ended = tokio::select! {
                biased;
                _ = control.kill_requested() => None,
                status = inner.ended() => Some(status),
            };
            let status = match ended {
                Some(status) => status,
                None => inner.kill().await,
            };
            let end = match status {
                ExitStatus::Exited(code) => RecordedEnd::Exited(code),
                ExitStatus::Signaled(signal) => RecordedEnd::Signaled(signal),
                ExitStatus::Killed => RecordedEnd::Killed,
            };
            log.append(&AgentRecord::End { at_us: wall_now_us(), job, end });
            control.exited(status);
        });
        Ok(match pid {
            Some(pid) => handle.with_pid(pid),
            None => handle,
        })
    }
}

/// The jobs started and not ended in `records` (one agent's), with their pids: what died with the agent when it
/// was SIGKILLed (or runs now).
pub fn unended(records: &[AgentRecord]) -> Vec<(JobId, Option<u32>)> {
    let mut live: BTreeMap<JobId, Option<u32>> = BTreeMap::new();
    for record in records {
        match record {
            AgentRecord::Start { job, pid, .. } => {
                live.insert(*job, *pid);
            }
            AgentRecord::End { job, .. } => {
                live.remove(job);
            }
            _ => {}
        }
    }
    live.into_iter().collect()
}

/// The simulator's process log entries of `records` (one agent's, in order), each at `origin` plus its offset
/// from `origin_us` (the run's start on the same clock). An end, pause or resume takes the node, allocation,
/// incarnation, task and rank of its job's start; one without a start is left out, and so is a pause or resume
/// of a process already ended (the harness may write it just after the agent killed the process).
pub fn process_events(records: &[AgentRecord], origin: tokio::time::Instant, origin_us: i64) -> Vec<ProcessEvent> {
    let at = |at_us: i64| origin + Duration::from_micros(u64::try_from(at_us - origin_us).unwrap_or(0));
    let mut starts: BTreeMap<JobId, ProcessEvent> = BTreeMap::new();
    let mut events = Vec::new();
    for record in records {
        let (job, kind) = match record {
            AgentRecord::Start { at_us, node, allocation, job, incarnation, task, gang_rank, .. } => {
                let started = ProcessEvent {
                    at: at(*at_us),
                    node: node.clone(),
                    allocation: *allocation,
                    job: *job,
                    incarnation: incarnation.clone(),
                    task: task.clone(),
                    gang_rank: *gang_rank,
                    kind: ProcessEventKind::Started,
                };
                starts.insert(*job, started.clone());
                events.push(started);
                continue;
            }
            AgentRecord::End { job, end, .. } => (
                *job,
                match end {
                    RecordedEnd::Exited(code) => ProcessEventKind::Exited(*code),
                    _ => ProcessEventKind::Killed,
                },
            ),
            AgentRecord::Pause { job, .. } => (*job, ProcessEventKind::Paused),
            AgentRecord::Resume { job, .. } => (*job, ProcessEventKind::Resumed),
            _ => continue,
        };
        let ends = matches!(kind, ProcessEventKind::Exited(_) | ProcessEventKind::Killed);
        let started = if ends { starts.remove(&job) } else { starts.get(&job).cloned() };
        if let Some(started) = started {
            events.push(ProcessEvent { at: at(record.at_us()), kind, ..started });
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RowId;

    fn job(index: u64) -> JobId {
        JobId { operation: RowId(7), index }
    }

    #[test]
    fn a_job_command_sleeps_its_duration_and_ends_as_drawn() {
        let second = Duration::from_millis(1500);
        assert_eq!(job_command(second, &End::Exit(0)), "env | grep '^YT_' | sort > yt-env; exec sleep 1.500");
        assert!(job_command(second, &End::Exit(3)).ends_with("sleep 1.500; exit 3"));
        assert!(job_command(second, &End::Hang).ends_with("exec sleep infinity"));
    }

    #[test]
    fn records_round_trip_a_torn_last_line_is_left_out_and_ends_join_their_starts() {
        let dir = std::env::temp_dir().join(format!("lockstep-chaos-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent-0.records");
        let log = RecordLog::open(&path).unwrap();
        let allocation = AllocationRef { row: RowId(40), generation: 1 };
        let start = |job: JobId, pid: u32| AgentRecord::Start {
            at_us: 1_000_000,
            node: "agent-0".into(),
            allocation,
            job,
            incarnation: "7-i0".into(),
            task: "worker".into(),
            job_cookie: 0,
            gang_rank: Some(0),
            pid: Some(pid),
            duration_ms: 1500,
            behaviour: "exit 0".into(),
        };
        log.append(&start(job(1), 4242));
        log.append(&AgentRecord::End { at_us: 2_500_000, job: job(1), end: RecordedEnd::Exited(0) });
        log.append(&start(job(2), 4243));
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"record\":\"end\",\"at").unwrap();
        let records = RecordLog::read(&path).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(unended(&records), vec![(job(2), Some(4243))]);
        let origin = tokio::time::Instant::now();
        let events = process_events(&records, origin, 0);
        let kinds: Vec<_> = events.iter().map(|e| (e.job, e.kind.clone())).collect();
        assert_eq!(
            kinds,
            [
                (job(1), ProcessEventKind::Started),
                (job(1), ProcessEventKind::Exited(0)),
                (job(2), ProcessEventKind::Started)
            ]
        );
        assert_eq!(events[1].at - origin, Duration::from_millis(2500));
        assert_eq!(events[1].gang_rank, Some(0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn starts_are_counted_per_cookie_across_callers() {
        let dir = std::env::temp_dir().join(format!("lockstep-chaos-attempts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(count_attempt(&dir, job(1), "worker", 0), Ok(0));
        assert_eq!(count_attempt(&dir, job(4), "worker", 0), Ok(1));
        assert_eq!(count_attempt(&dir, job(2), "worker", 1), Ok(0));
        assert_eq!(count_attempt(&dir, job(3), "other", 0), Ok(0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
