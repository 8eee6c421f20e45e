//! Gang placement (`gang_placement`, lockstep's own spec key; docs/gang.md, "Placement"): how the ranked jobs of a
//! gang operation's incarnation get allocations, and the gang queue that keeps waiting gangs in order.
//!
//! - [`GangPlacement::Incremental`] (YTsaurus's behaviour): each pending job takes a free allocation as one
//!   appears.
//! - [`GangPlacement::AllOrNothing`]: a pass places every ranked job of the incarnation at once, or none. An
//!   incarnation that cannot be placed holds no allocation (even those a gang restart would have reused) and
//!   waits in the gang queue.
//!
//! The gang queue is one row (kind [`KIND_GANG_QUEUE`]) listing the waiting gangs in the order their operations
//! began ([`QueueEntry::arrived`]): a gang that restarts and waits again keeps its place ahead of later operations. Each operation's pass runs alone, so the rule that keeps it fair is read by every pass, gangs and plain
//! operations alike: a pass takes a free allocation only if the free allocations left cover the *reservation* of
//! the gangs ahead of it (every waiting gang, for an operation not in the queue), and a waiting gang is placed only
//! when the free allocations cover the reservation ahead of it plus its own need. Strict first come, first placed,
//! with no backfilling: once the free allocations reach the head's need, no other pass takes one, so the head is
//! placed at its next pass and no stream of smaller operations can starve it. A gang whose need exceeds every
//! allocation of the live nodes reserves nothing (it could never use them), and fails once it has not fit for
//! [`PlacementSettings::unfit_timeout`].
//!
//! Passes that take free allocations while the queue is not empty, and passes that join or leave it, lock the
//! queue row and write it with its `version` raised, after checking that the version is the one they read
//! before reading the allocations ([`super::pipeline`]): such passes are serialized, so two of them never both
//! spend the same free allocations a waiting gang is owed. A pass that read an empty queue does not lock it: it
//! comes logically before any gang that began to wait after its read.
//!
//! The exception: a ranked job of an all-or-nothing incarnation that was already placed (a task without
//! `gang_options` restarts its jobs alone) takes a free allocation whatever the queue says, because its peers may
//! be waiting for it at their rendezvous: holding it back behind a waiting gang could leave both waiting forever.
//! It only replaces a job that ended, so the gang never holds more than its incarnation's allocations.

use super::model::DecodeError;
pub use super::spec::GangPlacement;
use crate::store::{Row, RowId, Timestamp};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Row kind of the gang queue. There is one such row; if two passes raced to create it, every pass uses the one
/// with the lowest id and the other stays empty.
pub const KIND_GANG_QUEUE: &str = "gang_queue";
/// Status of the gang queue row.
pub const GANG_QUEUE_STATUS: &str = "queue";

/// Default of [`PlacementSettings::unfit_timeout`]: long enough for the agents of a cluster that is starting to
/// register (an operation submitted a moment before them must not fail), short enough that a gang which can never
/// be placed is told so within a minute.
pub const UNFIT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// Default of [`PlacementSettings::node_return_grace`]: a node whose agent is restarted, or whose machine reboots,
/// is back within minutes; a gang that lost it waits that long, holding its place and its reservation, before it
/// counts as one that can never be placed (a node down 90 s failed a gang as unfit, the unfit timeout
/// being 60 s, although the node came back at 105 s).
pub const NODE_RETURN_GRACE_DEFAULT: Duration = Duration::from_secs(300);

