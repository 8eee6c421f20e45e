//! The real executor: each job is `sh -c COMMAND` in a sandbox directory of its own, stdout and stderr captured to
//! files, its exit code reported (DESIGN §4, agents). Linux; not in simulator builds.
//!
//! **What a job sees** (DESIGN §4: a job gets only what the spec gives it): a cleared environment plus the
//! agent's values of [`ENV_ALLOWED`] (those it has), then the job's environment from its row (the spec's
//! `environment` and the `YT_*` variables, which win over an allowed variable of the same name), then
//! [`JOB_MARKER_VAR`] (its value names the job for the agent; see [`super::job_tree`]). Nothing else of the
//! agent's reaches it: not `DATABASE_URL`, not `LOCKSTEP_SCHEMA`. Its sandbox is readable by its user only (0700,
//! stdout and stderr 0600).
//!
//! **The work dir is checked, and nothing under it is followed through a link** ([`super::work_dir`]): it must be
//! owned by the agent's user and not writable by group or others; sandboxes, output files, copies, records and the
//! lock are reached by descriptor with `O_NOFOLLOW`, and the shell starts in its sandbox by `fchdir`.
//!
//! **Its whole process tree ends with it** ([`super::job_tree`]: the shell leads a session of its own, every
//! process carries the marker):
//! - exit: when the shell exits, the tree is killed before the exit is reported, so the agent never reports an
//!   allocation free while a job's background children run;
//! - abort, incarnation change, fence, graceful stop: a kill ends the tree, then reaps the shell;
//! - agent SIGKILL: the kernel kills the shell (`PR_SET_PDEATHSIG`); the rest of the tree runs on until an agent
//!   opens the same work dir again ([`OsExecutor::open`]), which ends every tree its job records list before it
//!   takes any job. The records are written before a job is spawned and removed once its tree is dead.
//!
//! A job's preparation (sandbox, output files, `file_paths` copies, its record) is blocking file work and runs on
//! tokio's blocking pool ([`Executor::prepare`]), never on the agent's loop.

use super::executor::{Executor, ExecutorError, ExitStatus, ProcessHandle, StartRequest, process_pair};
use super::job_tree::{JOB_MARKER_VAR, JobRecords, JobTree, Leader};
use super::work_dir::DirHandle;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

/// The shell a job's command runs in, `SHELL -c COMMAND` (POSIX puts `sh` at /bin/sh).
pub const SHELL: &str = "/bin/sh";

/// The agent's environment variables a job inherits (docs/real-mode.md); every other one is withheld.
pub const ENV_ALLOWED: [&str; 5] = ["PATH", "HOME", "LANG", "TZ", "USER"];

/// The agent's own directory inside its work dir (job ids are `{operation}-{index}`, so no sandbox clashes).
const STATE_DIR: &str = ".lockstep";

/// Runs jobs as OS processes. Clones share one work dir and its lock.
#[derive(Clone, Debug)]
pub struct OsExecutor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    work_dir: PathBuf,
    /// The work dir, held open: every sandbox is made and opened relative to it.
    dir: DirHandle,
    files_root: Option<PathBuf>,
    /// The agent's values of [`ENV_ALLOWED`], read once at open.
    allowed: Vec<(&'static str, OsString)>,
    records: JobRecords,
    /// Unique to this executor (this agent run): markers of two runs never meet.
    run: u64,
    /// Holds the work dir's lock (`flock`) for as long as the executor lives; the kernel drops it when the agent
    /// dies.
    _lock: File,
}

/// A job ready to spawn: its sandbox, opened output files and environment. Dropped unspawned, it removes its job
/// record (nothing was started).
#[derive(Debug)]
pub struct PreparedJob {
    job: String,
    command: String,
    sandbox: DirHandle,
    stdout: File,
    stderr: File,
    environment: Vec<(OsString, OsString)>,
    tree: JobTree,
    records: JobRecords,
    spawned: bool,
}

impl Drop for PreparedJob {
    fn drop(&mut self) {
        if !self.spawned
            && let Err(error) = self.records.remove(&self.job)
        {
            tracing::warn!(job = %self.job, %error, "cannot remove the record of a job never spawned");
        }
    }
}

