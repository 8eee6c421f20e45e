//! The real executor: each job is `sh -c COMMAND` in a sandbox directory of its own, with its environment set one
//! variable at a time, stdout and stderr captured to files, and its exit code reported (DESIGN §4, agents). Not in
//! simulator builds.
//!
//! The shell runs in a process group of its own and a kill sends SIGKILL to the whole group, so a command's
//! children die with it: otherwise `sh -c "a | b"` would leave `a` and `b` running in an allocation the controller
//! may already have given to another job.
//!
//! On Linux each job's shell also gets SIGKILL when its agent dies (`PR_SET_PDEATHSIG`), so an agent killed with
//! SIGKILL (or by the OOM killer) leaves no job running: DESIGN §4 promises that when the controller declares a node
//! lost its processes are dead, and a dead agent cannot fence itself. The signal follows the thread that spawned
//! the shell; the agent spawns from its runtime's worker threads, which live as long as the agent. Only the shell
//! gets it: a command's own children outlive it, as they outlive any `sh` killed alone.

use super::executor::{Executor, ExecutorError, ExitStatus, ProcessHandle, StartRequest, process_pair};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Runs jobs as OS processes.
#[derive(Clone, Debug)]
pub struct OsExecutor {
    work_dir: PathBuf,
    files_root: Option<PathBuf>,
}

impl OsExecutor {
    /// An executor whose sandboxes are `work_dir/{job id}` (created as needed). `files_root` maps the Cypress paths
    /// of `file_paths` to local files (`//tmp/x` → `files_root/tmp/x`), copied into the sandbox under their
    /// sandbox names; without it a job with `file_paths` cannot start.
    pub fn new(work_dir: impl Into<PathBuf>, files_root: Option<PathBuf>) -> OsExecutor {
        OsExecutor { work_dir: work_dir.into(), files_root }
    }

    /// The sandbox of job `job` (its id as displayed).
    pub fn sandbox(&self, job: &str) -> PathBuf {
        self.work_dir.join(job)
    }

    fn prepare(&self, request: &StartRequest) -> Result<PathBuf, ExecutorError> {
        let sandbox = self.sandbox(&request.launch.job.to_string());
        let error =
            |what: &str, path: &Path, e: std::io::Error| ExecutorError(format!("{what} {}: {e}", path.display()));
        std::fs::create_dir_all(&sandbox).map_err(|e| error("cannot create sandbox", &sandbox, e))?;
        for file in &request.launch.file_paths {
            let root = self.files_root.as_ref().ok_or_else(|| {
                ExecutorError(format!("file {} requested but the agent has no files root", file.path))
            })?;
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
            std::fs::copy(&source, sandbox.join(name)).map_err(|e| error("cannot copy", &source, e))?;
        }
        Ok(sandbox)
    }
}

impl Executor for OsExecutor {
    async fn start(&self, request: StartRequest) -> Result<ProcessHandle, ExecutorError> {
        let sandbox = self.prepare(&request)?;
        let open = |name: &str| {
            std::fs::File::create(sandbox.join(name))
                .map_err(|e| ExecutorError(format!("cannot create {}: {e}", sandbox.join(name).display())))
        };
        let mut command = tokio::process::Command::new("sh");
        command.arg("-c").arg(&request.launch.command).current_dir(&sandbox);
        for (name, value) in &request.launch.environment {
            command.env(name, value);
        }
        command.stdin(Stdio::null()).stdout(open("stdout")?).stderr(open("stderr")?);
        command.process_group(0).kill_on_drop(true);
        die_with_agent(&mut command);
        let mut child = command.spawn().map_err(|e| ExecutorError(format!("cannot spawn sh: {e}")))?;
        let pid = child.id().ok_or_else(|| ExecutorError("process exited before it could be tracked".into()))?;
        let (handle, mut control) = process_pair();
        tokio::spawn(async move {
            let status = tokio::select! {
                biased;
                _ = control.kill_requested() => {
                    kill_group(pid);
                    let _ = child.wait().await;
                    ExitStatus::Killed
                }
                status = child.wait() => match status {
                    Ok(status) => exit_status(status),
                    Err(_) => ExitStatus::Killed,
                },
            };
            control.exited(status);
        });
        Ok(handle)
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

/// SIGKILL to the process group `pid` leads (the shell and everything it started).
fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH, which is harmless.
    unsafe {
        libc::killpg(pid, libc::SIGKILL);
    }
}

/// Asks the kernel to SIGKILL the job's shell when the agent dies (Linux; see the module docs).
#[cfg(target_os = "linux")]
fn die_with_agent(command: &mut tokio::process::Command) {
    let agent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe calls (prctl,
    // getppid, raise).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The agent died between the fork and the prctl: the signal was never armed.
            if u32::try_from(libc::getppid()).ok() != Some(agent) {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_agent(_command: &mut tokio::process::Command) {}