/// What a replica's controller passes know about placement besides the operation itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementSettings {
    /// The placement of a gang operation whose spec leaves `gang_placement` out, fixed at its first pass.
    /// Default [`GangPlacement::Incremental`] (YTsaurus's behaviour; `lockstep serve --gang-placement`).
    pub default: GangPlacement,
    /// An all-or-nothing incarnation that needs more allocations than the live nodes offer fails once it has not
    /// fit for this long, measured on the store's clock. Default [`UNFIT_TIMEOUT_DEFAULT`]
    /// (`lockstep serve --gang-unfit-timeout`).
    pub unfit_timeout: Duration,
    /// A node whose lease expired less than this long ago (store clock) is expected back: its allocations count
    /// toward what an incarnation could ever get (the unfit rule, and the reservations of the gang queue). Default
    /// [`NODE_RETURN_GRACE_DEFAULT`]. A gang that waits for a node that does not come back fails at the latest this
    /// plus `unfit_timeout` after the node was lost.
    pub node_return_grace: Duration,
    /// TEST ONLY (simulator `[mutation] gang_gate_disabled`): all-or-nothing operations are placed incrementally
    /// while their data still says all-or-nothing, the bug the `gang_ranks_together` checker must catch.
    pub gate_disabled_for_mutation_test: bool,
    /// TEST ONLY (simulator `[mutation] lingering_gate_disabled`): a rank whose previous process may still run
    /// ([`super::model::Lingering`]) is placed anywhere at once, the bug the `rank_exclusivity` checker must catch.
    pub lingering_gate_disabled_for_mutation_test: bool,
}

impl Default for PlacementSettings {
    fn default() -> PlacementSettings {
        PlacementSettings {
            default: GangPlacement::Incremental,
            unfit_timeout: UNFIT_TIMEOUT_DEFAULT,
            node_return_grace: NODE_RETURN_GRACE_DEFAULT,
            gate_disabled_for_mutation_test: false,
            lingering_gate_disabled_for_mutation_test: false,
        }
    }
}

/// An all-or-nothing operation's wait, kept in its own data while its incarnation waits in the queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangWait {
    /// When it began to wait (store clock).
    pub since: Timestamp,
    /// Allocations it needs at once.
    pub need: u32,
    /// Since when (store clock) its need has exceeded the live nodes' allocations, if it does now.
    pub unfit_since: Option<Timestamp>,
}

/// One waiting gang in the queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The operation.
    pub operation: RowId,
    /// The index of its incarnation that waits.
    pub incarnation: u32,
    /// Allocations it needs at once: its incarnation's ranked jobs.
    pub need: u32,
    /// When it began to wait (store clock).
    pub since: Timestamp,
    /// When its operation began (store clock): the queue's order ([`QueueEntry::arrived`] earlier first; `since`
    /// for an entry written before the field). A gang that restarts keeps its place ahead of later operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrived: Option<Timestamp>,
}

/// The gang queue row's data: the waiting gangs, first come first, and a version every write raises.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangQueue {
    /// Raised by every write; a pass writes the queue only if the version is still the one it read.
    pub version: u64,
    /// The waiting gangs, in the order their operations began ([`QueueEntry::arrived`]).
    pub entries: Vec<QueueEntry>,
}

impl GangQueue {
    /// Decodes the queue row's data.
    pub fn from_row(row: &Row) -> Result<GangQueue, DecodeError> {
        GangQueue::deserialize(&row.data).map_err(|e| DecodeError {
            row: row.id,
            kind: row.kind.clone(),
            message: e.to_string(),
        })
    }

    /// The data column's value.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the gang queue serializes")
    }
}

/// The canonical queue among the gang queue rows read: the lowest id, with its data. `None` if there is none yet.
/// Errors: a row that does not decode.
pub fn canonical_queue(rows: &[Row]) -> Result<Option<(RowId, GangQueue)>, DecodeError> {
    match rows.iter().filter(|row| row.kind == KIND_GANG_QUEUE).min_by_key(|row| row.id) {
        None => Ok(None),
        Some(row) => Ok(Some((row.id, GangQueue::from_row(row)?))),
    }
}

/// The allocations reserved ahead of `operation`: the needs of the queue's gangs before it (all of them if it is
/// not in the queue), leaving out gangs that need more than `possible_slots` (the allocations of the live nodes and
/// of the nodes expected back, [`PlacementSettings::node_return_grace`]), which could never use what they would
/// hold back.
pub fn reserved_ahead(entries: &[QueueEntry], operation: RowId, possible_slots: u32) -> u32 {
    entries
        .iter()
        .take_while(|entry| entry.operation != operation)
        .filter(|entry| entry.need <= possible_slots)
        .map(|entry| entry.need)
        .sum()
}

