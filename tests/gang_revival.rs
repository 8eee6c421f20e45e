//! Revival (DESIGN §4): a replica that takes over an operation whose previous pass lost its lease mid-pass checks
//! the current incarnation's ranked jobs and restarts the gang without allocation reuse when one is missing. Two
//! replicas' operation pipelines and the agents are driven pass by pass on tokio's paused clock.
#![cfg(not(madsim))]

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, KIND_JOB};
use lockstep::gang::pipeline::{OPERATION_PIPELINE, OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{LockOutcome, LockRelatedParams, MemStore, RowId, Store, Timestamp, TokioClock};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
const GANG3: &str = "{tasks={worker={job_count=3;command=w;gang_options={}}}}";

fn seconds(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Drives one replica's operation pipeline by hand: a fetch, then every queued item.
async fn pass(pipeline: &Pipeline<MemStore>, handler: &OperationHandler, seed: u64) {
    pipeline.fetcher(seed).run_once().await.unwrap();
    while pipeline.work_one(handler).await.is_some() {}
}

/// Which job rows the pass that dies locked.
#[derive(Clone, Copy, Debug)]
enum DeadPass {
    /// Every job of the operation (as every pass once locked its live jobs).
    LockedEveryJob,
    /// Only the first job of the incarnation: a quiet pass's footprint (a pass locks the jobs it
    /// writes and the first one).
    LockedTheFirstJob,
}

/// Which handler replica B, which takes the operation over, runs.
#[derive(Clone, Copy, Debug)]
enum Takeover {
    /// Replica A's own handler: B has what A's last applied pass left (the operation's data names that pass), so it
    /// reads the first job of the incarnation rather than every job.
    SameHandler,
    /// A handler of its own: B reads every job.
    OwnHandler,
}

async fn revival_after_a_lost_pass(dead: DeadPass, takeover: Takeover) {
    let store = Arc::new(MemStore::new(TokioClock::new(START)));
    let log = ProcessLog::default();
    let executor = SimulatedExecutor::new(JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() }, log);
    let mut agents: Vec<_> =
        (0..7).map(|i| Agent::new(store.clone(), executor.clone(), AgentConfig::new(format!("node-{i}"), 1))).collect();
    let handler_a = OperationHandler::default();
    let handler_b = match takeover {
        Takeover::SameHandler => handler_a.clone(),
        Takeover::OwnHandler => OperationHandler::default(),
    };
    let replica_a = Pipeline::new(store.clone(), operation_pipeline_config()).unwrap();
    let replica_b = Pipeline::new(store.clone(), operation_pipeline_config()).unwrap();
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let op = api::submit_text(store.as_ref(), GANG3, SpecFormat::Yson).await.unwrap();
    pass(&replica_a, &handler_a, 1).await;
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    pass(&replica_a, &handler_a, 1).await;
    let before = api::status(store.as_ref(), op).await.unwrap();
    assert!(before.jobs.iter().all(|j| j.status == JobStatus::Running), "{:?}", before.jobs);

    // Replica A leases the operation and locks its jobs, then dies before applying.
    tokio::time::advance(seconds(6)).await; // past min_processing_interval
    replica_a.fetcher(1).run_once().await.unwrap();
    let lease =
        replica_a.shared.leases().into_iter().next().map(|(id, held)| lockstep::store::Lease { id, token: held.token });
    let lease = lease.expect("replica A holds the operation");
    let mut jobs: Vec<RowId> = store.list(KIND_JOB, Some(op)).await.unwrap().iter().map(|r| r.id).collect();
    if let DeadPass::LockedTheFirstJob = dead {
        jobs.truncate(1);
    }
    let params = LockRelatedParams {
        holder: lease,
        related: jobs,
        owner: OPERATION_PIPELINE.into(),
        lease_ttl: seconds(30),
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(store.lock_related(params).await.unwrap(), LockOutcome::Locked);

    // Meanwhile the node of cookie 1 dies: its agent runs no more passes and its lease expires.
    let victim = before.jobs.iter().find(|j| j.data.job_cookie == 1).unwrap();
    let victim_node = store.get(victim.data.allocation.unwrap().row).await.unwrap().unwrap().parent_id.unwrap();
    for _ in 0..31 {
        tokio::time::advance(seconds(1)).await;
        for agent in agents.iter_mut().filter(|a| a.node() != Some(victim_node)) {
            agent.run_once().await.unwrap();
        }
    }

    pass(&replica_b, &handler_b, 2).await;
    let view = api::status(store.as_ref(), op).await.unwrap();
    let switches = view.incarnation_events();
    assert_eq!(switches.len(), 2, "{dead:?}, {takeover:?}: {switches:?}");
    assert_eq!(switches[1].data["reason"], "lack_after_revival", "{dead:?}, {takeover:?}");
    assert_eq!(switches[1].data["trigger"]["gang_rank"], 1);
    // The revival locked every job the dead pass may have locked, and its apply unlocked them: no row keeps the
    // dead pass's token for a later pass to take for another revival.
    let kept_token = store.rows().into_iter().filter(|r| r.lock_token == Some(lease.token)).count();
    assert_eq!(kept_token, 0, "{dead:?}, {takeover:?}: rows still carry the dead pass's token");
    let old: BTreeSet<_> = before.jobs.iter().map(|j| j.data.allocation.unwrap()).collect();
    // The two ranks whose processes still run on live nodes wait until their agents report them killed.
    let waiting = view.current_jobs().filter(|j| j.status == JobStatus::Pending).count();
    assert_eq!(waiting, 2, "{:?}", view.jobs);
    for agent in agents.iter_mut().filter(|a| a.node() != Some(victim_node)) {
        let pass = agent.run_once().await.unwrap();
        assert!(pass.reported >= pass.killed.len());
    }
    pass(&replica_b, &handler_b, 2).await;
    let view = api::status(store.as_ref(), op).await.unwrap();
    for job in view.current_jobs() {
        let allocation = job.data.allocation.expect("placed once the old processes are known dead");
        assert!(!old.contains(&allocation), "job {} reused {allocation}", job.data.id);
    }
    assert!(view.data.lingering.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_replica_taking_over_after_a_lost_pass_restarts_a_gang_missing_a_ranked_job_without_reuse() {
    revival_after_a_lost_pass(DeadPass::LockedEveryJob, Takeover::OwnHandler).await;
    revival_after_a_lost_pass(DeadPass::LockedEveryJob, Takeover::SameHandler).await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_pass_that_locked_only_the_first_job_of_the_incarnation_is_a_revival_too() {
    revival_after_a_lost_pass(DeadPass::LockedTheFirstJob, Takeover::OwnHandler).await;
    revival_after_a_lost_pass(DeadPass::LockedTheFirstJob, Takeover::SameHandler).await;
}

#[tokio::test(start_paused = true)]
async fn without_a_lost_pass_the_same_loss_restarts_with_reuse() {
    let store = Arc::new(MemStore::new(TokioClock::new(START)));
    let executor = SimulatedExecutor::new(
        JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() },
        ProcessLog::default(),
    );
    let mut agents: Vec<_> =
        (0..5).map(|i| Agent::new(store.clone(), executor.clone(), AgentConfig::new(format!("node-{i}"), 1))).collect();
    let handler = OperationHandler::default();
    let replica = Pipeline::new(store.clone(), operation_pipeline_config()).unwrap();
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let op = api::submit_text(store.as_ref(), GANG3, SpecFormat::Yson).await.unwrap();
    pass(&replica, &handler, 1).await;
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let before = api::status(store.as_ref(), op).await.unwrap();
    let victim = before.jobs.iter().find(|j| j.data.job_cookie == 1).unwrap();
    let victim_node = store.get(victim.data.allocation.unwrap().row).await.unwrap().unwrap().parent_id.unwrap();
    for _ in 0..12 {
        tokio::time::advance(seconds(1)).await;
        for agent in agents.iter_mut().filter(|a| a.node() != Some(victim_node)) {
            agent.run_once().await.unwrap();
        }
    }
    pass(&replica, &handler, 1).await;
    let view = api::status(store.as_ref(), op).await.unwrap();
    let switches = view.incarnation_events();
    assert_eq!(switches.len(), 2);
    assert_eq!(switches[1].data["reason"], "job_aborted");
    let reused =
        view.current_jobs().filter(|j| before.jobs.iter().any(|b| b.data.allocation == j.data.allocation)).count();
    assert_eq!(reused, 2);
}
