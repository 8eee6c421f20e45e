//! Gang scenarios under the simulator (DESIGN §5), self-contained: two controller replicas and five node agents on
//! madsim nodes sharing one MemStore, each reaching it through a link the fault process can cut; a workload of
//! gang and plain operations whose jobs' durations and failures come from a seeded script; agent kills, replica
//! deaths and partitions drawn from the seed. After the faults stop, every operation must end within a bound, and
//! on every seed the checkers must hold: allocation exclusivity (from the process log), rank uniqueness per
//! incarnation, reuse keeping cookie/rank/descriptor, the completion and failure rules (`gang::audit`).
//!
//! Pinned seeds run by default; `GANG_SIM_SEEDS=N` runs seeds 1..=N instead, `GANG_SIM_SEED=S` seed S alone.
#![cfg(madsim)]

#[path = "gang_support/link.rs"]
mod link;

use link::{Link, Mode};
use lockstep::agent::{Agent, AgentConfig, Behaviour, End, JobScript, ProcessLog, Rule, SimulatedExecutor};
use lockstep::gang::api::{self, OperationView};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::{SpecFormat, audit};
use lockstep::pipeline::{ManagerOptions, PipelineManager};
use lockstep::store::{MemStore, RowId, Timestamp, TokioClock};
use madsim::runtime::{Handle, NodeHandle, Runtime};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
const REPLICAS: usize = 2;
const AGENTS: usize = 5;
const SLOTS: u32 = 2;
/// Faults are drawn during this window; then everything heals.
const FAULT_WINDOW: Duration = Duration::from_secs(180);
/// After the heal, every operation must end within this (simulated) time.
const LIVENESS_BOUND: Duration = Duration::from_secs(900);
const DEFAULT_SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

const WORKLOAD: [&str; 3] = [
    "{tasks={worker={job_count=3;command=w;gang_options={}}}}",
    "{tasks={trainer={job_count=4;command=t;gang_options={size=2}};logger={job_count=2;command=l}}}",
    "{tasks={master={job_count=1;command=m};slave={job_count=10;command=s}};max_failed_job_count=3}",
];

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("GANG_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    match std::env::var("GANG_SIM_SEEDS").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(n) => (1..=n).collect(),
        None => DEFAULT_SEEDS.to_vec(),
    }
}

/// Jobs run 5–60 s; a few starts fail or exit non-zero, from the seed.
fn script(seed: u64) -> JobScript {
    let failing = |task: &str, cookie, attempt, code| Rule {
        task: Some(task.into()),
        job_cookie: Some(cookie),
        attempt: Some(attempt),
        behaviour: Behaviour { duration: (Duration::from_secs(1), Duration::from_secs(8)), end: End::Exit(code) },
    };
    JobScript {
        seed,
        default: Behaviour { duration: (Duration::from_secs(5), Duration::from_secs(60)), end: End::Exit(0) },
        rules: vec![failing("worker", 1, 0, 1), failing("trainer", 0, 1, 2), failing("slave", 3, 0, 1)],
    }
}

/// What a run produced: each operation's final view and the process log's verdict, plus a fingerprint of the
/// run for the determinism check.
struct Outcome {
    views: Vec<OperationView>,
    exclusivity: Vec<String>,
    live_at_end: usize,
    fingerprint: String,
}

fn run(seed: u64) -> Outcome {
    std::thread::spawn(move || {
        let mut runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.set_time_limit(Duration::from_secs(4 * 3600));
        runtime.block_on(simulate(seed))
    })
    .join()
    .unwrap_or_else(|_| {
        panic!("seed {seed} panicked; replay: GANG_SIM_SEED={seed} env -u RUSTFLAGS cargo sim-test --test gang_sim")
    })
}

struct Node {
    name: String,
    handle: NodeHandle,
    link: Link,
    agent: bool,
}

