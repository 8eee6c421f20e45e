//! The heartbeater: extends the leases of every row the pipeline holds, queued or in processing, when they come
//! close to expiry, and forgets leases that were lost (DESIGN §3; dstack PIPELINES, "Overview").

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
    /// 2. leases whose deadline is within `heartbeat_trigger` are extended in one store call;
    /// 3. those the store no longer holds are forgotten; the others get deadline = (call sent) + ttl − margin.
    ///
    /// Errors: the store's; the ledger is unchanged and the next pass tries again (deadlines keep running).
    pub async fn run_once(&self) -> Result<HeartbeatPass, StoreError> {
        let config = &self.core.config;
        let shared = &self.core.shared;
        let now = self.core.clock.now();
        let mut pass = HeartbeatPass::default();
        for (id, held) in shared.leases() {
            let lease = Lease { id, token: held.token };
            if now >= held.deadline {
                shared.forget(lease);
                pass.dropped.push(lease);
            } else if held.deadline.duration_since(now) <= config.heartbeat_trigger {
                pass.sent.push(lease);
            }
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

    /// The heartbeater's loop, forever (the manager aborts it after the pipeline's workers finish): a pass at
    /// once, then one every `heartbeat_interval` of local time after the previous one started, or at once if a
    /// pass took longer. A store error is logged; the next pass retries.
    pub async fn run(self) {
        let clock = self.core.clock.clone();
        loop {
            let next = clock.now() + self.core.config.heartbeat_interval;
            if buggify::fires(Point::HeartbeatSkip) {
                // A heartbeater starved of CPU: a run of skipped passes lets leases expire under their workers.
            } else if let Err(error) = self.run_once().await {
                tracing::warn!(pipeline = %self.core.config.name, %error, "heartbeat failed");
            }
            clock.sleep_until(next).await;
        }
    }
}
