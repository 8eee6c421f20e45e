//! `lockstep chaos run`: a scenario file on a real PostgreSQL with real replica processes, real faults, a
//! recorded history and the simulator's checkers. Normal build only.
//!
//! - **World**: the scenario's replicas are child processes (`lockstep serve`, with the hidden row-workload mode
//!   running the simulator's own handlers on the unchanged engine, or the gang controller as in real mode) on a
//!   fresh schema, dropped at the end unless kept; a gang scenario's agents are `lockstep agent` child processes
//!   running the scenario's jobs as real processes ([`jobs`]). The harness is the workload client and submits
//!   the gang operations.
//! - **Faults** ([`RealFault`]): `kill` is SIGKILL and a new process after `down`; `pause` is SIGSTOP and SIGCONT
//!   after `span`; `agent-kill` and `agent-pause` the same for an agent (a paused agent's jobs stop with it);
//!   `db-restart` ends every session of this run's schema (`pg_terminate_backend`); `contention`
//!   inserts its burst of claims as the simulator's client does. The network faults run on the chaos proxies
//!   ([`links`]: one per replica, a [`NetworkFaults`] implementation); clock drift and buggify have no real form
//!   and are refused with the reason.
//! - **Proxy** ([`proxy`]): a TCP proxy to PostgreSQL per node whose links can stall, black-hole, delay, drop
//!   and lose replies: the real form of the network faults.
//! - **History**: every replica records its lease writes in the schema's `history` table in the same transaction
//!   ([`PgOptions::history`](crate::store::PgOptions::history)); the harness reads it, the events and the rows,
//!   and runs the simulator's checkers on them ([`crate::sim::run::check`]): one checker path for both.

pub mod gang;
mod harness;
pub mod jobs;
pub mod links;
pub mod proxy;

pub use harness::{ChaosError, ChaosOptions, ChaosRun, Ended, Interrupted, PauseLanding, run};

use crate::sim::Fault;
use std::time::Duration;

/// What a scenario's fault becomes on real processes, or why it cannot run. Spans are wall time, copied from
/// the scenario's [`Fault`]; indices count from 0 as the scenario's `replica-N` and `agent-N` do.
#[derive(Clone, Debug, PartialEq)]
pub enum RealFault {
    /// SIGKILL replica `replica`, start a new process after `down`.
    Kill {
        /// The replica process killed.
        replica: usize,
        /// How long before the new process starts.
        down: Duration,
    },
    /// SIGSTOP replica `replica`, SIGCONT after `span`.
    Pause {
        /// The replica process stopped.
        replica: usize,
        /// How long it stays stopped.
        span: Duration,
    },
    /// `pg_terminate_backend` of every session of the run's schema but the harness's.
    DbRestart,
    /// The harness inserts `claims` claims on resource 0 at once.
    Contention {
        /// How many claims the harness inserts.
        claims: usize,
    },
    /// SIGKILL agent `agent` (its job shells die with it), start a new process on the same work dir after `down`
    /// (its restart cleanup ends what the jobs left).
    AgentKill {
        /// The agent process killed.
        agent: usize,
        /// How long before the new process starts.
        down: Duration,
    },
    /// SIGSTOP agent `agent` and its jobs' process groups (the machine freezes), SIGCONT after `span`.
    AgentPause {
        /// The agent process stopped, with its jobs.
        agent: usize,
        /// How long they stay stopped.
        span: Duration,
    },
    /// A network fault: injected by a [`NetworkFaults`] (the chaos proxy) when there is one.
    Network(Fault),
}

