//! The links of `lockstep chaos run`'s nodes to PostgreSQL: one [`Proxy`] per replica and per agent (a node's
//! database URL names its proxy's listener; the harness's own session goes to PostgreSQL directly), and the
//! scenario's network faults as link modes ([`NetworkFaults`]). Links are numbered replicas first, then agents
//! (agent `i` has link `replicas + i`).
//!
//! - `partition` (a replica or an agent and the database) and `isolate` (a replica or an agent): that node's link
//!   stalls for the span (bytes wait both ways and flow in order after it, as after a partition that heals
//!   before TCP gives up); `isolate` of the database stalls every link (the harness keeps its own session).
//! - `degrade`: every link loses chunks with the scenario's `loss` (each loss resets its connection:
//!   PostgreSQL's protocol cannot skip a gap), or, without loss, delays every chunk by the middle of the
//!   scenario's latency range. A proxy link has one mode at a time, so with loss the latency is not added.
//! - `lost-replies`: every link loses each chunk from the server with the scenario's chance, after the server
//!   sent it, and resets the connection: the statement or `COMMIT` ran, its node never hears.
//!
//! Faults whose links do not exist here (between two nodes, which talk only through PostgreSQL; on the
//! harness's client) are refused by [`links_of`]. A fault whose link is already faulted is skipped, as the
//! simulator skips a fault whose slot is taken. A link's mode between faults is its *base*: bytes pass, or with a
//! scenario's `[network] latency` above the simulator's default (ends past 10 ms), each chunk waits a quarter of
//! the middle of that range ([`base_mode`]).

use super::NetworkFaults;
use super::proxy::{LinkFault, Proxy, ProxyHandle, ProxyOptions};
use crate::sim::{Fault, Target};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

/// The latency past which a scenario's `[network] latency` delays every link between faults: the end of the
/// simulator's default range (1–10 ms), which loopback TCP to a local PostgreSQL already is.
pub const BASE_LATENCY_FLOOR: Duration = Duration::from_millis(10);

/// Round trips of a recorded store call on PostgreSQL (`BEGIN`, its statement, its history record, `COMMIT`),
/// where the simulator's store call is one round trip.
pub const ROUND_TRIPS_PER_CALL: u32 = 4;

/// A link's mode between faults for a scenario whose links take `latency` (one way, per message, in the
/// simulator): when its end is past [`BASE_LATENCY_FLOOR`], each chunk waits the middle of the range divided by
/// [`ROUND_TRIPS_PER_CALL`], so that a store call takes about the simulator's round trip; else bytes pass.
pub fn base_mode(latency: &std::ops::Range<Duration>) -> LinkFault {
    match latency.end > BASE_LATENCY_FLOOR {
        true => LinkFault::Delay((latency.start + latency.end) / 2 / ROUND_TRIPS_PER_CALL),
        false => LinkFault::Pass,
    }
}

/// What one network fault does: the links it faults, the links' mode, and for how long.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkPlan {
    /// Indexes of the links that change (replica `i`: `i`; agent `i`: replicas + `i`).
    pub replicas: Vec<usize>,
    /// The links' mode during the fault.
    pub mode: LinkFault,
    /// How long, wall clock; then the links pass again.
    pub span: Duration,
}

