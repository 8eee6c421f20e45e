//! The node watch: a replica's companion task that wakes an operation as soon as a node it runs on loses its
//! session, so that its jobs are declared lost at the node lease's expiry and not at the operation's next
//! periodic pass.
//!
//! A node's session ends when its agent's node lease expires on the store's clock (nobody writes anything then),
//! and the controller learns of it only when a pass over each of that node's operations reads the node rows. An
//! operation with no other news is passed over every `min_processing_interval` (5 s by default), so a lost node was
//! declared lost up to that long after its lease expired: between 7.6 and 13.2 s after an agent's SIGKILL with a
//! 10 s node lease, as measured in the simulator. The watch reads the node rows, sleeps until the first live
//! session's expiry, reads them again, and for each session that ended since its last read sends a fetch hint for
//! every operation holding an allocation of that session ([`Store::hint`] with the row: the operation pipeline
//! passes over it at once, whatever its interval). So a lost node is declared lost within the node lease ttl of its
//! agent's last renewal plus one fetch and one pass.
//!
//! Every replica runs one; their hints for the same node are the same hint twice. A store call that fails is
//! logged and retried after the cap: the operations' own interval still finds the lost node meanwhile.

use super::model::{Allocation, KIND_ALLOCATION, KIND_NODE, KIND_OPERATION, node_lease_owner};
use crate::store::{LockToken, Row, RowId, Store, StoreError, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The node watch's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeWatch {
    /// The longest the watch sleeps between two reads of the node rows (local clock). A session the watch never
    /// saw live is not watched (its operations' own passes find its end), and a session lasts at least its node
    /// lease ttl, so a cap below the agents' node lease ttl sees every session. Default 5 s, half the agent's
    /// default node lease ([`crate::agent::NODE_LEASE_TTL_DEFAULT`], 10 s).
    pub cap: Duration,
    /// Added to each sleep until an expiry (local clock), so that the read after it finds the lease expired on the
    /// store's clock despite the call's own latency and a local clock a little fast. Default 50 ms.
    pub slack: Duration,
}

impl Default for NodeWatch {
    fn default() -> NodeWatch {
        NodeWatch { cap: Duration::from_secs(5), slack: Duration::from_millis(50) }
    }
}

impl NodeWatch {
    /// Reads the node rows and the store's time, hints the operations of every session that ended since
    /// `known` (the live sessions of the previous look), and returns the live sessions now and how long to sleep
    /// before the next look. Errors: the store's, with nothing hinted after the failed call.
    pub async fn look<S: Store>(
        &self,
        store: &S,
        known: &BTreeMap<RowId, LockToken>,
    ) -> Result<(BTreeMap<RowId, LockToken>, Duration), StoreError> {
        let nodes = store.list(KIND_NODE, None).await?;
        let now = store.now().await?;
        let live = live_sessions(&nodes, now);
        for (&node, &session) in known {
            if live.get(&node) != Some(&session) {
                for operation in operations_of(store, node, session).await? {
                    store.hint(KIND_OPERATION, Some(operation)).await?;
                }
            }
        }
        let first_expiry = nodes
            .iter()
            .filter(|node| live.contains_key(&node.id))
            .filter_map(|node| node.lock_expires_at)
            .map(|expires| Duration::from_micros(expires.as_micros().saturating_sub(now.as_micros()).max(0) as u64))
            .min();
        let sleep = first_expiry.map_or(self.cap, |left| (left + self.slack).min(self.cap));
        Ok((live, sleep))
    }

    /// Looks at the nodes until the task is aborted (a replica's companion: [`crate::pipeline::PipelineManager::
    /// run_beside`]).
    pub async fn run<S: Store>(self, store: Arc<S>) {
        let mut known = BTreeMap::new();
        loop {
            let sleep = match self.look(store.as_ref(), &known).await {
                Ok((live, sleep)) => {
                    known = live;
                    sleep
                }
                Err(error) => {
                    tracing::warn!(%error, "node watch: a read of the nodes failed; the next look tries again");
                    self.cap
                }
            };
            tokio::time::sleep(sleep).await;
        }
    }
}

/// The live session (lease token) of each node whose agent holds its lease at `now` (store clock): a lease of the
/// node's own agent (owner [`node_lease_owner`]) that expires after `now`.
pub(super) fn live_sessions(nodes: &[Row], now: Timestamp) -> BTreeMap<RowId, LockToken> {
    let mut sessions = BTreeMap::new();
    for node in nodes {
        let live = node.lock_expires_at.is_some_and(|expires| expires > now)
            && node.lock_owner.as_deref() == Some(node_lease_owner(&node.status).as_str());
        if let (true, Some(token)) = (live, node.lock_token) {
            sessions.insert(node.id, token);
        }
    }
    sessions
}

/// The operations granted an allocation of `node` in its session `session`, in id order.
async fn operations_of<S: Store>(store: &S, node: RowId, session: LockToken) -> Result<BTreeSet<RowId>, StoreError> {
    let allocations = store.list(KIND_ALLOCATION, Some(node)).await?;
    Ok(allocations
        .iter()
        .filter_map(|row| Allocation::from_row(row).ok())
        .filter(|allocation| allocation.allocated && allocation.data.node_session == Some(session))
        .filter_map(|allocation| allocation.data.operation)
        .collect())
}