/// How the result of an operation failed by [`unfit_reason`] begins.
pub const UNFIT_REASON_PREFIX: &str = "gang_placement all_or_nothing: ";

/// What an unfit incarnation counted ([`unfit_reason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unfit {
    /// The incarnation's index.
    pub index: u32,
    /// Allocations it needs at once.
    pub need: u32,
    /// Allocations of the live nodes.
    pub live: u32,
    /// Allocations of the nodes expected back (lost within `node_return_grace`).
    pub returning: u32,
    /// How long it has not fit (at least `timeout`).
    pub waited: Duration,
    /// `gang_unfit_timeout`.
    pub timeout: Duration,
    /// `node_return_grace`.
    pub grace: Duration,
}

/// The reason an all-or-nothing operation fails when its incarnation needs more allocations at once than the live
/// nodes and the nodes expected back offer, and has for `timeout`: it names what it counted.
///
/// ```
/// # use lockstep::gang::placement::{Unfit, unfit_reason};
/// # use std::time::Duration;
/// let (waited, timeout, grace) = (Duration::from_secs(61), Duration::from_secs(60), Duration::from_secs(300));
/// let reason = unfit_reason(Unfit { index: 0, need: 1, live: 0, returning: 0, waited, timeout, grace });
/// assert!(reason.contains("incarnation 0 needs 1 allocation at once, but the live nodes offered only 0 "));
/// ```
pub fn unfit_reason(unfit: Unfit) -> String {
    let show = crate::duration::format;
    let back = match unfit.returning {
        0 => format!("no node lost within node_return_grace {} is expected back", show(unfit.grace)),
        n => format!("nodes lost within node_return_grace {}, expected back, offer {n} more", show(unfit.grace)),
    };
    format!(
        "{UNFIT_REASON_PREFIX}incarnation {} needs {} at once, but the live nodes offered only {} ({back}) for {} \
         (gang_unfit_timeout {}): it can never be placed",
        unfit.index,
        crate::text::count(unfit.need, "allocation"),
        unfit.live,
        show(unfit.waited),
        show(unfit.timeout)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewRow;

    fn entry(operation: i64, need: u32) -> QueueEntry {
        QueueEntry { operation: RowId(operation), incarnation: 0, need, since: Timestamp::EPOCH, arrived: None }
    }

    #[test]
    fn reservation_counts_the_gangs_ahead_and_leaves_out_those_that_never_fit() {
        let queue = [entry(1, 2), entry(2, 9), entry(3, 1), entry(4, 3)];
        assert_eq!(reserved_ahead(&queue, RowId(1), 6), 0, "the head has nothing ahead");
        assert_eq!(reserved_ahead(&queue, RowId(3), 6), 2, "gang 2 needs 9 of 6: it reserves nothing");
        assert_eq!(reserved_ahead(&queue, RowId(4), 6), 3);
        assert_eq!(reserved_ahead(&queue, RowId(7), 6), 6, "an operation not in the queue is behind every gang");
        assert_eq!(reserved_ahead(&queue, RowId(7), 9), 15);
    }

    #[test]
    fn the_canonical_queue_is_the_lowest_row() {
        let row = |id: i64, version: u64| {
            let data = GangQueue { version, entries: Vec::new() }.to_json();
            NewRow::new(KIND_GANG_QUEUE, GANG_QUEUE_STATUS, data).into_row(RowId(id), Timestamp::EPOCH)
        };
        assert_eq!(canonical_queue(&[]).unwrap(), None);
        let (id, queue) = canonical_queue(&[row(9, 1), row(4, 7)]).unwrap().unwrap();
        assert_eq!((id, queue.version), (RowId(4), 7));
    }
}