/// The links `fault` faults in a world of `replicas` replicas and `agents` agents, and how (see the module docs).
///
/// Errors: why the fault has no link here, naming it.
pub fn links_of(fault: &Fault, replicas: usize, agents: usize) -> Result<LinkPlan, String> {
    let count = replicas + agents;
    let every = || (0..count).collect::<Vec<_>>();
    let no_link = |why: &str| Err(format!("{fault}: {why}"));
    let link = |target: &Target| match target {
        Target::Replica(i) => Some(*i),
        Target::Agent(i) => Some(replicas + *i),
        Target::Db | Target::Client => None,
    };
    let (links, mode, span) = match fault {
        Fault::Partition { a, b, span } => match (a, b) {
            (node, Target::Db) | (Target::Db, node) if link(node).is_some() => {
                (vec![link(node).unwrap_or_default()], LinkFault::Stall, *span)
            }
            (Target::Replica(_) | Target::Agent(_), Target::Replica(_) | Target::Agent(_)) => {
                return no_link("nodes talk only through PostgreSQL: there is no link between two of them");
            }
            _ => return no_link("only a replica's or an agent's link to the database runs through the chaos proxy"),
        },
        Fault::Isolate { node: Target::Db, span } => (every(), LinkFault::Stall, *span),
        Fault::Isolate { node, span } if link(node).is_some() => {
            (vec![link(node).unwrap_or_default()], LinkFault::Stall, *span)
        }
        Fault::Isolate { .. } => {
            return no_link("only replicas, agents and the database have links through the chaos proxy");
        }
        Fault::Degrade { latency, loss, span } => {
            let mode = if *loss > 0.0 {
                LinkFault::Drop { probability: *loss }
            } else {
                LinkFault::Delay((latency.start + latency.end) / 2)
            };
            (every(), mode, *span)
        }
        Fault::LostReplies { chance, span } => (every(), LinkFault::LoseReplies { probability: *chance }, *span),
        // The node's connections that carry a byte during the span go half-open and stay so; its store's
        // `call_timeout` ends each call on them, and its pool drops them.
        Fault::StoreHang { node, span } if link(node).is_some() => {
            (vec![link(node).unwrap_or_default()], LinkFault::BlackHole, *span)
        }
        _ => return no_link("not a network fault"),
    };
    if links.iter().any(|i| *i >= count) {
        // Only a fault on one node can name a link past the world's: say which node.
        let node = match fault {
            Fault::Partition { a: Target::Db, b: node, .. }
            | Fault::Partition { a: node, .. }
            | Fault::Isolate { node, .. }
            | Fault::StoreHang { node, .. } => match node {
                Target::Agent(i) => format!("agent {i}"),
                Target::Replica(i) => format!("replica {i}"),
                other => format!("{other:?}"),
            },
            _ => "a node".to_string(),
        };
        return no_link(&format!("{node} is not in the world ({replicas} replicas, {agents} agents)"));
    }
    Ok(LinkPlan { replicas: links, mode, span })
}

/// One proxy per node, which links a fault holds, and the links' mode between faults.
pub struct Links {
    proxies: Vec<Proxy>,
    /// Whether link `i` is held by a running fault.
    busy: Mutex<Vec<bool>>,
    /// Every link's mode between faults ([`base_mode`]).
    base: LinkFault,
}

impl Links {
    /// Starts `count` proxies on free local ports, each to `upstream`, seeded from `seed` (one stream per
    /// proxy), each in mode `base` between faults.
    ///
    /// Errors: a listener that cannot be bound.
    pub async fn start(count: usize, upstream: SocketAddr, seed: u64, base: LinkFault) -> std::io::Result<Links> {
        let mut proxies = Vec::with_capacity(count);
        for index in 0..count {
            use rand::Rng;
            let seed = crate::sim::rng::stream(seed, &format!("chaos-proxy-{index}")).random::<u64>();
            let listen = SocketAddr::from(([127, 0, 0, 1], 0));
            let proxy = Proxy::start(ProxyOptions { listen, upstream, seed }).await?;
            proxy.handle().set(base);
            proxies.push(proxy);
        }
        Ok(Links { proxies, busy: Mutex::new(vec![false; count]), base })
    }

