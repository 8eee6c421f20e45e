//! Controller scale under the simulator (issue 8, part 4): one gang operation of 1, 64, 1 024 and 10 000 jobs,
//! from submit to every job running, and one gang restart from the failure that causes it to every job of the
//! new incarnation running. Reports simulated time (what a user would wait, given the controller's pass and agent
//! poll intervals) and wall time (what the controller's passes cost the CPU).
//!
//! The world: one controller replica (a `PipelineManager` with the operation pipeline) and enough agents of 100
//! slots each (at least one), on madsim nodes sharing one in-process `MemStore`: no network, no faults, so the
//! numbers are the controller's and the agents' own. Every job runs for an hour of simulated time except job
//! cookie 0 of the first incarnation, which exits with code 1 at `FAIL_AFTER`: the gang restart. The harness polls
//! the operation's jobs every 100 simulated ms; simulated times come from the jobs' events, so the poll does not
//! round them, and the CPU time of the harness's own reads is subtracted from the wall time.
//!
//! Run (release, simulator build): `env -u RUSTFLAGS cargo sim-bench --bench controller_scale`.
//! `LOCKSTEP_BENCH_JOBS=1,64` picks the sizes. Without `--bench` (as `cargo test --all-targets` runs every bench)
//! it runs the smallest size only, as a smoke test; in the normal build it only says how to run it.

#[cfg(madsim)]
fn main() {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let sizes: Vec<u32> = match std::env::var("LOCKSTEP_BENCH_JOBS") {
        Ok(list) => {
            list.split(',').map(|n| n.trim().parse().expect("LOCKSTEP_BENCH_JOBS: a list of numbers")).collect()
        }
        Err(_) if bench => vec![1, 64, 1_024, 10_000],
        Err(_) => vec![1],
    };
    println!("controller_scale: one gang operation, one replica, agents of {SLOTS} slots, no faults");
    println!(
        "| jobs | agents | submit → all running: simulated s | wall s | gang restart → all running: simulated s | wall s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for jobs in sizes {
        let m = scale::measure(jobs);
        println!(
            "| {jobs} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            m.agents,
            m.start.simulated.as_secs_f64(),
            m.start.wall.as_secs_f64(),
            m.restart.simulated.as_secs_f64(),
            m.restart.wall.as_secs_f64()
        );
    }
}

#[cfg(not(madsim))]
fn main() {
    println!(
        "controller_scale measures the simulator build: `env -u RUSTFLAGS cargo sim-bench --bench controller_scale`"
    );
}

/// Slots per agent.
#[cfg(madsim)]
const SLOTS: u32 = 100;

