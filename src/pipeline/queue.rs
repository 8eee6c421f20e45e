//! The state one pipeline's fetcher, workers and heartbeater share: the bounded queue of leased rows and the
//! ledger of every lease the pipeline holds (queued, in processing, or in an apply not yet answered) with its
//! local deadline.
//!
//! The queue's size follows dstack (max ceil(workers × 2.0), fetch below ceil(workers × 0.5)) until the workers
//! outrun the fetcher: when a worker found the queue empty since the last fetch and that fetch leased all it asked
//! for (the store has more ready rows), the fetcher doubles the queue's size, up to `fetch_limit_max` rows, keeping
//! the two marks' ratio; a fetch that gets fewer rows than it asked for (no backlog) brings it back to dstack's
//! size. Fast items thus come in large fetches, one statement for many rows (DESIGN §3, Batching), while slow
//! items, whose workers never wait for the queue, keep the small queue and the short lease wait of dstack.

use super::config::PipelineConfig;
use crate::store::{Lease, Row, RowId};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// The queue's marks: its max and the length below which the fetcher fetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    /// Most items queued.
    pub max: usize,
    /// Fetch while the queue is shorter than this.
    pub low: usize,
}

/// Queue, ledger and wake-ups of one pipeline.
pub struct Shared {
    /// dstack's marks, from the config: the queue's size while the fetcher keeps up.
    base: Marks,
    /// The largest queue max: [`PipelineConfig::fetch_limit_max`], or the base max if larger.
    cap: usize,
    marks: Mutex<Marks>,
    /// A worker found the queue empty since the last fetch.
    starved: AtomicBool,
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
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Empty state sized by `config`.
    pub fn new(config: &PipelineConfig) -> Shared {
        let base = Marks { max: config.queue_len_max(), low: config.queue_len_low() };
        Shared {
            base,
            cap: config.fetch_limit_max.max(base.max),
            marks: Mutex::new(base),
            starved: AtomicBool::new(false),
            queue: Mutex::new(VecDeque::new()),
            items: Semaphore::new(0),
            leases: Mutex::new(BTreeMap::new()),
            refill: Notify::new(),
            hint: Notify::new(),
            stop: Notify::new(),
            stopping: AtomicBool::new(false),
        }
    }

    /// Items waiting for a worker.
    pub fn queue_len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// The queue's marks now.
    pub fn marks(&self) -> Marks {
        *lock(&self.marks)
    }

    /// How many rows the next fetch may lease: queue max − size.
    pub fn fetch_limit(&self) -> usize {
        self.marks().max.saturating_sub(self.queue_len())
    }

    /// After a fetch that leased `fetched` of the `limit` rows it asked for: doubles the queue's size (up to the
    /// cap) if a worker found the queue empty since the last fetch and the store had every row asked for, or
    /// brings it back to dstack's size if the store had fewer (see the module doc). Returns the new marks.
    pub fn adapt(&self, fetched: usize, limit: usize) -> Marks {
        let starved = self.starved.swap(false, Ordering::SeqCst);
        let mut marks = lock(&self.marks);
        if fetched < limit {
            *marks = self.base;
        } else if starved && marks.max < self.cap {
            let max = (marks.max * 2).min(self.cap);
            // The base ratio of the marks (dstack's 0.5 / 2.0), at least the base low mark.
            let low = (max * self.base.low).div_ceil(self.base.max).max(self.base.low);
            *marks = Marks { max, low };
        }
        *marks
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
            let max = self.marks().max;
            assert!(queue.len() <= max, "queue {} past its max {max}", queue.len());
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
                self.starved.store(true, Ordering::SeqCst);
                self.items.acquire().await.ok()?
            }
        };
        permit.forget();
        let (item, len) = {
            let mut queue = lock(&self.queue);
            (queue.pop_front().expect("a permit without an item"), queue.len())
        };
        if len < self.marks().low {
            self.refill.notify_one();
        }
        Some(item)
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
