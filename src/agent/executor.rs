//! The seam between an agent and the processes it runs (DESIGN §1: agents are generic over `E: Executor`).
//!
//! An executor starts one process per job; the agent holds a [`ProcessHandle`] per running process, reads its exit
//! without blocking, and kills it (waiting until it is gone, so an allocation never has two live processes).
//! Executors drive each process from a task of their own through the [`ProcessControl`] half.

use crate::gang::model::{AllocationRef, JobLaunch};
use std::future::Future;
use tokio::sync::{oneshot, watch};

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (not one the agent sent).
    Signaled(i32),
    /// The agent killed it.
    Killed,
}

/// An executor could not start a process (the job fails: YTsaurus counts a job that cannot prepare as failed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExecutorError(pub String);

/// What to start: a job in an allocation of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRequest {
    /// The node's name.
    pub node: String,
    /// The allocation the process runs in.
    pub allocation: AllocationRef,
    /// The job.
    pub launch: JobLaunch,
}

/// Runs processes for an agent, in two steps: [`Executor::prepare`] does the slow work (sandbox, files) and may take
/// as long as it needs, off the agent's loop; [`Executor::spawn`] only starts the prepared process, quickly, so the
/// agent can check its node lease's local deadline right before it (DESIGN §4: a fenced agent starts nothing).
pub trait Executor: Send + Sync + 'static {
    /// A start prepared and not yet spawned. Dropping it gives up the start.
    type Prepared: Send + 'static;

    /// Prepares the start of `request`, or says why the job cannot start. The future owns what it needs (the agent
    /// runs it in a task of its own when it does not finish at its first poll) and must not block the thread it
    /// is polled on: blocking file work goes to a blocking pool.
    fn prepare(
        &self,
        request: StartRequest,
    ) -> impl Future<Output = Result<Self::Prepared, ExecutorError>> + Send + 'static;

    /// Starts the prepared process and returns its handle, or why it could not start. Must not return before the
    /// process exists (or failed to), must not block for long (the agent calls it on its loop), and must end the
    /// process when the handle's kill is requested.
    fn spawn(&self, prepared: Self::Prepared) -> Result<ProcessHandle, ExecutorError>;

    /// [`Executor::prepare`] then [`Executor::spawn`], for callers without a lease to check in between (tests).
    fn start(&self, request: StartRequest) -> impl Future<Output = Result<ProcessHandle, ExecutorError>> + Send {
        async move {
            let prepared = self.prepare(request).await?;
            self.spawn(prepared)
        }
    }
}

/// The agent's half of a running process.
#[derive(Debug)]
pub struct ProcessHandle {
    exit: watch::Receiver<Option<ExitStatus>>,
    kill: Option<oneshot::Sender<()>>,
    /// The OS process id of a real process (its job shell), if the executor runs OS processes.
    pid: Option<u32>,
}

/// The executor's half: learns when a kill is requested and reports the exit.
#[derive(Debug)]
pub struct ProcessControl {
    exit: watch::Sender<Option<ExitStatus>>,
    kill: oneshot::Receiver<()>,
}

/// A connected pair of halves.
pub fn process_pair() -> (ProcessHandle, ProcessControl) {
    let (exit_tx, exit_rx) = watch::channel(None);
    let (kill_tx, kill_rx) = oneshot::channel();
    (ProcessHandle { exit: exit_rx, kill: Some(kill_tx), pid: None }, ProcessControl { exit: exit_tx, kill: kill_rx })
}

impl ProcessHandle {
    /// The same handle naming its OS process (an executor of real processes sets it at spawn).
    pub fn with_pid(mut self, pid: u32) -> ProcessHandle {
        self.pid = Some(pid);
        self
    }

    /// The OS process id of the process (the job's shell, which leads its session), if it is a real one.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The exit status, if the process has ended.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Kills the process and waits until it has ended. Returns how it ended (it may have exited first).
    pub async fn kill(mut self) -> ExitStatus {
        self.request_kill();
        self.ended().await
    }

    /// Asks the executor to kill the process, without waiting (a second request does nothing).
    pub fn request_kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }

    /// Waits until the process has ended and returns how. Cancel-safe: the handle stays usable.
    pub async fn ended(&mut self) -> ExitStatus {
        loop {
            if let Some(status) = *self.exit.borrow_and_update() {
                return status;
            }
            if self.exit.changed().await.is_err() {
                // The executor's task is gone (its node died with it): so is the process.
                return self.exit.borrow().unwrap_or(ExitStatus::Killed);
            }
        }
    }
}

impl ProcessControl {
    /// Resolves when the agent asks to kill the process, or drops its handle: a process outlives neither its
    /// agent's interest nor its agent (the same rule as self-fencing, DESIGN §4).
    pub async fn kill_requested(&mut self) {
        let _ = (&mut self.kill).await;
    }

    /// Reports the process's end.
    pub fn exited(self, status: ExitStatus) {
        let _ = self.exit.send(Some(status));
    }
}
