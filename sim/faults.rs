//! Fault injection (DESIGN §5): every fault exists as a fixed event (at time T) and as a random process with a
//! rate, and each random process draws from its own ChaCha stream keyed by the run's seed, its kind and its index
//! among processes of that kind, so adding a fault never reshuffles the workload or another fault.
//!
//! A fault acts through the world's handles (`World`, simulator build), which trace it, hold it for its span and undo it. Two
//! faults that would fight over one thing (a replica killed while paused, two network profiles) do not overlap:
//! the later one is traced as `skipped`. At the end of the fault window the runner aborts every fault in progress
//! and the world heals whatever they left behind.

use super::rng;
#[cfg(madsim)]
use super::world::World;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::ops::Range;
#[cfg(madsim)]
use std::sync::{Arc, Mutex};
use std::time::Duration;
#[cfg(madsim)]
use tokio::task::JoinHandle;

/// A node a network fault can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// The database node.
    Db,
    /// The workload client.
    Client,
    /// Replica `i`.
    Replica(usize),
    /// Agent `i` (node `agent-{i}`).
    Agent(usize),
}

/// One fault, with its target and its span. Every `Duration` in it is simulated time in the simulator and wall
/// time in `lockstep chaos run`, which injects the same faults on real processes ([`schedule`]). Replica and agent
/// indices count from 0 (nodes `replica-{i}` and `agent-{i}`) and are below the scenario's counts.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Kill a replica (every task dies, its leases are left to expire) and start it again through its init
    /// function after `down`.
    Kill {
        /// The replica killed.
        replica: usize,
        /// How long it stays down before its init function starts it again.
        down: Duration,
    },
    /// Pause a replica for `span`: its tasks stop while time goes on, so its leases expire and its later writes
    /// carry stale tokens.
    Pause {
        /// The replica paused.
        replica: usize,
        /// How long its tasks stay stopped (with `[faults] pause_inside_pass`, from when the pause lands).
        span: Duration,
    },
    /// Cut the link between two nodes, both ways, for `span`.
    Partition {
        /// One end of the cut link.
        a: Target,
        /// The other end.
        b: Target,
        /// How long the link stays cut; then packets cross it again.
        span: Duration,
    },
    /// Cut every link of a node for `span`.
    Isolate {
        /// The node cut off from every other node.
        node: Target,
        /// How long its links stay cut.
        span: Duration,
    },
    /// Every link gets latencies in `latency` and loses `loss` of its packets for `span`.
    Degrade {
        /// The range each packet's latency is drawn from, uniformly (start < end); the scenario's `net_latency`
        /// comes back at the end.
        latency: Range<Duration>,
        /// The share of packets lost, 0 to 1 (a random process draws it below 0.15).
        loss: f64,
        /// How long the links stay degraded.
        span: Duration,
    },
    /// The database drops each reply after its call committed with `chance`, for `span` (outcome unknown).
    LostReplies {
        /// The chance, 0 to 1, that a committed call's reply is dropped (a random process draws 0.05 to 0.4).
        chance: f64,
        /// How long replies are dropped.
        span: Duration,
    },
    /// Kill the database node (calls in flight fail; committed data stays) and start it after `down`.
    DbRestart {
        /// How long the database node stays down before it starts again with the committed rows.
        down: Duration,
    },
    /// A replica's monotonic clock runs at `rate_ppm` parts per million of real time for `span`.
    ClockDrift {
        /// The replica whose clock drifts.
        replica: usize,
        /// Its clock's rate in parts per million of the world's clock: 1 000 000 is exact, scenario files take
        /// 500 000 to 2 000 000 (a random process draws 750 000 to 950 000 or 1 050 000 to 1 300 000).
        rate_ppm: u64,
        /// How long (on the world's clock) the clock runs at that rate.
        span: Duration,
    },
    /// The client inserts `claims` claims on resource 0 at once: a burst of lock contention on one row.
    Contention {
        /// How many claims go in at once: 1 to 1 000 in scenario files (a second of claims at the highest
        /// rate), 5 to 24 from a random process.
        claims: usize,
    },
    /// madsim's `buggify` is on for `span`: the engine's buggify points fire, and madsim delays some packets.
    Buggify {
        /// How long buggify stays on.
        span: Duration,
    },
    /// Kill an agent node (its processes die with it: the process log records their kill) and start it again
    /// through its init function after `down`; the restarted agent takes a new node lease (a new session).
    AgentKill {
        /// The agent killed.
        agent: usize,
        /// How long it stays down before it starts again.
        down: Duration,
    },
    /// Pause an agent node for `span` (its processes pause with it): its node lease expires while it sleeps, and
    /// on waking it finds its local deadline passed and fences itself.
    AgentPause {
        /// The agent paused.
        agent: usize,
        /// How long it and its processes stay stopped.
        span: Duration,
    },
    /// An agent's monotonic clock runs at `rate_ppm` parts per million of real time for `span`: its node lease's
    /// local deadline, heartbeat trigger and polls stretch or shrink. Within the margin rule of DESIGN §2
    /// (rate ≥ 1 − lease_margin / lease_ttl) it still fences before the store lets the node be declared lost; a
    /// scenario refuses a slower fixed rate unless `[mutation] agent_drift_beyond_margin` plants that bug.
    AgentClockDrift {
        /// The agent whose clock drifts.
        agent: usize,
        /// Its clock's rate in parts per million of the world's clock: 1 000 000 is exact, scenario files take
        /// 500 000 to 2 000 000, at least the margin rule's floor
        /// ([`GangWorkload::agent_rate_min_ppm`](crate::sim::gang::GangWorkload::agent_rate_min_ppm)).
        rate_ppm: u64,
        /// How long (on the world's clock) the clock runs at that rate.
        span: Duration,
    },
    /// An agent's monotonic clock runs slower than the margin rule of DESIGN §2 allows (rate below
    /// 1 − lease_margin / lease_ttl) for `span`: the one promise the system cannot keep then is rank exclusivity.
    /// While the agent renews its node lease nothing goes wrong (each renewal resets the store's expiry); once it
    /// loses contact (a partition, a pause, failing heartbeats), its lease's local deadline comes after the store's
    /// expiry, the controller declares the node lost and starts its ranks elsewhere while its processes still
    /// run, and checker `rank_exclusivity` names the two processes of one rank (allocation exclusivity still
    /// holds: each runs on its own node). A known violation: the swarm draws it only when asked (docs/gang.md,
    /// "Beyond the margin rule").
    AgentClockBeyondMargin {
        /// The agent whose clock runs slow.
        agent: usize,
        /// Its clock's rate in parts per million of the world's clock, below the margin rule's floor
        /// ([`GangWorkload::agent_rate_min_ppm`](crate::sim::gang::GangWorkload::agent_rate_min_ppm)) and at least
        /// 500 000 (a random process draws from 1 % below the floor down to 500 000).
        rate_ppm: u64,
        /// How long (on the world's clock) the clock runs at that rate.
        span: Duration,
    },
    /// One kind of an agent's store calls fails at once or is delayed for `span`, its other calls going through
    /// (`sim::agent_calls`): e.g. an agent that renews its node lease but cannot list its allocations.
    AgentCalls {
        /// The agent whose calls are reached; the fault outlives a restart of the agent.
        agent: usize,
        /// Which kind of its calls.
        calls: AgentCall,
        /// What happens to each of them.
        effect: CallEffect,
        /// How long the fault lasts.
        span: Duration,
    },
    /// The hint channel to a replica dies silently for `span`: the database drops every fetch hint it would send
    /// it, with no error and no notice, so the replica's fetchers find new rows only by polling. At the end the
    /// replica's subscription is found dead (PgStore's periodic `LISTEN` probe finds a half-open session) and ends:
    /// the renewal that subscribes anew catches up on every kind.
    HintLoss {
        /// The replica that stops receiving hints.
        replica: usize,
        /// How long its hints are dropped.
        span: Duration,
    },
    /// A replica's monotonic clock jumps by `by` at once, forwards or (with `back`) backwards, and runs on from
    /// there at its rate (a virtual machine's clock stepped after a migration; under libfaketime, an offset that
    /// changes). Forwards, the replica finds its leases' local deadlines nearer and gives items up early;
    /// backwards, it trusts its leases for `by` longer than the store does, and its late writes are refused by
    /// the guarded apply (their tokens are stale once another replica took the rows).
    ClockJump {
        /// The replica whose clock jumps.
        replica: usize,
        /// How far it jumps: scenario files take up to 10 minutes.
        by: Duration,
        /// Whether it jumps backwards.
        back: bool,
    },
    /// Every row handler's `process` that starts on a replica for `span` never returns (a call to a service
    /// that lost its reply with no time-out, a deadlock on an async lock): the engine's `handler_timeout` cuts it,
    /// fails its item (recorded, retried under its pipeline's policy) and stops renewing its lease. Calls that
    /// hung stay hung after the span, until their bound cuts them.
    HandlerHang {
        /// The replica whose handlers hang.
        replica: usize,
        /// How long a handler that starts there hangs.
        span: Duration,
    },
    /// A node's store calls get no reply for `span`, as on a connection gone half-open (a NAT, firewall or
    /// proxy forgot the flow, with no FIN or RST): a request sent during the span is lost on its way and never
    /// reaches the database, and a reply that would reach the node during the span is lost after the database
    /// ran the call (the request went out before the span began). Either way the caller hears nothing and ends
    /// the call through the store's bound (the scenario's `call_timeout`, `PgOptions::call_timeout` in
    /// production) with `StoreError::Timeout`, so a call that started during the span stays hung until its bound
    /// even when the span is over. A replica's hint subscription is not reached (`hint-loss` is that fault). An
    /// agent whose calls hang must fence itself at its node lease's local deadline, its calls still hanging.
    StoreHang {
        /// The node whose store calls hang: [`Target::Replica`] or [`Target::Agent`].
        node: Target,
        /// How long its requests and replies are lost.
        span: Duration,
    },
    /// A replica crashes again each time it starts, for `span` (a process that dies at start under a supervisor
    /// that restarts it): it runs for 0.05 to 0.5 s, dies, and is started again 0.5 to 2 s later; at the end it is
    /// started and left to run.
    CrashLoop {
        /// The replica that keeps crashing.
        replica: usize,
        /// How long it keeps crashing at start.
        span: Duration,
    },
}