/// A fault on the links between the nodes and PostgreSQL (partition, isolate, degrade, lost replies, store hang): the hook
/// the chaos proxy implements. Without one, a scenario with network faults is refused ("needs the chaos proxy").
pub trait NetworkFaults: Send + Sync {
    /// Injects `fault` (a [`Fault::Partition`], [`Fault::Isolate`], [`Fault::Degrade`], [`Fault::LostReplies`]
    /// or [`Fault::StoreHang`]) and returns when it is undone.
    fn inject(&self, fault: Fault) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

/// Maps one scenario fault to its real form. `network`: whether a [`NetworkFaults`] is installed.
///
/// Errors: why the fault has no real form here, naming it.
pub fn real_fault(fault: &Fault, network: bool) -> Result<RealFault, String> {
    match fault {
        Fault::Kill { replica, down } => Ok(RealFault::Kill { replica: *replica, down: *down }),
        Fault::Pause { replica, span } => Ok(RealFault::Pause { replica: *replica, span: *span }),
        Fault::DbRestart { .. } => Ok(RealFault::DbRestart),
        Fault::Contention { claims } => Ok(RealFault::Contention { claims: *claims }),
        Fault::Partition { .. }
        | Fault::Isolate { .. }
        | Fault::Degrade { .. }
        | Fault::LostReplies { .. }
        | Fault::StoreHang { .. } => {
            if network {
                Ok(RealFault::Network(fault.clone()))
            } else {
                Err(format!("{fault} needs the chaos proxy (every node reaching PostgreSQL through it)"))
            }
        }
        Fault::ClockDrift { .. } | Fault::AgentClockDrift { .. } | Fault::AgentClockBeyondMargin { .. } => {
            Err(format!(
                "{fault}: not possible on real processes (a process's monotonic clock cannot be made to run at \
             another rate from outside)"
            ))
        }
        Fault::HandlerHang { .. } => Err(format!(
            "{fault}: not possible on real processes yet (the replicas' handlers have no hook through which the \
             harness could hang them)"
        )),
        Fault::ClockJump { .. } => Err(format!(
            "{fault}: not possible on real processes yet (libfaketime can step a process's clocks, through a file \
             it rereads, but the chaos harness does not start replicas under it)"
        )),
        Fault::HintLoss { .. } => Err(format!(
            "{fault}: not possible on real processes yet (the replicas' LISTEN sessions do not pass through the chaos \
             proxy apart from their other connections)"
        )),
        Fault::CrashLoop { .. } => Err(format!(
            "{fault}: not possible on real processes yet (the chaos harness restarts a killed replica once, not in a \
             loop)"
        )),
        Fault::AgentCalls { .. } => Err(format!(
            "{fault}: not possible on real processes yet (the agents' store calls do not pass through the chaos \
             harness)"
        )),
        Fault::Buggify { .. } => {
            Err(format!("{fault}: not possible on real processes (buggify points exist only in the simulator build)"))
        }
        Fault::AgentKill { agent, down } => Ok(RealFault::AgentKill { agent: *agent, down: *down }),
        Fault::AgentPause { agent, span } => Ok(RealFault::AgentPause { agent: *agent, span: *span }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_and_pauses_map_and_clock_drift_is_refused_with_its_reason() {
        let kill = Fault::Kill { replica: 1, down: Duration::from_secs(3) };
        assert_eq!(real_fault(&kill, false), Ok(RealFault::Kill { replica: 1, down: Duration::from_secs(3) }));
        let drift = Fault::ClockDrift { replica: 0, rate_ppm: 900_000, span: Duration::from_secs(1) };
        assert!(real_fault(&drift, false).unwrap_err().contains("not possible on real processes"));
        let cut = Fault::Isolate { node: crate::sim::Target::Replica(0), span: Duration::from_secs(1) };
        assert!(real_fault(&cut, false).unwrap_err().contains("needs the chaos proxy"));
        assert!(matches!(real_fault(&cut, true), Ok(RealFault::Network(_))));
        let hang = Fault::StoreHang { node: crate::sim::Target::Replica(0), span: Duration::from_secs(1) };
        assert!(real_fault(&hang, false).unwrap_err().contains("needs the chaos proxy"));
        assert_eq!(real_fault(&hang, true), Ok(RealFault::Network(hang.clone())));
        let agent = Fault::AgentKill { agent: 2, down: Duration::from_secs(5) };
        assert_eq!(real_fault(&agent, false), Ok(RealFault::AgentKill { agent: 2, down: Duration::from_secs(5) }));
        let drift = Fault::AgentClockDrift { agent: 0, rate_ppm: 990_000, span: Duration::from_secs(1) };
        assert!(real_fault(&drift, true).unwrap_err().contains("not possible on real processes"));
    }
}