impl OsExecutor {
    /// Opens `work_dir` for one agent: creates it (0700) if missing, checks that it is owned by the agent's user
    /// and not writable by group or others ([`DirHandle::open_work_dir`]), locks it (a second agent on the same work
    /// dir is refused), and ends every process tree an earlier agent on it left (its job records, as far as
    /// `/proc` bears them out: [`JobTree::verified`]), before any job starts. Sandboxes are `work_dir/{job id}`.
    /// `files_root` maps the Cypress paths of `file_paths` to local files (`//tmp/x` → `files_root/tmp/x`), copied
    /// into the sandbox under their sandbox names; without it a job with `file_paths` cannot start.
    ///
    /// Errors (naming the directory): it cannot be created or locked, it breaks the owner or mode rule, an entry
    /// the agent uses is a symbolic link, another process holds its lock, or a leftover tree could not be ended.
    pub async fn open(work_dir: impl Into<PathBuf>, files_root: Option<PathBuf>) -> Result<OsExecutor, ExecutorError> {
        let work_dir = work_dir.into();
        let dir = work_dir.clone();
        let (dir, lock, records) = tokio::task::spawn_blocking(move || lock_work_dir(&dir))
            .await
            .map_err(|error| ExecutorError(format!("work dir {}: {error}", work_dir.display())))??;
        let (jobs, processes) = records
            .end_leftovers()
            .await
            .map_err(|error| ExecutorError(format!("work dir {}: earlier jobs: {error}", work_dir.display())))?;
        // A warning only when something was still running: records whose processes had all ended (a machine
        // that rebooted, an agent killed after its jobs exited) are routine to remove.
        if processes > 0 {
            tracing::warn!(
                work_dir = %work_dir.display(),
                jobs,
                processes,
                "ended the processes of jobs an earlier agent left running"
            );
        } else if jobs > 0 {
            tracing::info!(
                work_dir = %work_dir.display(),
                jobs,
                "removed the records of jobs an earlier agent left; none of their processes was still running"
            );
        }
        let allowed = ENV_ALLOWED.iter().filter_map(|name| Some((*name, std::env::var_os(name)?))).collect();
        let inner = Inner { work_dir, dir, files_root, allowed, records, run: rand::random(), _lock: lock };
        Ok(OsExecutor { inner: Arc::new(inner) })
    }

    /// The sandbox of job `job` (its id as displayed).
    pub fn sandbox(&self, job: &str) -> PathBuf {
        self.inner.work_dir.join(job)
    }

    /// The job's environment (module docs): allowed variables, then the row's, then the marker.
    fn environment(&self, launch: &BTreeMap<String, String>, marker: &str) -> Vec<(OsString, OsString)> {
        let mut environment: BTreeMap<OsString, OsString> =
            self.inner.allowed.iter().map(|(name, value)| (OsString::from(name), value.clone())).collect();
        environment.extend(launch.iter().map(|(name, value)| (name.into(), value.into())));
        environment.insert(JOB_MARKER_VAR.into(), marker.into());
        environment.into_iter().collect()
    }
}

/// Opens and checks the work dir, creates its state dir, and takes the work dir's lock. Blocking.
fn lock_work_dir(work_dir: &Path) -> Result<(DirHandle, File, JobRecords), ExecutorError> {
    let error = |e: std::io::Error| ExecutorError(format!("work dir {}: {e}", work_dir.display()));
    let dir = DirHandle::open_work_dir(work_dir)
        .map_err(|rule| ExecutorError(format!("work dir {}: {rule}", work_dir.display())))?;
    let state = dir.subdir(STATE_DIR, 0o700).map_err(error)?;
    let jobs = state.subdir("jobs", 0o700).map_err(error)?;
    let lock = state.create_file("lock", 0o600).map_err(error)?;
    let path = state.path().join("lock");
    // SAFETY: flock on a descriptor we own; it only takes an advisory lock.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(ExecutorError(format!(
                "work dir {}: in use by another agent (it holds {}); give each agent a work dir of its own",
                work_dir.display(),
                path.display()
            )));
        }
        return Err(ExecutorError(format!("work dir {}: cannot lock {}: {e}", work_dir.display(), path.display())));
    }
    Ok((dir, lock, JobRecords::new(jobs)))
}