/// One kind of an agent's store calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentCall {
    /// Its reports: inserts of inbox rows (job started, job ended), `Store::insert_many` and `Store::insert`.
    Reports,
    /// Its listings of its node's allocation rows (`Store::list` of kind `allocation`).
    Allocations,
    /// Its node lease's heartbeats (`Store::heartbeat`).
    Heartbeats,
}

impl AgentCall {
    /// Every kind, in the order random faults draw them.
    pub const ALL: [AgentCall; 3] = [AgentCall::Reports, AgentCall::Allocations, AgentCall::Heartbeats];

    /// The kind's name in scenario files and traces: `reports`, `allocations`, `heartbeats`.
    pub fn name(self) -> &'static str {
        match self {
            AgentCall::Reports => "reports",
            AgentCall::Allocations => "allocations",
            AgentCall::Heartbeats => "heartbeats",
        }
    }

    /// The kind named `name` ([`AgentCall::name`]).
    pub fn parse(name: &str) -> Option<AgentCall> {
        AgentCall::ALL.into_iter().find(|call| call.name() == name)
    }
}

/// What a fault does to the calls it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEffect {
    /// Each call fails at once with `StoreError::Unavailable`, nothing done.
    Fail,
    /// Each call waits this long (simulated time) before it is made.
    Delay(Duration),
}