#[cfg(madsim)]
mod scale {
    use super::SLOTS;
    use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessEventKind, ProcessLog, SimulatedExecutor};
    use lockstep::gang::SpecFormat;
    use lockstep::gang::api;
    use lockstep::gang::controller::EVENT_JOB_STATE;
    use lockstep::gang::model::{JobStatus, OperationStatus};
    use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
    use lockstep::pipeline::{ManagerOptions, PipelineManager};
    use lockstep::store::{MemStore, RowId, Store, Timestamp, TokioClock};
    use madsim::runtime::{Handle, Runtime};
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;
    use std::time::Duration;

    /// When job cookie 0 of incarnation 0 fails, simulated time after it started: after every job runs.
    const FAIL_AFTER: Duration = Duration::from_secs(300);
    /// Every other job's run time (simulated): longer than the measurement.
    const RUN_TIME: Duration = Duration::from_secs(3_600);
    /// The harness's poll of the operation's jobs (simulated).
    const POLL: Duration = Duration::from_millis(100);

    /// One span: simulated and wall time.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Span {
        pub simulated: Duration,
        pub wall: Duration,
    }

    /// What one size measured.
    pub struct Measurement {
        pub agents: u32,
        pub start: Span,
        pub restart: Span,
    }

    /// CPU time of this thread so far (nanosecond resolution, from the scheduler's accounting).
    fn cpu_time() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux's /proc/thread-self/schedstat");
        let nanos: u64 = stat.split_whitespace().next().and_then(|n| n.parse().ok()).expect("schedstat's first field");
        Duration::from_nanos(nanos)
    }

    /// Runs the world for a gang of `jobs` jobs; panics if it does not reach every phase (the bench is wrong).
    pub fn measure(jobs: u32) -> Measurement {
        let agents = jobs.div_ceil(SLOTS).max(1);
        std::thread::spawn(move || {
            let mut runtime = Runtime::with_seed_and_config(1, madsim::Config::default());
            runtime.set_time_limit(Duration::from_secs(4 * 3_600));
            let (start, restart) = runtime.block_on(world(jobs, agents));
            Measurement { agents, start, restart }
        })
        .join()
        .expect("the run reaches every phase")
    }

    async fn world(jobs: u32, agents: u32) -> (Span, Span) {
        let handle = Handle::current();
        let store = MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000)));
        let script = JobScript { seed: 1, default: Behaviour::exit_after(RUN_TIME, 0), rules: Vec::new() }.with(
            "worker",
            0,
            0,
            Behaviour::exit_after(FAIL_AFTER, 1),
        );
        let log = ProcessLog::default();
        let executor = SimulatedExecutor::new(script, log.clone());
        let replica_store = store.clone();
        let _replica = handle
            .create_node()
            .name("replica-0")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
            .init(move || {
                let store = replica_store.clone();
                async move {
                    let mut manager = PipelineManager::new(Arc::new(store), ManagerOptions { seed: 1 });
                    manager.register(operation_pipeline_config(), OperationHandler::default()).expect("valid config");
                    manager.start();
                    std::future::pending::<()>().await;
                }
            })
            .build();
        let mut nodes = Vec::new();
        for i in 0..agents {
            let (store, executor) = (store.clone(), executor.clone());
            let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 2 + (i / 250) as u8, (i % 250) as u8 + 1));
            nodes.push(
                handle
                    .create_node()
                    .name(format!("agent-{i}"))
                    .ip(ip)
                    .init(move || {
                        Agent::new(
                            Arc::new(store.clone()),
                            executor.clone(),
                            AgentConfig::new(format!("agent-{i}"), SLOTS),
                        )
                        .run()
                    })
                    .build(),
            );
        }
        // Let every agent register its node and slots before the operation arrives.
        tokio::time::sleep(Duration::from_secs(5)).await;

        let spec = format!("{{tasks={{worker={{job_count={jobs};command=w;gang_options={{}}}}}}}}");
        let (submitted, wall) = (Store::now(&store).await.expect("MemStore's clock"), cpu_time());
        let op = api::submit_text(&store, &spec, SpecFormat::Yson).await.expect("a valid spec");
        let (running, polling) = all_running(&store, op, 0, jobs).await;
        let start =
            Span { simulated: micros(running.as_micros() - submitted.as_micros()), wall: cpu_time() - wall - polling };

        // The gang restart, timed from the failing process's exit (the process log's time) to every job of
        // incarnation 1 running; the wall clock starts when the harness sees the exit.
        let exited = loop {
            let exit = log.events().into_iter().find(|e| matches!(e.kind, ProcessEventKind::Exited(code) if code != 0));
            if let Some(exit) = exit {
                // The process log keeps runtime instants; the store keeps store time: the same clock here.
                let ago = exit.at.elapsed();
                break Store::now(&store).await.expect("MemStore's clock").minus(ago);
            }
            tokio::time::sleep(POLL).await;
        };
        let wall = cpu_time();
        let (running, polling) = all_running(&store, op, 1, jobs).await;
        let view = api::status(&store, op).await.expect("the operation exists");
        assert_eq!(view.status, OperationStatus::Running, "the operation ended instead of restarting its gang");
        let restart =
            Span { simulated: micros(running.as_micros() - exited.as_micros()), wall: cpu_time() - wall - polling };
        drop(nodes);
        (start, restart)
    }

    fn micros(micros: i64) -> Duration {
        Duration::from_micros(u64::try_from(micros).expect("a span does not end before it starts"))
    }

    /// Waits until `jobs` jobs of `incarnation` run; returns when the last of them started running (store time of
    /// its `job_state_changed` event, so the harness's poll interval does not round it), and the CPU time the
    /// harness's own reads took (not the controller's: the caller subtracts it).
    async fn all_running(store: &MemStore, op: RowId, incarnation: u32, jobs: u32) -> (Timestamp, Duration) {
        let mut polling = Duration::ZERO;
        loop {
            let poll = cpu_time();
            let view = api::status(store, op).await.expect("the operation exists");
            assert!(
                view.data.incarnation <= incarnation,
                "incarnation {} began before every job of incarnation {incarnation} ran: raise FAIL_AFTER",
                view.data.incarnation
            );
            let running = view
                .jobs
                .iter()
                .filter(|j| j.data.incarnation == incarnation && j.status == JobStatus::Running)
                .count();
            if running == jobs as usize {
                let ids: BTreeSet<String> = view
                    .jobs
                    .iter()
                    .filter(|j| j.data.incarnation == incarnation)
                    .map(|j| j.data.id.to_string())
                    .collect();
                let last = view
                    .events
                    .iter()
                    .filter(|e| e.kind == EVENT_JOB_STATE && e.data["to"] == "running")
                    .filter(|e| e.data["job"].as_str().is_some_and(|job| ids.contains(job)))
                    .map(|e| e.at)
                    .max()
                    .expect("running jobs have their events");
                return (last, polling + (cpu_time() - poll));
            }
            polling += cpu_time() - poll;
            tokio::time::sleep(POLL).await;
        }
    }
}