/// Everything [`OsExecutor::prepare`] does, on the blocking pool. Returns the sandbox, held open, and the output
/// files.
fn prepare_blocking(
    work_dir: &DirHandle,
    files_root: Option<&Path>,
    records: &JobRecords,
    job: &str,
    request: &StartRequest,
    tree: &JobTree,
) -> Result<(DirHandle, File, File), ExecutorError> {
    let error = |what: &str, path: &Path, e: std::io::Error| ExecutorError(format!("{what} {}: {e}", path.display()));
    // Recorded first: if the agent dies at any point after this, the next one finds the job's processes.
    records.write(job, tree).map_err(|e| error("cannot write the job record in", records.dir(), e))?;
    // Its mode is set also when the sandbox already existed (a start given up earlier).
    let sandbox =
        work_dir.subdir(job, 0o700).map_err(|e| ExecutorError(format!("cannot make the sandbox of job {job}: {e}")))?;
    for file in &request.launch.file_paths {
        let root = files_root
            .ok_or_else(|| ExecutorError(format!("file {} requested but the agent has no files root", file.path)))?;
        // The spec refuses such paths; the agent checks again, since rows may come from elsewhere.
        let relative = Path::new(file.path.trim_start_matches('/'));
        if relative.components().any(|part| !matches!(part, std::path::Component::Normal(_))) {
            return Err(ExecutorError(format!("file path {} leaves the files root", file.path)));
        }
        let source = root.join(relative);
        let name = file.sandbox_name();
        if !crate::gang::spec::sandbox_name_allowed(name) {
            return Err(ExecutorError(format!("bad sandbox file name {name:?} for {}", file.path)));
        }
        copy_file(&source, &sandbox, name).map_err(|e| error("cannot copy", &source, e))?;
    }
    let open = |name: &str| {
        sandbox
            .create_file(name, 0o600)
            .map_err(|e| ExecutorError(format!("cannot create the output of job {job}: {e}")))
    };
    let (stdout, stderr) = (open("stdout")?, open("stderr")?);
    Ok((sandbox, stdout, stderr))
}

/// Copies `source` to the file `name` in `sandbox` with the source's permission bits (not its set-id bits), as
/// `std::fs::copy` does, but by reading it: `std::fs::copy` refuses anything but a regular file, and a named pipe
/// is a fine source (a test makes a copy that lasts as long as it likes with one). The source is under the files
/// root, which the agent's operator chose; the target is written without following a link. Blocking.
fn copy_file(source: &Path, sandbox: &DirHandle, name: &str) -> std::io::Result<u64> {
    let mut reader = File::open(source)?;
    let mode = reader.metadata()?.permissions().mode() & 0o777;
    let mut writer = sandbox.create_file(name, 0o600)?;
    let copied = std::io::copy(&mut reader, &mut writer)?;
    writer.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(copied)
}

impl Executor for OsExecutor {
    type Prepared = PreparedJob;