/// A fault at a fixed time after the world starts.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultEvent {
    /// Simulated time since the world was built.
    pub at: Duration,
    /// The fault.
    pub fault: Fault,
}

/// The kinds of faults a random process can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// [`Fault::Kill`] of a random replica, down for a span drawn from the process's `span`.
    Kill,
    /// [`Fault::Pause`] of a random replica.
    Pause,
    /// [`Fault::Partition`] between a random replica and the database.
    Partition,
    /// [`Fault::Isolate`] of a random replica.
    Isolate,
    /// [`Fault::Degrade`] of every link: latencies from 1 ms up to a bound drawn from 20 to 300 ms, loss below
    /// 0.15.
    Degrade,
    /// [`Fault::LostReplies`] with a chance drawn from 0.05 to 0.4.
    LostReplies,
    /// [`Fault::DbRestart`], down for a span drawn from the process's `span`.
    DbRestart,
    /// [`Fault::ClockDrift`] of a random replica, slow (0.75 to 0.95) or fast (1.05 to 1.3) half the time each.
    ClockDrift,
    /// [`Fault::Contention`] of 5 to 24 claims (takes no span).
    Contention,
    /// [`Fault::Buggify`].
    Buggify,
    /// [`Fault::AgentKill`] of a random agent.
    AgentKill,
    /// [`Fault::AgentPause`] of a random agent.
    AgentPause,
    /// [`Fault::Partition`] between a random agent and the database (it must self-fence).
    AgentPartition,
    /// [`Fault::Isolate`] of a random agent.
    AgentIsolate,
    /// [`Fault::AgentClockDrift`] of a random agent, at a rate within the margin rule.
    AgentClockDrift,
    /// [`Fault::AgentCalls`] of a random agent: a kind of call drawn uniformly, failing (half the time) or delayed
    /// by 1 to 5 s.
    AgentCalls,
    /// [`Fault::HintLoss`] of a random replica.
    HintLoss,
    /// [`Fault::CrashLoop`] of a random replica.
    CrashLoop,
    /// [`Fault::ClockJump`] of a random replica by a span drawn from the process's `span`, backwards half the
    /// time.
    ClockJump,
    /// [`Fault::HandlerHang`] of a random replica.
    HandlerHang,
    /// [`Fault::StoreHang`] of a random replica.
    StoreHang,
    /// [`Fault::AgentClockBeyondMargin`] of a random agent. Off unless named ([`FaultKind::off_by_default`]).
    AgentClockBeyondMargin,
    /// [`Fault::StoreHang`] of a random agent.
    AgentStoreHang,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 23] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Partition,
        FaultKind::Isolate,
        FaultKind::Degrade,
        FaultKind::LostReplies,
        FaultKind::DbRestart,
        FaultKind::ClockDrift,
        FaultKind::Contention,
        FaultKind::Buggify,
        FaultKind::AgentKill,
        FaultKind::AgentPause,
        FaultKind::AgentPartition,
        FaultKind::AgentIsolate,
        FaultKind::AgentClockDrift,
        FaultKind::AgentCalls,
        FaultKind::HintLoss,
        FaultKind::CrashLoop,
        FaultKind::ClockJump,
        FaultKind::HandlerHang,
        FaultKind::StoreHang,
        FaultKind::AgentClockBeyondMargin,
        FaultKind::AgentStoreHang,
    ];

    /// Whether the kind's faults target agent nodes (a world without agents runs no such process).
    pub fn targets_agents(self) -> bool {
        matches!(
            self,
            FaultKind::AgentKill
                | FaultKind::AgentPause
                | FaultKind::AgentPartition
                | FaultKind::AgentIsolate
                | FaultKind::AgentClockDrift
                | FaultKind::AgentCalls
                | FaultKind::AgentClockBeyondMargin
                | FaultKind::AgentStoreHang
        )
    }

    /// Whether the kind breaks a promise the system keeps only within its rules, so that the checkers are expected
    /// to fire in some worlds that run it (`agent-clock-beyond-margin`: rank exclusivity). The swarm draws such a
    /// kind only when its ranges or `--kinds` name it, never by default.
    pub fn off_by_default(self) -> bool {
        matches!(self, FaultKind::AgentClockBeyondMargin)
    }

    /// The kind named `name` ([`FaultKind::name`]), if any.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The kind's name in stream keys and traces.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Partition => "partition",
            FaultKind::Isolate => "isolate",
            FaultKind::Degrade => "degrade",
            FaultKind::LostReplies => "lost-replies",
            FaultKind::DbRestart => "db-restart",
            FaultKind::ClockDrift => "clock-drift",
            FaultKind::Contention => "contention",
            FaultKind::Buggify => "buggify",
            FaultKind::AgentKill => "agent-kill",
            FaultKind::AgentPause => "agent-pause",
            FaultKind::AgentPartition => "agent-partition",
            FaultKind::AgentIsolate => "agent-isolate",
            FaultKind::AgentClockDrift => "agent-clock-drift",
            FaultKind::AgentCalls => "agent-calls",
            FaultKind::HintLoss => "hint-loss",
            FaultKind::CrashLoop => "crash-loop",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::HandlerHang => "handler-hang",
            FaultKind::StoreHang => "store-hang",
            FaultKind::AgentClockBeyondMargin => "agent-clock-beyond-margin",
            FaultKind::AgentStoreHang => "agent-store-hang",
        }
    }
}