async fn simulate(seed: u64) -> Outcome {
    let handle = Handle::current();
    let store = MemStore::new(TokioClock::new(START));
    let log = ProcessLog::default();
    let executor = SimulatedExecutor::new(script(seed), log.clone());
    let mut nodes = Vec::new();
    for i in 0..REPLICAS {
        let link = Link::new(store.clone());
        let init_link = link.clone();
        let node = handle
            .create_node()
            .name(format!("replica-{i}"))
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, i as u8 + 1)))
            .init(move || {
                let link = init_link.clone();
                async move {
                    let options = ManagerOptions { seed: seed ^ (i as u64) << 32 };
                    let mut manager = PipelineManager::new(std::sync::Arc::new(link), options);
                    manager.register(operation_pipeline_config(), OperationHandler::default()).unwrap();
                    manager.start();
                    std::future::pending::<()>().await;
                    drop(manager);
                }
            })
            .build();
        nodes.push(Node { name: format!("replica-{i}"), handle: node, link, agent: false });
    }
    for i in 0..AGENTS {
        let link = Link::new(store.clone());
        let (init_link, executor) = (link.clone(), executor.clone());
        let name = format!("agent-{i}");
        let init_name = name.clone();
        let node = handle
            .create_node()
            .name(name.clone())
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 2, i as u8 + 1)))
            .init(move || {
                let config = AgentConfig::new(init_name.clone(), SLOTS);
                Agent::new(std::sync::Arc::new(init_link.clone()), executor.clone(), config).run()
            })
            .build();
        nodes.push(Node { name, handle: node, link, agent: true });
    }

    let (operations, ()) = tokio::join!(workload(&store), faults(seed, &handle, &nodes, &log));
    // Heal: every link open, every node running.
    for node in &nodes {
        node.link.set(Mode::Open);
    }
    let views = wait_all_ended(&store, &operations).await;
    tokio::time::sleep(Duration::from_secs(20)).await; // agents stop what the ended operations left
    // Every event of every operation and every process event, with its simulated time.
    let events: Vec<_> =
        views.iter().flat_map(|v| v.events.iter().map(|e| (e.at, e.kind.clone(), e.data.to_string()))).collect();
    let fingerprint = format!("{events:?}\n{:?}", log.events());
    Outcome { exclusivity: log.exclusivity_violations(), live_at_end: log.live().len(), views, fingerprint }
}

/// The workload: an operation of [`WORKLOAD`], in turn, every 15 s of the fault window.
async fn workload(store: &MemStore) -> Vec<RowId> {
    let mut operations = Vec::new();
    let started = tokio::time::Instant::now();
    for spec in WORKLOAD.iter().cycle() {
        if started.elapsed() >= FAULT_WINDOW {
            break;
        }
        operations.push(api::submit_text(store, spec, SpecFormat::Yson).await.unwrap());
        tokio::time::sleep(Duration::from_secs(15)).await;
    }
    operations
}

/// The fault process: until the window closes, every 5–20 s one fault for 5–40 s on a node drawn from the seed:
/// kill (and later restart) an agent or a replica, or cut its link (calls hang) and heal it.
async fn faults(seed: u64, handle: &Handle, nodes: &[Node], log: &ProcessLog) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(0xfa17);
    let started = tokio::time::Instant::now();
    while started.elapsed() < FAULT_WINDOW {
        tokio::time::sleep(Duration::from_secs(rng.random_range(5..=20))).await;
        let node = &nodes[rng.random_range(0..nodes.len())];
        let span = Duration::from_secs(rng.random_range(5..=40));
        if rng.random_bool(0.5) {
            handle.kill(node.handle.id());
            if node.agent {
                // A simulated node's tasks end without a word: its processes die with it.
                log.node_died(&node.name);
            }
            tokio::time::sleep(span).await;
            handle.restart(node.handle.id());
        } else {
            node.link.set(Mode::Hanging);
            tokio::time::sleep(span).await;
            node.link.set(Mode::Open);
        }
    }
}

async fn wait_all_ended(store: &MemStore, operations: &[RowId]) -> Vec<OperationView> {
    let healed = tokio::time::Instant::now();
    loop {
        let mut views = Vec::new();
        for op in operations {
            views.push(api::status(store, *op).await.unwrap());
        }
        if views.iter().all(|v| v.status.is_terminal()) {
            return views;
        }
        let waiting: Vec<_> = views.iter().filter(|v| !v.status.is_terminal()).map(|v| (v.id, v.status)).collect();
        assert!(
            healed.elapsed() < LIVENESS_BOUND,
            "operations {waiting:?} still running {LIVENESS_BOUND:?} after the heal"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[test]
fn gang_scenarios_with_agent_kills_partitions_and_replica_deaths_keep_every_rule() {
    let mut restarts = 0;
    for seed in seeds() {
        let outcome = run(seed);
        let replay = format!("replay: GANG_SIM_SEED={seed} env -u RUSTFLAGS cargo sim-test --test gang_sim");
        // Every operation starts one incarnation; each further one is a gang restart.
        restarts += outcome.views.iter().map(|view| view.incarnation_events().len().saturating_sub(1)).sum::<usize>();
        assert!(
            outcome.exclusivity.is_empty(),
            "seed {seed}: allocation exclusivity: {:#?}\n{replay}",
            outcome.exclusivity
        );
        assert_eq!(outcome.live_at_end, 0, "seed {seed}: processes outlived their operations\n{replay}");
        for view in &outcome.views {
            let violations = audit::operation(view);
            assert!(violations.is_empty(), "seed {seed}: operation {}: {violations:#?}\n{replay}", view.id);
        }
    }
    // The rules above are only checked where restarts happen: the pinned seeds must reach them.
    assert!(restarts > 0, "no gang restart on any pinned seed: the reuse and rank checks tested nothing");
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let (first, second) = (run(11), run(11));
    assert!(first.fingerprint.len() > 10_000, "too little happened to compare: {}", first.fingerprint);
    assert!(first.fingerprint == second.fingerprint, "seed 11 gave two different runs");
}
