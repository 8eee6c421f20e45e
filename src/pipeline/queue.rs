//! The state one pipeline's fetcher, workers and heartbeater share: the bounded queue of leased rows and the
//! ledger of every lease the pipeline holds (queued or in processing) with its local deadline.

use super::config::PipelineConfig;
use crate::store::{Lease, Row, RowId};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::{Notify, Semaphore, TryAcquireError};
use tokio::time::{Duration, Instant};

/// A leased row waiting for a worker.
#[derive(Clone, Debug)]
pub struct Item {
    /// The row as the fetch returned it.
    pub row: Row,
    /// Its lease.
    pub lease: Lease,
}

/// A lease the pipeline holds, as its holder sees it on its own monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The fencing token.
    pub token: crate::store::LockToken,
    /// Local instant the fetch that took it was sent.
    pub leased_at: Instant,
    /// Local instant after which the lease counts as lost: (fetch or last heartbeat sent) + ttl − margin.
    pub deadline: Instant,
}

/// Queue, ledger and wake-ups of one pipeline.
pub struct Shared {
    /// Queue max (ceil(workers × upper factor)).
    pub queue_len_max: usize,
    /// Fetch while the queue is shorter than this.
    pub queue_len_low: usize,
    queue: Mutex<VecDeque<Item>>,
    /// One permit per queued item; closed when the pipeline stops taking work.
    items: Semaphore,
    leases: Mutex<BTreeMap<RowId, Held>>,
    /// Wakes the fetcher: a worker dropped the queue below its lower mark.
    pub refill: Notify,
    /// Wakes the fetcher: a fetch hint for this pipeline's kind arrived.
    pub hint: Notify,
    /// Wakes everything that waits on the pipeline's services when it stops.
    pub stop: Notify,
    stopping: AtomicBool,
    /// Workers away from the store for a while: waiting in [`Shared::pop`] for an item (the queue was empty), or
    /// processing one ([`Shared::processing`]).
    away: AtomicUsize,
    /// Signalled when a worker goes away: the apply batcher stops waiting for its apply.
    pub went_away: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Empty state sized by `config`.
    pub fn new(config: &PipelineConfig) -> Shared {
        Shared {
            queue_len_max: config.queue_len_max(),
            queue_len_low: config.queue_len_low(),
            queue: Mutex::new(VecDeque::new()),
            items: Semaphore::new(0),
            leases: Mutex::new(BTreeMap::new()),
            refill: Notify::new(),
            hint: Notify::new(),
            stop: Notify::new(),
            stopping: AtomicBool::new(false),
            away: AtomicUsize::new(0),
            went_away: Notify::new(),
        }
    }

    /// Items waiting for a worker.
    pub fn queue_len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// How many rows the next fetch may lease: queue max − size.
    pub fn fetch_limit(&self) -> usize {
        self.queue_len_max.saturating_sub(self.queue_len())
    }

    /// Leases held: queued plus in processing.
    pub fn leases_len(&self) -> usize {
        lock(&self.leases).len()
    }

    /// Queues fetched rows and records their leases; `sent` is when the fetch was sent.
    pub fn push(&self, items: Vec<Item>, sent: Instant, ttl: Duration, margin: Duration) {
        let count = items.len();
        {
            let mut leases = lock(&self.leases);
            let mut queue = lock(&self.queue);
            for item in items {
                let held = Held { token: item.lease.token, leased_at: sent, deadline: sent + ttl - margin };
                // The ledger may still hold an older lease of this row: after a stall longer than the ttl (a
                // paused process), the store's lease expired and this pipeline's fetch took the row again before
                // the heartbeater or the old worker noticed. The new lease supersedes it: the old worker's apply
                // is stale and its `forget` (guarded by token) leaves the new entry alone. Tokens only grow.
                let previous = leases.insert(item.lease.id, held);
                if let Some(previous) = previous {
                    assert!(
                        previous.token < item.lease.token,
                        "row {} leased with token {} while the ledger holds newer token {}",
                        item.lease.id,
                        item.lease.token,
                        previous.token
                    );
                }
                queue.push_back(item);
            }
            assert!(queue.len() <= self.queue_len_max, "queue {} past its max {}", queue.len(), self.queue_len_max);
        }
        self.items.add_permits(count);
    }

    /// Waits for the next item; `None` once the pipeline stops taking work. Wakes the fetcher when the queue
    /// drops below its lower mark (event-driven refill, DESIGN §3).
    pub async fn pop(&self) -> Option<Item> {
        let permit = match self.items.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {
                let _away = Away::new(self);
                self.items.acquire().await.ok()?
            }
        };
        permit.forget();
        let (item, len) = {
            let mut queue = lock(&self.queue);
            (queue.pop_front().expect("a permit without an item"), queue.len())
        };
        if len < self.queue_len_low {
            self.refill.notify_one();
        }
        Some(item)
    }

    /// Workers away from the store now: waiting for an item, or processing one. The others are in a store call
    /// (refetch, related locks, an apply) or between steps, and will bring an apply soon.
    pub fn workers_away(&self) -> usize {
        self.away.load(Ordering::SeqCst)
    }

    /// Counts the calling worker away (processing an item) until the returned guard drops.
    pub fn processing(&self) -> impl Drop + '_ {
        Away::new(self)
    }

    /// Stops handing out items and returns those still queued (their leases stay in the ledger until released).
    pub fn close(&self) -> Vec<Item> {
        self.stopping.store(true, Ordering::SeqCst);
        self.items.close();
        // Stored permits, so a fetcher between its stop check and its wait still wakes.
        self.refill.notify_one();
        self.hint.notify_one();
        self.stop.notify_waiters();
        lock(&self.queue).drain(..).collect()
    }

    /// Whether [`Shared::close`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether the pipeline still holds `lease` and its local deadline has not passed at `now`.
    pub fn holds(&self, lease: Lease, now: Instant) -> bool {
        lock(&self.leases).get(&lease.id).is_some_and(|held| held.token == lease.token && now < held.deadline)
    }

    /// Forgets a lease (applied, stale, reset, released, or left to expire after an error).
    pub fn forget(&self, lease: Lease) {
        let mut leases = lock(&self.leases);
        if leases.get(&lease.id).is_some_and(|held| held.token == lease.token) {
            leases.remove(&lease.id);
        }
    }

    /// A copy of the ledger, by row id.
    pub fn leases(&self) -> BTreeMap<RowId, Held> {
        lock(&self.leases).clone()
    }

    /// Moves a held lease's deadline after a successful heartbeat sent at `sent`.
    pub fn extend(&self, lease: Lease, deadline: Instant) {
        if let Some(held) = lock(&self.leases).get_mut(&lease.id)
            && held.token == lease.token
        {
            held.deadline = deadline;
        }
    }
}

/// A worker away from the store (waiting for an item, or processing one), counted in [`Shared::workers_away`] for
/// as long as this lives (also when the wait or the processing is cancelled).
struct Away<'a>(&'a Shared);

impl<'a> Away<'a> {
    fn new(shared: &'a Shared) -> Away<'a> {
        shared.away.fetch_add(1, Ordering::SeqCst);
        shared.went_away.notify_one();
        Away(shared)
    }
}

impl Drop for Away<'_> {
    fn drop(&mut self) {
        self.0.away.fetch_sub(1, Ordering::SeqCst);
    }
}