impl std::fmt::Display for Target {
    /// The node's name in scenario files and traces: `db`, `client`, `replica-N`, `agent-N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Db => f.write_str("db"),
            Target::Client => f.write_str("client"),
            Target::Replica(index) => write!(f, "replica-{index}"),
            Target::Agent(index) => write!(f, "agent-{index}"),
        }
    }
}

impl std::fmt::Display for Fault {
    /// The fault in a scenario file's words: its kind, its node and its span (durations as people read them),
    /// e.g. `lost-replies (chance 0.077, span 15.309s)` or `isolate replica-2 (span 4s)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = |span: &Duration| crate::duration::format(*span);
        match self {
            Fault::Kill { replica, down } => write!(f, "kill replica-{replica} (down {})", d(down)),
            Fault::Pause { replica, span } => write!(f, "pause replica-{replica} (span {})", d(span)),
            Fault::Partition { a, b, span } => write!(f, "partition {a} from {b} (span {})", d(span)),
            Fault::Isolate { node, span } => write!(f, "isolate {node} (span {})", d(span)),
            Fault::Degrade { latency, loss, span } => write!(
                f,
                "degrade (latency {}..{}, loss {loss:.3}, span {})",
                d(&latency.start),
                d(&latency.end),
                d(span)
            ),
            Fault::LostReplies { chance, span } => write!(f, "lost-replies (chance {chance:.3}, span {})", d(span)),
            Fault::DbRestart { down } => write!(f, "db-restart (down {})", d(down)),
            Fault::ClockDrift { replica, rate_ppm, span } => {
                write!(f, "clock-drift replica-{replica} (rate {rate_ppm} ppm, span {})", d(span))
            }
            Fault::Contention { claims } => write!(f, "contention ({claims} claims)"),
            Fault::Buggify { span } => write!(f, "buggify (span {})", d(span)),
            Fault::AgentKill { agent, down } => write!(f, "agent-kill agent-{agent} (down {})", d(down)),
            Fault::AgentPause { agent, span } => write!(f, "agent-pause agent-{agent} (span {})", d(span)),
            Fault::AgentClockDrift { agent, rate_ppm, span } => {
                write!(f, "agent-clock-drift agent-{agent} (rate {rate_ppm} ppm, span {})", d(span))
            }
            Fault::AgentClockBeyondMargin { agent, rate_ppm, span } => {
                write!(f, "agent-clock-beyond-margin agent-{agent} (rate {rate_ppm} ppm, span {})", d(span))
            }
            Fault::HintLoss { replica, span } => write!(f, "hint-loss replica-{replica} (span {})", d(span)),
            Fault::CrashLoop { replica, span } => write!(f, "crash-loop replica-{replica} (span {})", d(span)),
            Fault::HandlerHang { replica, span } => write!(f, "handler-hang replica-{replica} (span {})", d(span)),
            Fault::StoreHang { node, span } => write!(f, "store-hang {node} (span {})", d(span)),
            Fault::ClockJump { replica, by, back } => {
                write!(f, "clock-jump replica-{replica} (by {}{})", if *back { "-" } else { "" }, d(by))
            }
            Fault::AgentCalls { agent, calls, effect, span } => {
                let calls = calls.name();
                match effect {
                    CallEffect::Fail => write!(f, "agent-calls agent-{agent} ({calls} fail, span {})", d(span)),
                    CallEffect::Delay(delay) => {
                        write!(f, "agent-calls agent-{agent} ({calls} delayed {}, span {})", d(delay), d(span))
                    }
                }
            }
        }
    }
}