    /// The proxy of link `index` (its listener is the node's database address).
    pub fn proxy(&self, index: usize) -> ProxyHandle {
        self.proxies[index].handle()
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every link passes again and no fault holds one (the heal).
    pub fn heal(&self) {
        for proxy in &self.proxies {
            proxy.handle().set(self.base);
        }
        self.busy().iter_mut().for_each(|busy| *busy = false);
    }

    /// Sets `plan`'s links to its mode unless one of them is held by another fault: false when skipped.
    pub fn begin(&self, plan: &LinkPlan) -> bool {
        let mut busy = self.busy();
        if plan.replicas.iter().any(|i| busy.get(*i).is_none_or(|b| *b)) {
            return false;
        }
        for i in &plan.replicas {
            busy[*i] = true;
            self.proxies[*i].handle().set(plan.mode);
        }
        true
    }

    /// What the proxies of `replicas` did so far, summed: (connections reset, chunks lost, chunks held).
    pub fn counts(&self, replicas: &[usize]) -> (u64, u64, u64) {
        replicas
            .iter()
            .map(|i| self.proxies[*i].handle().stats())
            .fold((0, 0, 0), |(r, l, h), stats| (r + stats.resets, l + stats.chunks_lost, h + stats.chunks_held))
    }

    /// `plan`'s links pass again (the end of a fault [`Links::begin`] started).
    pub fn end(&self, plan: &LinkPlan) {
        let mut busy = self.busy();
        for i in &plan.replicas {
            self.proxies[*i].handle().set(self.base);
            busy[*i] = false;
        }
    }

    /// Applies `plan` for its span ([`Links::begin`], a sleep, [`Links::end`]): false when skipped.
    pub async fn apply(&self, plan: LinkPlan) -> bool {
        if !self.begin(&plan) {
            return false;
        }
        tokio::time::sleep(plan.span).await;
        self.end(&plan);
        true
    }
}

impl NetworkFaults for Links {
    fn inject(&self, fault: Fault) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Ok(plan) = links_of(&fault, self.proxies.len(), 0) {
                self.apply(plan).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_network_fault_becomes_its_link_mode_and_faults_without_a_link_are_refused() {
        assert_eq!(base_mode(&(Duration::from_millis(1)..Duration::from_millis(10))), LinkFault::Pass);
        let slow = Duration::from_millis(100)..Duration::from_millis(300);
        assert_eq!(base_mode(&slow), LinkFault::Delay(Duration::from_millis(50)));
        let span = Duration::from_secs(3);
        let cut = Fault::Partition { a: Target::Db, b: Target::Replica(1), span };
        assert_eq!(links_of(&cut, 2, 0), Ok(LinkPlan { replicas: vec![1], mode: LinkFault::Stall, span }));
        let alone = Fault::Isolate { node: Target::Replica(0), span };
        assert_eq!(links_of(&alone, 2, 0).map(|plan| (plan.replicas, plan.mode)), Ok((vec![0], LinkFault::Stall)));
        let db = Fault::Isolate { node: Target::Db, span };
        assert_eq!(links_of(&db, 3, 0).map(|plan| plan.replicas), Ok(vec![0, 1, 2]));
        let lossy = Fault::Degrade { latency: Duration::from_millis(10)..Duration::from_millis(30), loss: 0.1, span };
        assert_eq!(links_of(&lossy, 2, 0).map(|plan| plan.mode), Ok(LinkFault::Drop { probability: 0.1 }));
        let slow = Fault::Degrade { latency: Duration::from_millis(10)..Duration::from_millis(30), loss: 0.0, span };
        assert_eq!(links_of(&slow, 2, 0).map(|plan| plan.mode), Ok(LinkFault::Delay(Duration::from_millis(20))));
        let lost = Fault::LostReplies { chance: 0.25, span };
        assert_eq!(
            links_of(&lost, 2, 0),
            Ok(LinkPlan { replicas: vec![0, 1], mode: LinkFault::LoseReplies { probability: 0.25 }, span })
        );
        let hang = Fault::StoreHang { node: Target::Replica(1), span };
        assert_eq!(links_of(&hang, 2, 0), Ok(LinkPlan { replicas: vec![1], mode: LinkFault::BlackHole, span }));
        assert!(links_of(&hang, 1, 0).unwrap_err().contains("replica 1 is not in the world"));
        let agent_hang = Fault::StoreHang { node: Target::Agent(1), span };
        assert_eq!(
            links_of(&agent_hang, 2, 3).map(|plan| (plan.replicas, plan.mode)),
            Ok((vec![3], LinkFault::BlackHole))
        );
        let between = Fault::Partition { a: Target::Replica(0), b: Target::Replica(1), span };
        assert!(links_of(&between, 2, 0).unwrap_err().contains("no link between two of them"));
        let client = Fault::Isolate { node: Target::Client, span };
        assert!(links_of(&client, 2, 0).unwrap_err().contains("only replicas, agents and the database"));
        assert!(links_of(&alone, 0, 0).unwrap_err().contains("replica 0 is not in the world"));
        // An agent's link comes after the replicas'.
        let agent = Fault::Partition { a: Target::Agent(1), b: Target::Db, span };
        assert_eq!(links_of(&agent, 2, 3).map(|plan| plan.replicas), Ok(vec![3]));
        let isolated = Fault::Isolate { node: Target::Agent(0), span };
        assert_eq!(links_of(&isolated, 2, 3).map(|plan| plan.replicas), Ok(vec![2]));
        assert_eq!(links_of(&db, 2, 3).map(|plan| plan.replicas), Ok(vec![0, 1, 2, 3, 4]));
        assert!(links_of(&agent, 2, 1).unwrap_err().contains("agent 1 is not in the world"));
        let agents = Fault::Partition { a: Target::Agent(0), b: Target::Replica(1), span };
        assert!(links_of(&agents, 2, 3).unwrap_err().contains("no link between two of them"));
    }
}
