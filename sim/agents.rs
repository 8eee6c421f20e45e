//! An agent node (DESIGN §4, §5): a node [`Agent`] over a [`NetStore`] to the database node, running its jobs
//! through the world's one [`SimulatedExecutor`] (shared, so every process lands in one [`ProcessLog`]).
//!
//! [`run`] is the node's init function, so a restart runs it again from scratch: the agent keeps nothing between
//! incarnations but what the database holds (its node row and allocation rows) and takes a new node lease (a new
//! session), so it never runs the jobs of its previous life. A killed node's processes die with it: the world
//! records that in the process log ([`ProcessLog::node_died`]) when it kills the node. Every pass the agent
//! finishes is traced ([`super::gang::trace_pass`]): new sessions, fences and the jobs they killed, jobs killed
//! because the controller moved on.
//!
//! [`ProcessLog`]: crate::agent::ProcessLog
//! [`ProcessLog::node_died`]: crate::agent::ProcessLog::node_died

use super::agent_calls::{AgentStore, CallFaults};
use super::db::Database;
use super::gang;
use super::net_store::{NetStore, NetStoreOptions};
use super::trace::Trace;
use crate::agent::{Agent, AgentConfig, SimulatedExecutor};
use crate::pipeline::LocalClock;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What every incarnation of one agent node shares.
pub struct AgentContext {
    /// Index in the world.
    pub index: usize,
    /// Node name, `agent-{index}` (also the agent's node name in the store).
    pub name: Arc<str>,
    /// Node address.
    pub ip: IpAddr,
    /// The database node's call address.
    pub db: Arc<Database>,
    /// The agent's configuration.
    pub config: AgentConfig,
    /// The world's simulated executor (clones share the script, attempt counts and process log).
    pub executor: SimulatedExecutor,
    /// Time-out of each store call.
    pub call_timeout: Duration,
    /// The machine's monotonic clock.
    pub clock: LocalClock,
    /// The run's trace.
    pub trace: Trace,
    /// Incarnations started so far.
    pub incarnations: AtomicU64,
    /// Faults on kinds of its store calls ([`super::agent_calls`]): the machine's, so they outlive a restart.
    pub calls: Arc<CallFaults>,
}

/// One incarnation of the agent node, forever (agents do not drain). The node's init function.
pub async fn run(ctx: Arc<AgentContext>) {
    let incarnation = ctx.incarnations.fetch_add(1, Ordering::SeqCst) + 1;
    ctx.trace.record(&ctx.name, "start", format!("incarnation={incarnation}"));
    let options = NetStoreOptions {
        node: ctx.name.clone(),
        ip: ctx.ip,
        db: ctx.db.clone(),
        call_timeout: ctx.call_timeout,
        hints: true,
    };
    let store = AgentStore::new(NetStore::connect(options, ctx.trace.clone()).await, ctx.calls.clone());
    let (trace, name) = (ctx.trace.clone(), ctx.name.clone());
    let observer = Arc::new(move |pass: &crate::agent::AgentPass| gang::trace_pass(&trace, &name, pass));
    Agent::new(Arc::new(store), ctx.executor.clone(), ctx.config.clone())
        .with_local_clock(ctx.clock.clone())
        .with_observer(observer)
        .run()
        .await
}