/// A random process injecting faults of one kind.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomFault {
    /// What it injects.
    pub kind: FaultKind,
    /// Mean faults per simulated minute (a Poisson process).
    pub per_minute: f64,
    /// Each fault's span (or down time), uniform. Ignored by [`FaultKind::Contention`].
    pub span: Range<Duration>,
}

/// A scenario's faults.
#[derive(Clone, Default, PartialEq)]
pub struct FaultPlan {
    /// Faults at fixed times.
    pub fixed: Vec<FaultEvent>,
    /// Random processes.
    pub random: Vec<RandomFault>,
    /// End of the fault window: no fault starts later, and the world heals here (or when the workload ends).
    pub until: Duration,
    /// `[faults] pause_inside_pass`: each `pause` of a replica (fixed or random) waits, at most this long past
    /// its time (simulated time; wall time in `lockstep chaos run`), until the replica works inside a pass
    /// (`MemStore::lease_in_pass`; `PgStore::lease_in_pass` on real processes) while another replica runs to
    /// take its rows over, then pauses it; past the bound the pause is skipped (`skipped pause: not inside a
    /// pass …`). `None`: a pause lands at its time, wherever the replica is (between two passes, it makes nothing
    /// stale).
    pub pause_inside_pass: Option<Duration>,
}

/// Written by hand so that a plan without `pause_inside_pass` prints as it did before the field existed: the
/// scenario's content hash ([`crate::sim::ScenarioFile::content_hash`]) is taken over this text, and replay
/// files of older runs carry it.
impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut plan = f.debug_struct("FaultPlan");
        plan.field("fixed", &self.fixed).field("random", &self.random).field("until", &self.until);
        if let Some(bound) = &self.pause_inside_pass {
            plan.field("pause_inside_pass", bound);
        }
        plan.finish()
    }
}

