//! `lockstep chaos serve` and `lockstep chaos agent`: the nodes of a chaos run, which `lockstep chaos run` starts
//! as child processes (hidden commands, not for users). Each is the real-mode command (`serve`, `agent`: the same
//! flags, the same code) with what the experiment adds: the schema's history of lease writes, the planted bugs,
//! and the scenario file's part of the world (the simulator's row workload pipelines in a replica, the scenario's
//! `[jobs]` rules in an agent).
//!
//! They live on the experiment side, beside `chaos run`: the real-mode commands know nothing of scenario files or
//! the simulator, and these commands use them, never the other way round (docs/layout.md).

use super::agent::{self, AgentArgs, AgentHooks, Started};
use super::serve::{self, ServeArgs, ServeHooks};
use super::{Failure, termination};
use lockstep::agent::Agent;
use lockstep::chaos::jobs::{ChaosExecutor, RecordLog};
use lockstep::pipeline::{ManagerOptions, PipelineManager};
use lockstep::sim::{ScenarioFile, workload};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Flags of `chaos serve`: `serve`'s, and the run's.
#[derive(clap::Args, Debug)]
pub struct ChaosServeArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Run the built-in row workload's pipelines of this scenario file (the simulator's handlers, unchanged)
    /// instead of the operation pipeline.
    #[arg(long, value_name = "FILE")]
    pub chaos_rows: Option<PathBuf>,
    /// The seed of the row workload's handlers (their random streams).
    #[arg(long, default_value_t = 1)]
    pub chaos_seed: u64,
    /// Record every lease write in the schema's history table (`PgOptions::history`).
    #[arg(long)]
    pub chaos_history: bool,
    /// The planted bug: the guarded apply skips its token guard (mutation testing only).
    #[arg(long)]
    pub chaos_apply_guard_off: bool,
    /// The planted bug: all-or-nothing gangs are placed incrementally (mutation testing only).
    #[arg(long)]
    pub chaos_gang_gate_off: bool,
}

/// Flags of `chaos agent`: `agent`'s, and the run's.
#[derive(clap::Args, Debug)]
pub struct ChaosAgentArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Run the jobs of this scenario file's `[jobs]` rules (`lockstep::chaos::jobs`) instead of the specs'
    /// commands, recording every process start and end.
    #[arg(long, value_name = "FILE")]
    pub chaos_jobs: PathBuf,
    /// The seed of the jobs' draws.
    #[arg(long, default_value_t = 1)]
    pub chaos_seed: u64,
    /// The agent's record file (appended, flushed to disk per record).
    #[arg(long, value_name = "FILE")]
    pub chaos_records: PathBuf,
    /// The directory where every agent of the run counts job starts.
    #[arg(long, value_name = "DIR")]
    pub chaos_attempts: PathBuf,
    /// Jobs' durations are multiplied by this.
    #[arg(long, default_value_t = 1.0)]
    pub chaos_time_scale: f64,
    /// PostgreSQL's application_name of the agent's sessions (the run's, so its faults end only its sessions).
    #[arg(long)]
    pub chaos_name: Option<String>,
    /// Record every lease write in the schema's history table (`PgOptions::history`).
    #[arg(long)]
    pub chaos_history: bool,
}

/// Runs a chaos run's replica until a signal, then drains it: the row workload of `--chaos-rows`, else the gang
/// controller as `serve` runs it, with the run's hooks.
pub async fn serve(args: ChaosServeArgs) -> Result<(), Failure> {
    match &args.chaos_rows {
        Some(path) => serve_rows(&args, path).await,
        None => {
            let hooks = ServeHooks {
                history: args.chaos_history,
                apply_guard_off: args.chaos_apply_guard_off,
                gang_gate_off: args.chaos_gang_gate_off,
            };
            serve::run_with(args.serve, hooks).await
        }
    }
}

