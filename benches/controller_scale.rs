//! Controller scale under the simulator: one gang operation of 1, 64, 1 024 and 10 000 jobs,
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
//! Then the CPU of one quiet pass (every job running, nothing to handle) of a gang of
//! [`PASS_JOBS`] jobs in its first incarnation and after 100 gang restarts: a finished incarnation must cost later
//! passes nothing (at most 1.2 × the first's).
//!
//! Run (release, simulator build): `env -u RUSTFLAGS cargo sim-bench --bench controller_scale`.
//! `LOCKSTEP_BENCH_JOBS=1,64` picks the sizes; `LOCKSTEP_BENCH_RESTARTS=0` skips the passes' part. Without `--bench` (as `cargo test --all-targets` runs every bench)
//! it runs the smallest size only, as a smoke test; in the normal build it only says how to run it.
//!
//! Two knobs for profiling: `LOCKSTEP_BENCH_PASS_LIST=1` prints the CPU of each operation pass of the
//! submit and of the restart; `LOCKSTEP_BENCH_CALLGRIND=restart` has callgrind count only the restart, without the
//! harness's own polls (run under `valgrind --tool=callgrind --collect-atstart=no`: the bench toggles collection with
//! callgrind's client request, a no-op outside valgrind); `LOCKSTEP_BENCH_CALLGRIND=quiet-first` (or `quiet-later`)
//! counts only the load and process of the quiet passes timed in incarnation 0 (or in incarnation
//! `LOCKSTEP_BENCH_RESTARTS`), so that instructions per pass, which a loaded machine does not move, compare the two
//! (with `LOCKSTEP_BENCH_JOBS=1`, the smallest restart, uncounted).