/// What [`draw`] needs of the world besides the stream.
#[derive(Clone, Copy, Debug)]
struct Targets {
    replicas: usize,
    agents: usize,
    /// The slowest agent clock rate the margin rule allows ([`crate::sim::gang::GangWorkload::agent_rate_min_ppm`]).
    agent_rate_min_ppm: u64,
}

/// Draws the parameters of one fault of `kind` (targets, rates, spans) from the process's stream. Agent kinds
/// draw their agent after the replica every kind draws, so the draws of the older kinds stay as they were.
fn draw(kind: FaultKind, span: &Range<Duration>, targets: Targets, rng: &mut ChaCha8Rng) -> Fault {
    let Targets { replicas, agents, agent_rate_min_ppm } = targets;
    let span = if span.is_empty() {
        span.start
    } else {
        Duration::from_millis(rng.random_range(span.start.as_millis() as u64..span.end.as_millis() as u64))
    };
    let replica = rng.random_range(0..replicas);
    match kind {
        FaultKind::Kill => Fault::Kill { replica, down: span },
        FaultKind::Pause => Fault::Pause { replica, span },
        FaultKind::Partition => Fault::Partition { a: Target::Replica(replica), b: Target::Db, span },
        FaultKind::Isolate => Fault::Isolate { node: Target::Replica(replica), span },
        FaultKind::Degrade => {
            let latency_max = Duration::from_millis(rng.random_range(20..300));
            let loss = rng.random_range(0.0..0.15);
            Fault::Degrade { latency: Duration::from_millis(1)..latency_max, loss, span }
        }
        FaultKind::LostReplies => Fault::LostReplies { chance: rng.random_range(0.05..0.4), span },
        FaultKind::DbRestart => Fault::DbRestart { down: span },
        FaultKind::ClockDrift => {
            let slow = rng.random_bool(0.5);
            let rate_ppm =
                if slow { rng.random_range(750_000..950_000) } else { rng.random_range(1_050_000..1_300_000) };
            Fault::ClockDrift { replica, rate_ppm, span }
        }
        FaultKind::Contention => Fault::Contention { claims: rng.random_range(5..25) },
        FaultKind::Buggify => Fault::Buggify { span },
        FaultKind::AgentKill => Fault::AgentKill { agent: rng.random_range(0..agents), down: span },
        FaultKind::AgentPause => Fault::AgentPause { agent: rng.random_range(0..agents), span },
        FaultKind::AgentPartition => {
            Fault::Partition { a: Target::Agent(rng.random_range(0..agents)), b: Target::Db, span }
        }
        FaultKind::AgentIsolate => Fault::Isolate { node: Target::Agent(rng.random_range(0..agents)), span },
        FaultKind::AgentClockDrift => {
            let agent = rng.random_range(0..agents);
            // A slow clock at least 1% inside the margin rule (never below 0.5, the clock's floor), else fast.
            let slow_from = (agent_rate_min_ppm + 10_000).max(500_000);
            let slow = slow_from < 950_000 && rng.random_bool(0.5);
            let rate_ppm =
                if slow { rng.random_range(slow_from..950_000) } else { rng.random_range(1_050_000..1_300_000) };
            Fault::AgentClockDrift { agent, rate_ppm, span }
        }
        FaultKind::HintLoss => Fault::HintLoss { replica, span },
        FaultKind::CrashLoop => Fault::CrashLoop { replica, span },
        FaultKind::ClockJump => Fault::ClockJump { replica, by: span, back: rng.random_bool(0.5) },
        FaultKind::HandlerHang => Fault::HandlerHang { replica, span },
        FaultKind::StoreHang => Fault::StoreHang { node: Target::Replica(replica), span },
        FaultKind::AgentStoreHang => Fault::StoreHang { node: Target::Agent(rng.random_range(0..agents)), span },
        FaultKind::AgentClockBeyondMargin => {
            let agent = rng.random_range(0..agents);
            // From 1 % below the margin rule's floor down to the clock's floor of 0.5.
            let min = crate::pipeline::clock::RATE_PPM_MIN;
            let high = agent_rate_min_ppm.saturating_sub(10_000).max(min + 1);
            Fault::AgentClockBeyondMargin { agent, rate_ppm: rng.random_range(min..high), span }
        }
        FaultKind::AgentCalls => {
            let agent = rng.random_range(0..agents);
            let calls = AgentCall::ALL[rng.random_range(0..AgentCall::ALL.len())];
            let effect = if rng.random_bool(0.5) {
                CallEffect::Fail
            } else {
                CallEffect::Delay(Duration::from_millis(rng.random_range(1_000..5_000)))
            };
            Fault::AgentCalls { agent, calls, effect, span }
        }
    }
}