    fn prepare(
        &self,
        request: StartRequest,
    ) -> impl Future<Output = Result<PreparedJob, ExecutorError>> + Send + 'static {
        let executor = self.clone();
        async move {
            let job = request.launch.job.to_string();
            let marker = format!("{job}:{:016x}", executor.inner.run);
            let tree = JobTree { marker: marker.clone(), leader: None };
            let environment = executor.environment(&request.launch.environment, &marker);
            let inner = executor.inner.clone();
            let (job_in, tree_in) = (job.clone(), tree.clone());
            let command = request.launch.command.clone();
            let (sandbox, stdout, stderr) = tokio::task::spawn_blocking(move || {
                let files_root = inner.files_root.as_deref();
                prepare_blocking(&inner.dir, files_root, &inner.records, &job_in, &request, &tree_in)
            })
            .await
            .map_err(|error| ExecutorError(format!("preparation of job {job} failed: {error}")))?
            .inspect_err(|_| {
                let _ = executor.inner.records.remove(&job);
            })?;
            let records = executor.inner.records.clone();
            Ok(PreparedJob { job, command, sandbox, stdout, stderr, environment, tree, records, spawned: false })
        }
    }

    fn spawn(&self, mut prepared: PreparedJob) -> Result<ProcessHandle, ExecutorError> {
        // By its path: a program named without one is looked up in the child's own PATH when the environment sets
        // it, so a job's `PATH` without /bin (or one written as "/opt/x:$PATH", which nothing expands) made every
        // start fail with "cannot spawn sh" (a new user's trial).
        let mut command = tokio::process::Command::new(SHELL);
        command.arg("-c").arg(&prepared.command);
        start_in(&mut command, &prepared.sandbox);
        command.env_clear().envs(prepared.environment.iter().map(|(name, value)| (name, value)));
        let stdout = prepared.stdout.try_clone().map_err(|e| ExecutorError(format!("cannot pass stdout: {e}")))?;
        let stderr = prepared.stderr.try_clone().map_err(|e| ExecutorError(format!("cannot pass stderr: {e}")))?;
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        command.kill_on_drop(true);
        lead_a_session_and_die_with_agent(&mut command);
        let mut child = command.spawn().map_err(|e| ExecutorError(format!("cannot spawn {SHELL}: {e}")))?;
        let pid = child.id().ok_or_else(|| ExecutorError("process exited before it could be tracked".into()))?;
        // Not yet reaped (no wait has run), so the pid is still the shell's, even if it already exited.
        let leader = i32::try_from(pid).ok().and_then(Leader::read);
        prepared.spawned = true;
        let tree = JobTree { leader, ..prepared.tree.clone() };
        let (records, job) = (prepared.records.clone(), prepared.job.clone());
        drop(prepared);
        let (handle, mut control) = process_pair();
        tokio::spawn(async move {
            let recorded = (records.clone(), job.clone(), tree.clone());
            let written = tokio::task::spawn_blocking(move || recorded.0.write(&recorded.1, &recorded.2)).await;
            if let Ok(Err(error)) = written {
                tracing::warn!(%job, %error, "cannot record the job's shell; its marker still finds its processes");
            }
            let status = tokio::select! {
                biased;
                _ = control.kill_requested() => {
                    end_tree(&job, &tree).await;
                    let _ = child.wait().await;
                    ExitStatus::Killed
                }
                status = child.wait() => match status {
                    Ok(status) => exit_status(status),
                    Err(_) => ExitStatus::Killed,
                },
            };
            // After a normal exit too: background children must not outlive the job in its allocation.
            if end_tree(&job, &tree).await {
                let removed = tokio::task::spawn_blocking(move || records.remove(&job)).await;
                if let Ok(Err(error)) = removed {
                    tracing::warn!(%error, "cannot remove a job record");
                }
            }
            control.exited(status);
        });
        Ok(handle.with_pid(pid))
    }
}

/// Ends `tree`; returns whether it is dead (else it is logged, and its record stays for the next agent).
async fn end_tree(job: &str, tree: &JobTree) -> bool {
    match tree.end().await {
        Ok(_) => true,
        Err(error) => {
            tracing::error!(job, %error, "job processes survived SIGKILL");
            false
        }
    }
}

fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitStatus::Exited(code),
        (None, Some(signal)) => ExitStatus::Signaled(signal),
        (None, None) => ExitStatus::Killed,
    }
}

/// Makes the job's shell start in `sandbox` by its descriptor (`fchdir`), not its path: a link swapped in for the
/// sandbox after it was made is not followed. The descriptor is open (close-on-exec) in the forked child until the
/// exec, and `prepared` (which owns it) outlives the spawn.
fn start_in(command: &mut tokio::process::Command, sandbox: &DirHandle) {
    let fd = sandbox.fd().as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes an async-signal-safe call (fchdir).
    unsafe {
        command.pre_exec(move || {
            if libc::fchdir(fd) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the job's shell lead a new session (and process group), so its processes can be found by session id,
/// and asks the kernel to SIGKILL it when the agent dies (`PR_SET_PDEATHSIG`): a dead agent cannot fence itself,
/// and DESIGN §4 promises that when the controller declares a node lost its processes are dead. The signal
/// follows the thread that spawned the shell; the agent spawns from its runtime's threads, which live as long as
/// the agent. The rest of the tree is ended by the next agent on the work dir (module docs).
fn lead_a_session_and_die_with_agent(command: &mut tokio::process::Command) {
    let agent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe calls (setsid,
    // prctl, getppid, raise).
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            die_with_agent(agent)
        });
    }
}

/// In the forked child: arms `PR_SET_PDEATHSIG` (Linux), and dies at once if `agent` is already gone.
#[cfg(target_os = "linux")]
unsafe fn die_with_agent(agent: u32) -> std::io::Result<()> {
    // SAFETY (caller): runs between fork and exec; prctl, getppid and raise are async-signal-safe.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The agent died between the fork and the prctl: the signal was never armed.
        if u32::try_from(libc::getppid()).ok() != Some(agent) {
            libc::raise(libc::SIGKILL);
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
unsafe fn die_with_agent(_agent: u32) -> std::io::Result<()> {
    Ok(())
}
