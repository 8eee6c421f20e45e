//! The heartbeater: extends the leases of the rows the pipeline's workers process when they come close to expiry,
//! gives back the leases of rows still queued by then, and forgets leases that were lost (DESIGN §3; dstack
//! PIPELINES, "Overview"; the queued ones too).

use super::Core;
use crate::buggify::{self, Point};
use crate::store::{HeartbeatParams, Lease, Store, StoreError};
use std::sync::atomic::Ordering;

/// What one heartbeat pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatPass {
    /// Leases sent to the store because their local deadline was within `heartbeat_trigger`.
    pub sent: Vec<Lease>,
    /// Of those, the ones the store still held and extended.
    pub extended: Vec<Lease>,
    /// Leases forgotten without a write: past their local deadline, or re-tokened in the store.
    pub dropped: Vec<Lease>,
    /// Leases of items still queued (no worker started them) within `heartbeat_trigger` of their deadline: taken
    /// out of the queue and given back to the store rather than extended (see [`super::queue`]).
    pub released: Vec<Lease>,
    /// Leases within `heartbeat_trigger` of their deadline that were not extended because their item's handler
    /// ran past its [`handler_timeout`](super::PipelineConfig::handler_timeout) and has not returned (it blocks
    /// its thread, so even its worker's timer cannot end it): they expire, and another holder may take the row.
    pub withheld: Vec<Lease>,
}

/// One pipeline's heartbeater. Drive it with [`Heartbeater::run_once`] in tests; [`Heartbeater::run`] loops.
pub struct Heartbeater<S: Store> {
    core: Core<S>,
}

impl<S: Store> Heartbeater<S> {
    pub(crate) fn new(core: Core<S>) -> Heartbeater<S> {
        Heartbeater { core }
    }

    /// One pass at the pipeline's local time ([`Pipeline::clock`](super::Pipeline::clock)):
    /// 1. leases whose local deadline passed are forgotten, unwritten (another holder may have them now);
    /// 2. of the leases whose deadline is within `heartbeat_trigger`, those of items still queued are taken out of
    ///    the queue and given back to the store in one call (another replica's idle worker may start them; the
    ///    pipeline becomes saturated, see [`super::queue`]), and a fetch hint for the kind is sent;
    /// 3. the others are extended in one store call, except those whose handler ran past its time-out
    ///    ([`HeartbeatPass::withheld`]: a handler that never returns must not hold its row for the life of the
    ///    process);
    /// 4. those the store no longer holds are forgotten; the others get deadline = (call sent) + ttl − margin.
    ///
    /// Before all this, every handler past its time-out is signalled to be given up (its worker then fails the
    /// item); the signal lands within one `heartbeat_interval` of the deadline.
    ///
    /// Errors: the store's. A failed release leaves its leases to expire (they are out of the queue and the
    /// ledger already); a failed heartbeat leaves the ledger unchanged and the next pass tries again (deadlines
    /// keep running).
    pub async fn run_once(&self) -> Result<HeartbeatPass, StoreError> {
        let config = &self.core.config;
        let shared = &self.core.shared;
        let now = self.core.clock.now();
        let mut pass = HeartbeatPass::default();
        let mut due = Vec::new();
        // Handlers past their time-out are given up (their workers wait on this signal beside them).
        shared.cut_handlers(now);
        // Parked waiters whose lock expired go back to the queue (DESIGN §3, "Parked waiters").
        shared.wake_due(now);
        for (id, held) in shared.leases() {
            let lease = Lease { id, token: held.token };
            if now >= held.deadline {
                shared.forget(lease);
                pass.dropped.push(lease);
            } else if held.deadline.duration_since(now) <= config.heartbeat_trigger {
                if held.handler_deadline.is_some_and(|handler_deadline| now >= handler_deadline) {
                    pass.withheld.push(lease);
                } else {
                    due.push(lease);
                }
            }
        }
        let unstarted = shared.take_queued(&due);
        pass.released = unstarted.iter().map(|item| item.lease).collect();
        pass.sent = due.into_iter().filter(|lease| !pass.released.contains(lease)).collect();
        if !pass.released.is_empty() {
            self.release(&pass.released).await?;
        }
        if pass.sent.is_empty() {
            return Ok(pass);
        }
        let params = HeartbeatParams { leases: pass.sent.clone(), lease_ttl: config.lease_ttl };
        let held = self.core.store.heartbeat(params).await?;
        let deadline = now + config.lease_ttl - config.lease_margin;
        for lease in &pass.sent {
            if held.contains(lease) {
                shared.extend(*lease, deadline);
                pass.extended.push(*lease);
            } else {
                shared.forget(*lease);
                pass.dropped.push(*lease);
            }
        }
        self.core.metrics.heartbeats.fetch_add(pass.extended.len() as u64, Ordering::Relaxed);
        Ok(pass)
    }

    /// Gives back the leases of items taken out of the queue unstarted, saturates the pipeline, and hints the
    /// kind so that other replicas' fetchers look at once.
    async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        let core = &self.core;
        core.shared.saturate();
        core.give_back(leases.to_vec()).await?;
        core.store.hint(&core.config.kind, None).await
    }

    /// The heartbeater's loop, forever (the manager aborts it after the pipeline's workers finish): a pass at
    /// once, then one every `heartbeat_interval` of local time after the previous one started, or at once if a
    /// pass took longer. A store error is logged; the next pass retries.
    pub async fn run(self) {
        let clock = self.core.clock.clone();
        let shared = &self.core.shared;
        loop {
            let next = clock.now() + self.core.config.heartbeat_interval;
            if buggify::fires(Point::HeartbeatSkip) {
                // A heartbeater starved of CPU: a run of skipped passes lets leases expire under their workers.
            } else if let Err(error) = self.run_once().await {
                tracing::warn!(pipeline = %self.core.config.name, %error, "heartbeat failed");
            }
            // Until the next pass, the parked waiters' timers: each is woken when the lock it met expires.
            loop {
                let until = shared.next_park_due().map_or(next, |due| due.min(next));
                // `biased`: tokio's `select!` otherwise draws its branch order from an RNG madsim does not seed.
                tokio::select! {
                    biased;
                    // The pass is due: a drifting local clock may read a hair short of `next` on waking, and a
                    // second sleep would shift every later pass.
                    () = clock.sleep_until(until) => if until == next { break },
                    () = shared.parked_noted.notified() => {}
                }
                let now = clock.now();
                if now >= next {
                    break;
                }
                shared.wake_due(now);
            }
        }
    }
}