/// Every fault of `plan` as fixed events, sorted by time: the fixed ones before `plan.until`, then each random
/// process's draws, made from the same streams and in the same order as the simulator's runner
/// (`FaultRunner::start`, simulator build) for a world of `replicas` replicas and `agents` agents (`agent_rate_min_ppm`: the
/// slowest agent clock the margin rule allows). For runs outside the simulator (`lockstep chaos run`), where
/// faults are planned ahead and injected on the wall clock.
pub fn schedule(
    plan: &FaultPlan,
    seed: u64,
    replicas: usize,
    agents: usize,
    agent_rate_min_ppm: u64,
) -> Vec<FaultEvent> {
    let mut events: Vec<FaultEvent> = plan.fixed.iter().filter(|event| event.at < plan.until).cloned().collect();
    let targets = Targets { replicas, agents, agent_rate_min_ppm };
    let mut seen = std::collections::BTreeMap::<FaultKind, u64>::new();
    for process in &plan.random {
        if (process.kind.targets_agents() && agents == 0) || process.per_minute <= 0.0 {
            continue;
        }
        let index = seen.entry(process.kind).or_default();
        let mut rng = rng::keyed(seed, &format!("fault-{}", process.kind.name()), *index);
        *index += 1;
        let mut at = Duration::ZERO;
        loop {
            let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
            at += Duration::from_secs_f64(-uniform.ln() * 60.0 / process.per_minute);
            if at >= plan.until {
                break;
            }
            events.push(FaultEvent { at, fault: draw(process.kind, &process.span, targets, &mut rng) });
        }
    }
    events.sort_by_key(|event| event.at);
    events
}

#[cfg(madsim)]
/// Injects `fault` through the world's handles and returns when it is undone.
pub async fn inject(world: World, fault: Fault) {
    match fault {
        Fault::Kill { replica, down } => world.replica(replica).kill_for(down).await,
        Fault::Pause { replica, span } => match world.scenario().faults.pause_inside_pass {
            Some(bound) => world.replica(replica).pause_inside_pass(span, bound).await,
            None => world.replica(replica).pause(span).await,
        },
        Fault::Partition { a, b, span } => world.net().partition(a, b, span).await,
        Fault::Isolate { node, span } => world.net().isolate(node, span).await,
        Fault::Degrade { latency, loss, span } => world.net().degrade(latency, loss, span).await,
        Fault::LostReplies { chance, span } => world.db().drop_replies(chance, span).await,
        Fault::DbRestart { down } => world.db().restart(down).await,
        Fault::ClockDrift { replica, rate_ppm, span } => world.replica(replica).drift(rate_ppm, span).await,
        Fault::Contention { claims } => world.client().burst(claims).await,
        Fault::Buggify { span } => world.buggify(span).await,
        Fault::AgentKill { agent, down } => world.agent(agent).kill_for(down).await,
        Fault::AgentPause { agent, span } => world.agent(agent).pause(span).await,
        Fault::AgentClockDrift { agent, rate_ppm, span } => world.agent(agent).drift(rate_ppm, span).await,
        Fault::AgentClockBeyondMargin { agent, rate_ppm, span } => {
            world.agent(agent).drift_beyond_margin(rate_ppm, span).await
        }
        Fault::AgentCalls { agent, calls, effect, span } => world.agent(agent).calls(calls, effect, span).await,
        Fault::HintLoss { replica, span } => world.replica(replica).lose_hints(span).await,
        Fault::CrashLoop { replica, span } => world.replica(replica).crash_loop(span).await,
        Fault::ClockJump { replica, by, back } => world.replica(replica).jump(by, back),
        Fault::HandlerHang { replica, span } => world.replica(replica).hang_handlers(span).await,
        Fault::StoreHang { node, span } => world.hang_store(node, span).await,
    }
}