/// A chaos run's replica of a row scenario: the simulator's row workload pipelines (`lockstep::sim::workload::
/// register`, the same handlers and engine) on PostgreSQL, until a signal, then a drain.
async fn serve_rows(args: &ChaosServeArgs, path: &Path) -> Result<(), Failure> {
    let file = ScenarioFile::load(path).map_err(|error| Failure::usage(format!("--chaos-rows: {error}")))?;
    // The planted bugs of the waitlist and the contention backoff run in the replica's own engine, as in the
    // simulator (sim/world.rs).
    let mutation = &file.scenario.mutation;
    let spec = Arc::new(workload::WorkloadSpec {
        waitlist_disabled: mutation.waitlist_disabled,
        contention_backoff_disabled: mutation.contention_backoff_disabled,
        park_wake_disabled: mutation.park_wake_disabled,
        ..file.scenario.workload.clone()
    });
    let connections = u32::try_from(workload::connections_needed(&spec)).unwrap_or(u32::MAX);
    let serve = &args.serve;
    let name = serve.replica.clone().unwrap_or_else(|| format!("replica-{}", std::process::id()));
    let (history, guard_off) = (args.chaos_history, args.chaos_apply_guard_off);
    let store = Arc::new(
        serve
            .database
            .connect_tuned(&format!("lockstep serve {name}"), connections, true, Some(spec.lease_ttl), |options| {
                options.history = history;
                options.apply_guard_disabled_for_mutation_test = guard_off;
                // The replica reaches PostgreSQL through the chaos proxy, whose faults leave connections
                // half-open: every call is bounded (`--call-timeout`, on by default).
                options.call_timeout = serve.call_timeout;
            })
            .await?,
    );
    let mut manager = PipelineManager::new(store, ManagerOptions { seed: args.chaos_seed });
    let faults_on = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Real handlers do not hang: the simulator's `handler-hang` has no real form yet (chaos refuses it).
    let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
    workload::register(&mut manager, &spec, args.chaos_seed, &faults_on, &hang);
    manager.start();
    tracing::info!(replica = %name, scenario = %path.display(), "row workload replica started");
    let signal = termination().await;
    tracing::info!(replica = %name, signal, "draining");
    let bound = serve.drain_timeout;
    tokio::select! {
        biased;
        report = manager.shutdown_within(bound) => report.map(|_| ()).ok_or_else(|| serve::drain_cut(bound)),
        signal = termination() => {
            manager.abort();
            Err(Failure::runtime(format!("{signal} during the drain: stopped without draining")))
        }
    }
}

/// Runs a chaos run's agent until a signal, then stops it gracefully: `agent` with the scenario's `[jobs]` rules
/// in place of the specs' commands, every process start and end recorded.
pub async fn agent(args: ChaosAgentArgs) -> Result<(), Failure> {
    let hooks = AgentHooks { name: args.chaos_name.clone(), history: args.chaos_history };
    let Started { config, executor, store } = agent::start(&args.agent, &hooks).await?;
    let (executor, records) = chaos_executor(&args, executor)?;
    let node = config.name.clone();
    agent::drive(Agent::new(store, executor, config).with_observer(records.pass_observer()), node).await
}

/// The executor of a chaos agent (the `[jobs]` rules of `--chaos-jobs` around `executor`) and its record.
fn chaos_executor(
    args: &ChaosAgentArgs,
    executor: lockstep::agent::process::OsExecutor,
) -> Result<(ChaosExecutor, RecordLog), Failure> {
    let path = &args.chaos_jobs;
    let file = ScenarioFile::load(path).map_err(|error| Failure::usage(format!("--chaos-jobs: {error}")))?;
    let mut script = file
        .scenario
        .gang
        .map(|gang| gang.jobs)
        .ok_or_else(|| Failure::usage(format!("--chaos-jobs {}: the scenario has no gang part", path.display())))?;
    script.seed = args.chaos_seed;
    let (records_path, attempts) = (&args.chaos_records, &args.chaos_attempts);
    let records = RecordLog::open(records_path)
        .map_err(|error| Failure::usage(format!("--chaos-records {}: {error}", records_path.display())))?;
    let executor = ChaosExecutor::new(executor, script, records.clone(), attempts.clone(), args.chaos_time_scale)
        .map_err(|error| Failure::usage(format!("--chaos-attempts {}: {error}", attempts.display())))?;
    Ok((executor, records))
}
