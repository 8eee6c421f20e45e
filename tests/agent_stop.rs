//! Graceful agent stop (`Agent::stop`, `Agent::run_until`) and the agent config's rules; on MemStore with the
//! simulated executor, on tokio's paused clock. The real binary's SIGTERM path is in tests/real_e2e.rs.
#![cfg(not(madsim))]

use lockstep::agent::simulated::ProcessEventKind;
use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, REASON_NODE_STOPPING, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{INBOX_NEW, JobOutcome, JobStatus, KIND_INBOX, KIND_NODE, Message};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, RowId, Store, Timestamp, TokioClock};
use std::sync::Arc;
use std::time::Duration;

const START: Timestamp = Timestamp(1_700_000_000_000_000);

struct Setup {
    store: MemStore,
    log: ProcessLog,
    replica: Pipeline<MemStore>,
}

impl Setup {
    fn new() -> Setup {
        let store = MemStore::new(TokioClock::new(START));
        let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
        Setup { store, log: ProcessLog::default(), replica }
    }

    fn agent(&self, name: &str) -> Agent<MemStore, SimulatedExecutor> {
        let script = JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() };
        let executor = SimulatedExecutor::new(script, self.log.clone());
        Agent::new(Arc::new(self.store.clone()), executor, AgentConfig::new(name, 1))
    }

    async fn controller_pass(&self) {
        self.replica.fetcher(1).run_once().await.unwrap();
        while self.replica.work_one(&OperationHandler::default()).await.is_some() {}
    }

    async fn node_token(&self, name: &str) -> Option<lockstep::store::LockToken> {
        let nodes = self.store.list(KIND_NODE, None).await.unwrap();
        nodes.into_iter().find(|n| n.status == name).expect("registered").lock_token
    }

    async fn inbox(&self, op: RowId) -> Vec<Message> {
        let rows = self.store.list(KIND_INBOX, Some(op)).await.unwrap();
        rows.iter().filter(|r| r.status == INBOX_NEW).map(|r| Message::from_row(r).unwrap()).collect()
    }
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_stopping_agent_interrupts_its_jobs_reports_them_and_gives_its_node_back() {
    let setup = Setup::new();
    let mut a = setup.agent("a");
    let mut b = setup.agent("b");
    a.run_once().await.unwrap();
    b.run_once().await.unwrap();
    // A gang of one: its job goes to one of the two nodes' allocations; that agent is the one stopped.
    let op = api::submit_text(&setup.store, "{tasks={w={job_count=1;command=x;gang_options={}}}}", SpecFormat::Yson)
        .await
        .unwrap();
    setup.controller_pass().await;
    let pass_a = a.run_once().await.unwrap();
    let pass_b = b.run_once().await.unwrap();
    let (stopping, other, started) = if pass_a.started.is_empty() { (b, a, pass_b) } else { (a, b, pass_a) };
    let job = started.started[0];
    setup.controller_pass().await; // consumes "job started"
    assert!(setup.inbox(op).await.is_empty());
    let node = stopping.node().unwrap();
    let name = setup.store.get(node).await.unwrap().unwrap().status;
    assert!(setup.node_token(&name).await.is_some(), "{name} holds its node lease");

    let stop = stopping.stop().await;
    settle().await;
    assert_eq!(stop.interrupted, vec![job]);
    assert_eq!((stop.reported, stop.unreported, stop.lease_released), (1, 0, true));
    assert_eq!(setup.node_token(&name).await, None, "{name} gave its node lease back");
    let killed = setup.log.events().iter().filter(|e| e.kind == ProcessEventKind::Killed).count();
    assert_eq!(killed, 1, "the running process was killed");
    let inbox = setup.inbox(op).await;
    let interrupted = JobOutcome::Interrupted { reason: REASON_NODE_STOPPING.into() };
    assert!(
        matches!(&inbox[..], [Message::JobEnded { job: j, outcome, .. }] if *j == job && *outcome == interrupted),
        "{inbox:?}"
    );

    // The controller restarts the gang at once, on the other node: the stopped node's allocation is dead.
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    let old = view.jobs.iter().find(|j| j.data.id == job).unwrap();
    assert_eq!(old.status, JobStatus::Aborted);
    assert_eq!(old.data.reason.as_deref(), Some("interrupted: node stopping"));
    assert_eq!(view.incarnation_events().len(), 2, "one gang restart");
    let mut other = other;
    let pass = other.run_once().await.unwrap();
    assert_eq!(pass.started.len(), 1, "the new incarnation's job runs on the other node");
    assert_eq!(pass.started[0].operation, op);
}

#[tokio::test(start_paused = true)]
async fn run_until_stops_gracefully_when_its_signal_fires() {
    let setup = Setup::new();
    let agent = setup.agent("a");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run_until(async {
        let _ = rx.await;
    }));
    let op = api::submit_text(&setup.store, "{tasks={w={job_count=1;command=x}}}", SpecFormat::Yson).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    setup.controller_pass().await;
    // The allocation hint wakes the agent, which starts the job.
    for _ in 0..50 {
        if setup.log.events().iter().any(|e| e.kind == ProcessEventKind::Started) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.send(()).unwrap();
    let stop = task.await.unwrap();
    assert_eq!(stop.interrupted.len(), 1, "{stop:?}");
    assert!(stop.lease_released);
    assert_eq!(setup.node_token("a").await, None);
    assert_eq!(setup.inbox(op).await.len(), 2, "job started, then job ended (interrupted)");
}

#[test]
fn agent_config_rules_name_the_field() {
    AgentConfig::new("n", 1).validate().unwrap();
    let field = |config: AgentConfig| config.validate().unwrap_err().field;
    assert_eq!(field(AgentConfig::new("", 1)), "name");
    assert_eq!(field(AgentConfig::new("n", 0)), "slots");
    let base = AgentConfig::new("n", 1);
    assert_eq!(field(AgentConfig { lease_margin: base.lease_ttl, ..base.clone() }), "lease_margin");
    assert_eq!(field(AgentConfig { poll_interval: Duration::ZERO, ..base.clone() }), "poll_interval");
    let slow = AgentConfig { poll_interval: Duration::from_secs(3), ..base.clone() };
    assert_eq!(
        slow.validate().unwrap_err().to_string(),
        "agent n: heartbeat_trigger: 5s is shorter than 2 × poll_interval (3s) = 6s: a lease due for extension must \
         hold two passes"
    );
    let late = AgentConfig { heartbeat_trigger: Duration::from_secs(8), ..base.clone() };
    let error = late.validate().unwrap_err();
    assert_eq!(error.field, "heartbeat_trigger");
    assert_eq!(
        error.to_string(),
        "agent n: heartbeat_trigger: 8s must be shorter than lease_ttl (10s) − lease_margin (2s) = 8s"
    );
}