#[cfg(madsim)]
/// The fault processes of a run, and every fault they started.
pub struct FaultRunner {
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

#[cfg(madsim)]
impl FaultRunner {
    /// Starts the fixed events and the random processes of `plan` on `world` (simulated time 0 = now).
    pub fn start(world: &World, plan: &FaultPlan) -> FaultRunner {
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let start = tokio::time::Instant::now();
        let mut fixed = plan.fixed.clone();
        fixed.sort_by_key(|event| event.at);
        let runner = {
            let (world, tasks, until) = (world.clone(), tasks.clone(), plan.until);
            tokio::spawn(async move {
                for event in fixed.into_iter().filter(|event| event.at < until) {
                    tokio::time::sleep_until(start + event.at).await;
                    spawn_fault(&tasks, world.clone(), event.fault);
                }
            })
        };
        push(&tasks, runner);
        let mut seen = std::collections::BTreeMap::<FaultKind, u64>::new();
        for process in &plan.random {
            if process.kind.targets_agents() && world.agents() == 0 {
                continue;
            }
            let index = seen.entry(process.kind).or_default();
            let rng = rng::keyed(world.seed(), &format!("fault-{}", process.kind.name()), *index);
            *index += 1;
            let task = tokio::spawn(random_process(world.clone(), tasks.clone(), process.clone(), rng, plan.until));
            push(&tasks, task);
        }
        FaultRunner { tasks }
    }

    /// Aborts every process and every fault in progress; the world's heal undoes what they left.
    pub fn stop(&self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

#[cfg(madsim)]
async fn random_process(
    world: World,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    process: RandomFault,
    mut rng: ChaCha8Rng,
    until: Duration,
) {
    if process.per_minute <= 0.0 {
        return;
    }
    let start = tokio::time::Instant::now();
    let mut at = Duration::ZERO;
    loop {
        let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
        at += Duration::from_secs_f64(-uniform.ln() * 60.0 / process.per_minute);
        if at >= until {
            return;
        }
        let targets = Targets {
            replicas: world.replicas(),
            agents: world.agents(),
            agent_rate_min_ppm: world.scenario().gang.as_ref().map_or(0, |gang| gang.agent_rate_min_ppm()),
        };
        let fault = draw(process.kind, &process.span, targets, &mut rng);
        tokio::time::sleep_until(start + at).await;
        spawn_fault(&tasks, world.clone(), fault);
    }
}

#[cfg(madsim)]
fn spawn_fault(tasks: &Arc<Mutex<Vec<JoinHandle<()>>>>, world: World, fault: Fault) {
    push(tasks, tokio::spawn(inject(world, fault)));
}

#[cfg(madsim)]
fn push(tasks: &Mutex<Vec<JoinHandle<()>>>, task: JoinHandle<()>) {
    let mut tasks = lock(tasks);
    tasks.retain(|task| !task.is_finished());
    tasks.push(task);
}

#[cfg(madsim)]
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> FaultPlan {
        FaultPlan {
            fixed: vec![
                FaultEvent { at: Duration::from_secs(50), fault: Fault::DbRestart { down: Duration::from_secs(1) } },
                FaultEvent { at: Duration::from_secs(5), fault: Fault::Contention { claims: 3 } },
            ],
            random: vec![
                RandomFault {
                    kind: FaultKind::Kill,
                    per_minute: 6.0,
                    span: Duration::from_secs(1)..Duration::from_secs(3),
                },
                RandomFault {
                    kind: FaultKind::AgentKill,
                    per_minute: 6.0,
                    span: Duration::from_secs(1)..Duration::from_secs(2),
                },
            ],
            until: Duration::from_secs(40),
            pause_inside_pass: None,
        }
    }

    #[test]
    fn a_schedule_is_sorted_ends_at_until_and_is_a_function_of_the_seed() {
        let events = schedule(&plan(), 7, 3, 0, 0);
        assert!(events.windows(2).all(|pair| pair[0].at <= pair[1].at), "{events:?}");
        assert!(events.iter().all(|event| event.at < Duration::from_secs(40)), "{events:?}");
        assert!(events.iter().any(|event| event.fault == Fault::Contention { claims: 3 }), "{events:?}");
        assert!(!events.iter().any(|event| matches!(event.fault, Fault::DbRestart { .. })), "past until: {events:?}");
        let kills = events.iter().filter(|event| matches!(event.fault, Fault::Kill { .. })).count();
        assert!(kills > 0, "a rate of 6 a minute over 40 s drew no kill: {events:?}");
        assert!(!events.iter().any(|event| matches!(event.fault, Fault::AgentKill { .. })), "no agents: {events:?}");
        assert_eq!(schedule(&plan(), 7, 3, 0, 0), events);
        assert_ne!(schedule(&plan(), 8, 3, 0, 0), events);
    }
}