/// The allocator: mimalloc, as the `lockstep` binary uses (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: lockstep::alloc::Mimalloc = lockstep::alloc::Mimalloc;

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
        "| jobs | agents | submit → all running: simulated s | wall s | gang restart → all running: simulated s | wall s \
         | restart: passes | their load + process, CPU s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let pass_list = std::env::var("LOCKSTEP_BENCH_PASS_LIST").is_ok_and(|v| v == "1");
    let mut lists = Vec::new();
    for jobs in sizes {
        let m = scale::measure(jobs);
        lists.push((jobs, m.start.pass_list.clone(), m.restart.pass_list.clone()));
        println!(
            "| {jobs} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.3} |",
            m.agents,
            m.start.simulated.as_secs_f64(),
            m.start.wall.as_secs_f64(),
            m.restart.simulated.as_secs_f64(),
            m.restart.wall.as_secs_f64(),
            m.restart.passes,
            m.restart.pass_cpu.as_secs_f64()
        );
    }
    if pass_list {
        for (jobs, start, restart) in lists {
            println!();
            println!("controller_scale: the operation passes of {jobs} jobs, load + process CPU µs each");
            for (span, passes) in [("submit", start), ("restart", restart)] {
                let list: Vec<String> = passes.iter().map(|cpu| format!("{:.0}", cpu.as_secs_f64() * 1e6)).collect();
                println!("{span}: {} passes: {}", passes.len(), list.join(", "));
            }
        }
    }
    let restarts: u32 = match std::env::var("LOCKSTEP_BENCH_RESTARTS") {
        Ok(n) => n.trim().parse().expect("LOCKSTEP_BENCH_RESTARTS: a number"),
        Err(_) if bench => 100,
        Err(_) => 2,
    };
    if restarts > 0 {
        let (first, later) = scale::pass_cpu(PASS_JOBS, restarts);
        let median = |cpu: &[std::time::Duration]| {
            let mut cpu = cpu.to_vec();
            cpu.sort();
            cpu[cpu.len() / 2]
        };
        let (first_median, later_median) = (median(&first), median(&later));
        println!();
        println!("controller_scale: CPU of one quiet pass (load and process) of a gang of {PASS_JOBS} jobs, one agent");
        println!("| incarnation | passes | median CPU µs | min | max |");
        println!("|---:|---:|---:|---:|---:|");
        for (incarnation, cpu) in [(0, &first), (restarts, &later)] {
            println!(
                "| {incarnation} | {} | {:.0} | {:.0} | {:.0} |",
                cpu.len(),
                median(cpu).as_secs_f64() * 1e6,
                cpu.iter().min().expect("passes").as_secs_f64() * 1e6,
                cpu.iter().max().expect("passes").as_secs_f64() * 1e6
            );
        }
        println!(
            "after {restarts} finished incarnations / first: {:.2} (goal: at most 1.2)",
            later_median.as_secs_f64() / first_median.as_secs_f64()
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

/// Jobs of the gang whose quiet passes are timed before and after its restarts.
#[cfg(madsim)]
const PASS_JOBS: u32 = 64;

#[cfg(madsim)]
mod scale {
    use super::SLOTS;
    use lockstep::agent::{
        Agent, AgentConfig, Behaviour, JobScript, ProcessEventKind, ProcessLog, Rule, SimulatedExecutor,
    };
    use lockstep::gang::SpecFormat;
    use lockstep::gang::api;
    use lockstep::gang::controller::EVENT_JOB_STATE;
    use lockstep::gang::model::{JobStatus, OperationStatus};
    use lockstep::gang::pipeline::{OperationHandler, Pass, operation_pipeline_config};
    use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineManager, WorkError};
    use lockstep::store::{MemStore, Row, RowId, Store, Timestamp, TokioClock};
    use madsim::runtime::{Handle, Runtime};
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// When job cookie 0 of incarnation 0 fails, simulated time after it started: after every job runs.
    const FAIL_AFTER: Duration = Duration::from_secs(300);
    /// Every other job's run time (simulated): longer than the measurement.
    const RUN_TIME: Duration = Duration::from_secs(3_600);
    /// The harness's poll of the operation's jobs (simulated).
    const POLL: Duration = Duration::from_millis(100);

    /// One span: simulated and wall time, and the operation passes within it with the CPU of their load and
    /// process phases (part of the wall time), in all and each.
    #[derive(Clone, Debug, Default)]
    pub struct Span {
        pub simulated: Duration,
        pub wall: Duration,
        pub passes: usize,
        pub pass_cpu: Duration,
        pub pass_list: Vec<Duration>,
    }

    /// What one size measured.
    pub struct Measurement {
        pub agents: u32,
        pub start: Span,
        pub restart: Span,
    }

    /// CPU time of this thread so far (`CLOCK_THREAD_CPUTIME_ID`, nanoseconds, exact at the call).
    fn cpu_time() -> Duration {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // The system call, not libc's `clock_gettime`: madsim replaces that one and refuses this clock in a run.
        let rc = unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    /// Callgrind's collection of the restart (`LOCKSTEP_BENCH_CALLGRIND=restart`): on from the restart's start to its
    /// end, off during the harness's own polls.
    struct Collect {
        enabled: bool,
        on: bool,
    }

    impl Collect {
        fn from_env() -> Collect {
            let enabled = std::env::var("LOCKSTEP_BENCH_CALLGRIND").is_ok_and(|v| v == "restart");
            Collect { enabled, on: false }
        }

        /// Never collects (the submit's span).
        fn off() -> Collect {
            Collect { enabled: false, on: false }
        }

        /// Collects from now (`true`) or stops (`false`); nothing if the knob is unset or it already does.
        fn set(&mut self, on: bool) {
            if self.enabled && self.on != on {
                toggle_collect();
                self.on = on;
            }
        }
    }

    /// Callgrind's `CALLGRIND_TOGGLE_COLLECT` client request (valgrind's `callgrind.h`, amd64): the instruction
    /// sequence valgrind recognises, which does nothing on a real CPU (four rotations of `rdi` by 128 bits in all,
    /// and an exchange of `rbx` with itself). Elsewhere a no-op.
    fn toggle_collect() {
        #[cfg(target_arch = "x86_64")]
        {
            /// `VG_USERREQ_TOOL_BASE('C', 'T') + 2`.
            const TOGGLE_COLLECT: u64 = ((b'C' as u64) << 24 | (b'T' as u64) << 16) + 2;
            let args: [u64; 6] = [TOGGLE_COLLECT, 0, 0, 0, 0, 0];
            let mut result: u64 = 0;
            // SAFETY: the sequence leaves every register as it found it but `rdx` (the request's result, declared)
            // and reads `args`, which lives across the call.
            unsafe {
                std::arch::asm!(
                    "rol rdi, 3", "rol rdi, 13", "rol rdi, 61", "rol rdi, 51",
                    "xchg rbx, rbx",
                    inout("rdx") result,
                    in("rax") args.as_ptr(),
                    options(nostack),
                );
            }
            let _ = result;
        }
    }

    /// Runs the world for a gang of `jobs` jobs; panics if it does not reach every phase (the bench is wrong).
    pub fn measure(jobs: u32) -> Measurement {
        let agents = jobs.div_ceil(SLOTS).max(1);
        // The simulator's runs allocate from one malloc arena (`sim::share_one_malloc_arena`); so does this one.
        lockstep::sim::share_one_malloc_arena();
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
        let passes: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let (replica_store, replica_passes) = (store.clone(), passes.clone());
        let _replica = handle
            .create_node()
            .name("replica-0")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
            .init(move || {
                let (store, passes) = (replica_store.clone(), replica_passes.clone());
                async move {
                    let mut manager = PipelineManager::new(Arc::new(store), ManagerOptions { seed: 1 });
                    let handler = Timed::new(passes, Arc::default());
                    manager.register(operation_pipeline_config(), handler).expect("valid config");
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
        let passes_since = |from: usize| {
            let passes = passes.lock().expect("not poisoned");
            (passes.len() - from, passes[from..].iter().sum::<Duration>(), passes[from..].to_vec())
        };
        let (submitted, wall) = (Store::now(&store).await.expect("MemStore's clock"), cpu_time());
        let from = passes.lock().expect("not poisoned").len();
        let op = api::submit_text(&store, &spec, SpecFormat::Yson).await.expect("a valid spec");
        let (running, polling) = all_running(&store, op, 0, jobs, &mut Collect::off()).await;
        let (count, pass_cpu, pass_list) = passes_since(from);
        let start = Span {
            simulated: micros(running.as_micros() - submitted.as_micros()),
            wall: cpu_time() - wall - polling,
            passes: count,
            pass_cpu,
            pass_list,
        };

        // The gang restart, timed from the failing process's exit (the process log's time) to every job of
        // incarnation 1 running. The wall clock starts `LEAD` before that exit: the process exits `FAIL_AFTER`
        // after it started, and the restart can end within the simulated instant of the exit (no network), so a
        // harness that waited to see the exit would miss the passes it times.
        const LEAD: Duration = Duration::from_millis(1);
        let view = api::status(&store, op).await.expect("the operation exists");
        let failing = view
            .jobs
            .iter()
            .find(|j| j.data.incarnation == 0 && j.data.task == "worker" && j.data.job_cookie == 0)
            .expect("job cookie 0 of incarnation 0")
            .data
            .id;
        let started = log
            .events()
            .into_iter()
            .find(|e| e.job == failing && e.kind == ProcessEventKind::Started)
            .expect("the failing job's process started")
            .at;
        tokio::time::sleep_until(started + FAIL_AFTER - LEAD).await;
        let mut collect = Collect::from_env();
        let (wall, from) = (cpu_time(), passes.lock().expect("not poisoned").len());
        let mut polling = Duration::ZERO;
        let exited = loop {
            let poll = cpu_time();
            let exit = log.events().into_iter().find(|e| matches!(e.kind, ProcessEventKind::Exited(code) if code != 0));
            polling += cpu_time() - poll;
            collect.set(true);
            if let Some(exit) = exit {
                // The process log keeps runtime instants; the store keeps store time: the same clock here.
                let ago = exit.at.elapsed();
                break Store::now(&store).await.expect("MemStore's clock").minus(ago);
            }
            tokio::time::sleep(LEAD).await;
            collect.set(false);
        };
        collect.set(false);
        let (running, polling_running) = all_running(&store, op, 1, jobs, &mut collect).await;
        collect.set(false);
        let (count, pass_cpu, pass_list) = passes_since(from);
        let view = api::status(&store, op).await.expect("the operation exists");
        assert_eq!(view.status, OperationStatus::Running, "the operation ended instead of restarting its gang");
        let restart = Span {
            simulated: micros(running.as_micros() - exited.as_micros()),
            wall: cpu_time() - wall - polling - polling_running,
            passes: count,
            pass_cpu,
            pass_list,
        };
        drop(nodes);
        (start, restart)
    }

    fn micros(micros: i64) -> Duration {
        Duration::from_micros(u64::try_from(micros).expect("a span does not end before it starts"))
    }

    /// Waits until `jobs` jobs of `incarnation` run; returns when the last of them started running (store time of
    /// its `job_state_changed` event, so the harness's poll interval does not round it), and the CPU time the
    /// harness's own reads took (not the controller's: the caller subtracts it). `collect` is off during those reads
    /// and on between them.
    async fn all_running(
        store: &MemStore,
        op: RowId,
        incarnation: u32,
        jobs: u32,
        collect: &mut Collect,
    ) -> (Timestamp, Duration) {
        let mut polling = Duration::ZERO;
        loop {
            collect.set(false);
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
            collect.set(true);
            tokio::time::sleep(POLL).await;
        }
    }

    /// The operation handler, timing the CPU of each pass's load and process (the apply runs on the engine's
    /// batcher and is not counted). With the store in process, neither phase yields, so no other task's work is in
    /// the span.
    struct Timed {
        inner: OperationHandler,
        passes: Arc<Mutex<Vec<Duration>>>,
        /// While set, callgrind counts each pass's load and process (and nothing between them).
        collect: Arc<AtomicBool>,
    }

    impl Timed {
        fn new(passes: Arc<Mutex<Vec<Duration>>>, collect: Arc<AtomicBool>) -> Timed {
            Timed { inner: OperationHandler::default(), passes, collect }
        }

        /// Callgrind counts from here to [`Timed::uncounted`] if the window is on (a no-op outside valgrind).
        fn counted(&self) -> bool {
            let on = self.collect.load(Ordering::SeqCst);
            if on {
                toggle_collect();
            }
            on
        }

        fn uncounted(on: bool) {
            if on {
                toggle_collect();
            }
        }
    }

    impl<S: Store> Handler<S> for Timed {
        type Context = (Pass, Duration);

        async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<(Pass, Duration), WorkError> {
            let counted = self.counted();
            let start = cpu_time();
            let pass = self.inner.load(row, cx).await;
            let cpu = cpu_time() - start;
            Timed::uncounted(counted);
            Ok((pass?, cpu))
        }

        async fn process(&self, row: Row, (pass, load): (Pass, Duration)) -> Result<Changes, WorkError> {
            let counted = self.counted();
            let start = cpu_time();
            let changes = Handler::<S>::process(&self.inner, row, pass).await;
            let cpu = cpu_time() - start;
            Timed::uncounted(counted);
            self.passes.lock().expect("not poisoned").push(load + cpu);
            changes
        }
    }

    /// The CPU of each quiet pass (every job running, nothing to handle) over ten minutes of a gang of `jobs` jobs
    /// on one agent: in incarnation 0, and in incarnation `restarts` after that many gang restarts (job cookie 0
    /// fails in every incarnation before it).
    pub fn pass_cpu(jobs: u32, restarts: u32) -> (Vec<Duration>, Vec<Duration>) {
        // The simulator's runs allocate from one malloc arena (`sim::share_one_malloc_arena`); so does this one.
        lockstep::sim::share_one_malloc_arena();
        std::thread::spawn(move || {
            let mut runtime = Runtime::with_seed_and_config(1, madsim::Config::default());
            runtime.set_time_limit(Duration::from_secs(24 * 3_600));
            runtime.block_on(quiet_passes(jobs, restarts))
        })
        .join()
        .expect("the run reaches incarnation `restarts`")
    }

    async fn quiet_passes(jobs: u32, restarts: u32) -> (Vec<Duration>, Vec<Duration>) {
        /// How long passes are timed while nothing happens: 120 `min_processing_interval`s (5 s). A quiet pass takes
        /// tens of µs, so the medians of a minute's 6 or 7 passes moved by 2 × between runs on a shared machine.
        const QUIET: Duration = Duration::from_secs(600);
        let handle = Handle::current();
        let store = MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000)));
        let passes: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let rules = (0..restarts)
            .map(|attempt| Rule {
                task: Some("worker".into()),
                job_cookie: Some(0),
                attempt: Some(attempt),
                // Incarnation 0's failure waits for its quiet window; the others come fast.
                behaviour: Behaviour::exit_after(Duration::from_secs(if attempt == 0 { 1_200 } else { 5 }), 1),
            })
            .collect();
        let script = JobScript { seed: 1, default: Behaviour::exit_after(Duration::from_secs(1_000_000), 0), rules };
        let executor = SimulatedExecutor::new(script, ProcessLog::default());
        // `LOCKSTEP_BENCH_CALLGRIND=quiet-first` or `quiet-later`: callgrind counts that window's passes only.
        let counted_window = match std::env::var("LOCKSTEP_BENCH_CALLGRIND").as_deref() {
            Ok("quiet-first") => Some(0),
            Ok("quiet-later") => Some(restarts),
            _ => None,
        };
        let collect: Arc<AtomicBool> = Arc::default();
        let (replica_store, replica_passes, replica_collect) = (store.clone(), passes.clone(), collect.clone());
        let _replica = handle
            .create_node()
            .name("replica-0")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
            .init(move || {
                let (store, passes, collect) = (replica_store.clone(), replica_passes.clone(), replica_collect.clone());
                async move {
                    let mut manager = PipelineManager::new(Arc::new(store), ManagerOptions { seed: 1 });
                    let handler = Timed::new(passes, collect);
                    manager.register(operation_pipeline_config(), handler).expect("valid config");
                    manager.start();
                    std::future::pending::<()>().await;
                }
            })
            .build();
        let agent_store = store.clone();
        let _agent = handle
            .create_node()
            .name("agent-0")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 2, 1)))
            .init(move || {
                Agent::new(Arc::new(agent_store.clone()), executor.clone(), AgentConfig::new("agent-0", jobs)).run()
            })
            .build();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let spec = format!(
            "{{tasks={{worker={{job_count={jobs};command=w;gang_options={{}}}}}};max_failed_job_count={}}}",
            restarts + 1
        );
        let op = api::submit_text(&store, &spec, SpecFormat::Yson).await.expect("a valid spec");
        let mut timed = Vec::new();
        for incarnation in [0, restarts] {
            loop {
                let view = api::status(&store, op).await.expect("the operation exists");
                assert!(!view.status.is_terminal(), "operation {op} ended: {:?}", view.data.result);
                let running = view
                    .jobs
                    .iter()
                    .filter(|j| j.data.incarnation == incarnation && j.status == JobStatus::Running)
                    .count();
                if view.data.incarnation == incarnation && running == jobs as usize {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let from = passes.lock().expect("not poisoned").len();
            let counted = counted_window == Some(incarnation);
            collect.store(counted, Ordering::SeqCst);
            tokio::time::sleep(QUIET).await;
            collect.store(false, Ordering::SeqCst);
            timed.push(passes.lock().expect("not poisoned")[from..].to_vec());
        }
        let later = timed.pop().expect("two windows");
        (timed.pop().expect("two windows"), later)
    }
}
