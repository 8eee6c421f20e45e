//! The state one pipeline's fetcher, workers and heartbeater share: the bounded queue of leased rows and the
//! ledger of every lease the pipeline holds (queued, in processing, or in an apply not yet answered) with its
//! local deadline.
//!
//! The queue's size follows dstack (max ceil(workers × 2.0), fetch below ceil(workers × 0.5)) until the workers
//! outrun the fetcher: when a worker found the queue empty since the last fetch and that fetch leased all it asked
//! for (the store has more ready rows), the fetcher doubles the queue's size, up to `fetch_limit_max` rows, keeping
//! the two marks' ratio; `fetchers` + 1 full fetches in a row after which no worker found the queue empty halve a
//! grown queue (down to dstack's size), and a fetch that gets fewer rows than it asked for (no backlog) brings it
//! back to dstack's size at once. Fast items thus come in large fetches, one statement for many rows (DESIGN §3,
//! Batching), while slow items, whose workers never wait for the queue, keep or regain the small queue and the
//! short lease wait of dstack, also when a backlog's items turn slow.
//!
//! While the queue is grown, up to `fetchers` fetches may be in flight at once, so that a store call's latency
//! does not bound the pipeline to one fetch's rows per round trip. Each fetch reserves the room its rows will
//! take ([`Shared::reserve`]): a fetch leases at most the queue's max, and is sent only while the queue plus the
//! reservations of the fetches in flight leave it room under `fetchers` × the queue's max (dstack's max while the
//! queue is at dstack's size). A fetch still in flight when the queue shrinks back may overfill the smaller queue
//! once; the queue plus reservations never pass `fetchers` × `fetch_limit_max`. Only the first fetcher runs while
//! the queue is at dstack's size, so an idle pipeline polls the store as dstack's does. A queue that cannot grow
//! (`fetch_limit_max` at most dstack's max, as in per-item mode, where a fetch leases one row) counts as grown for
//! this rule while its workers outrun it: from a fetch that leased every row it asked for after a worker found the
//! queue empty, until a fetch leases fewer (the store has no backlog). A fetch that gives its
//! room back below the lower mark wakes the fetchers, as a worker's pop would.
//!
//! A replica keeps no more leases than its workers can start within a lease time (a replica whose
//! workers were busy with slow items held a queue of leases alive by heartbeat while other replicas idled). The
//! span a queued lease can wait before the heartbeater must extend it is the *start window*: lease ttl − margin −
//! `heartbeat_trigger`. When an item is still queued at the end of its start window, the heartbeater takes it out
//! of the queue ([`Shared::take_queued`]) and gives its lease back to the store instead of extending it, and the
//! pipeline becomes *saturated* ([`Shared::saturate`]): a fetch then leases at most as many rows as its workers
//! can start within a start window, judged by what they did: the idle workers, plus the items workers took from
//! the queue within the last start window, less the items queued or being fetched. The rows it leaves wait in the
//! store, where any replica's idle worker can take them. Saturation ends once that allowance reaches the queue's
//! max (the workers start items fast again). A worker that finds the queue empty wakes the fetchers, so a
//! saturated pipeline fetches for each worker that frees up.

use super::clock::LocalClock;
use super::config::PipelineConfig;
use crate::store::{Lease, Row, RowId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    /// Local instant the fetch that leased it was sent: the row is the store's as of then, or later.
    pub fetched_at: Instant,
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
    /// While a worker runs the item's handler (`load`, then `process`) under a
    /// [`PipelineConfig::handler_timeout`]: the local instant it times out at. `None` otherwise. The heartbeater
    /// renews no lease whose handler ran past it.
    pub handler_deadline: Option<Instant>,
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
    /// Fetch loops of the pipeline ([`PipelineConfig::fetchers`]).
    fetchers: usize,
    /// A worker found the queue empty since the last fetch.
    starved: AtomicBool,
    /// Full fetches in a row after which no worker had found the queue empty (see [`Shared::adapt`]).
    kept_up: AtomicUsize,
    /// The queue cannot grow (its cap is dstack's max) and its workers outran the last full fetch: the other
    /// fetchers fetch as if it were grown (see the module doc).
    outran: AtomicBool,
    /// Workers waiting for an item (in [`Shared::pop`] with the queue empty).
    idle: AtomicUsize,
    /// Whether the pipeline is saturated (see the module doc).
    saturated: AtomicBool,
    /// The start window (see the module doc), local clock.
    start_window: Duration,
    /// Local instants at which workers took items from the queue, oldest first: the last `cap` of them (an
    /// allowance of `cap` needs no more).
    starts: Mutex<VecDeque<Instant>>,
    queue: Mutex<Queue>,
    /// One permit per queued item; closed when the pipeline stops taking work.
    items: Semaphore,
    leases: Mutex<BTreeMap<RowId, Held>>,
    /// The handlers running under a time-out, by lease: the handler's deadline (local clock) and the signal that
    /// gives the handler up ([`Shared::start_handler`], [`Shared::cut_handlers`]). By lease, not by row: a handler
    /// that hangs past its lease's loss may meet its row leased again by this replica, and a second handler of
    /// the row must not take the first one's signal (the first then hung for good, holding its worker and the
    /// drain: the simulator's `handler-hang` fault found it).
    handlers: Mutex<BTreeMap<Lease, RunningHandler>>,
    /// Wakes the first fetcher: a worker dropped the queue below its lower mark.
    pub refill: Notify,
    /// Wake the other fetchers, one each, on the same events as `refill` (they never wait for hints: a hint must
    /// reach the first fetcher, which alone backs off). One each, so that [`Shared::close`] leaves every one of
    /// them a stored wake-up.
    pub refill_more: Vec<Notify>,
    /// Wakes the fetcher: a fetch hint for this pipeline's kind arrived.
    pub hint: Notify,
    /// The local instants at which rows this replica failed fall due for their retries ([`Shared::note_retry`]),
    /// each until it passes.
    retry_due: Mutex<BTreeSet<Instant>>,
    /// Wakes the first fetcher: [`Shared::note_retry`] set an earlier `retry_due`, so a backoff it sleeps may end
    /// sooner.
    pub retry_noted: Notify,
    /// Items that ended in a row turned away by related rows that items of the pipeline in another replica hold
    /// (reset for retry), since an item ended any other way ([`Shared::note_ended`]); a contention backoff sets it
    /// one short of a full queue's worth (the probe).
    contended_streak: AtomicUsize,
    /// The first fetcher is backing off for contention ([`Shared::backs_off_for_contention`]) and no item has
    /// ended otherwise since.
    contention_backoff: AtomicBool,
    /// Wakes the first fetcher from a contention backoff: an item ended otherwise than turned away (its replica's
    /// items may hold the rows now, so its backlog can be worked again).
    pub contention_ended: Notify,
    /// The next parked waiter's [`Parked::seq`].
    parked_seq: std::sync::atomic::AtomicU64,
    /// [`PipelineConfig::park_wake_disabled_for_mutation_test`]: wake hints wake no one.
    park_wake_disabled: bool,
    /// Parked waiters by row (DESIGN §3, "Parked waiters"): items whose related lock was contended, kept with their
    /// leases (the heartbeater renews them: they stay in the ledger) and no worker, until a wake hint names a row
    /// they wait on ([`Shared::wake_rows`]) or their due instant passes ([`Shared::wake_due`]). At most
    /// [`Shared::parked_max`].
    parked: Mutex<BTreeMap<RowId, Parked>>,
    /// Wakes the heartbeater's timer: a waiter was parked (its due instant may be earlier than the timer's).
    pub parked_noted: Notify,
    /// Wakes everything that waits on the pipeline's services when it stops.
    pub stop: Notify,
    stopping: AtomicBool,
}

/// A parked waiter ([`Shared::park`]).
struct Parked {
    item: Item,
    /// The related rows it asked for; a wake hint naming any of them wakes it.
    rows: Vec<RowId>,
    /// Local instant it is woken at the latest: when the longest lock it met expires.
    due: Instant,
    /// Order of parking, so the oldest waiter goes first in the queue.
    seq: u64,
}

/// A handler running under a time-out ([`Shared::start_handler`]).
struct RunningHandler {
    /// Local instant it times out at.
    deadline: Instant,
    /// Given (once) when the deadline passed: the worker gives the handler up.
    cut: std::sync::Arc<Notify>,
}

/// The queued items and the room that fetches in flight hold in it.
struct Queue {
    items: VecDeque<Item>,
    /// Rows the fetches in flight may still lease, summed over their reservations.
    reserved: usize,
}

/// Room in the queue held by one fetch in flight (see the module doc): at most [`Reservation::limit`] rows. Fill it
/// with the fetched rows ([`Reservation::fill`]); dropping it unfilled (the fetch failed) gives the room back.
pub struct Reservation<'a> {
    shared: &'a Shared,
    limit: usize,
    capped: bool,
}

impl Reservation<'_> {
    /// Most rows the fetch may lease.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the limit is the idle workers' of a saturated pipeline (see the module doc): such a fetch says
    /// nothing about whether the queue should grow.
    pub fn capped(&self) -> bool {
        self.capped
    }

    /// Queues the fetched rows and records their leases (`sent`: when the fetch was sent), giving back the room.
    /// Returns how many were queued: a row the ledger already holds under a newer token (another fetch took it
    /// again after this one's lease expired) is dropped. Panics if the fetch returned more rows than its limit.
    pub fn fill(mut self, items: Vec<Item>, sent: Instant, ttl: Duration, margin: Duration) -> usize {
        assert!(items.len() <= self.limit, "fetch returned {} rows past its limit {}", items.len(), self.limit);
        let limit = std::mem::take(&mut self.limit);
        self.shared.push(limit, items, sent, ttl, margin)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.limit > 0 {
            let len = {
                let mut queue = lock(&self.shared.queue);
                queue.reserved -= self.limit;
                queue.items.len()
            };
            self.shared.room_returned(len);
        }
    }
}

/// One worker counted in [`Shared::idle_workers`] while this lives.
struct Idle<'a>(&'a AtomicUsize);

impl Idle<'_> {
    fn new(count: &AtomicUsize) -> Idle<'_> {
        count.fetch_add(1, Ordering::SeqCst);
        Idle(count)
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Drops the instants of `retry_due` at or before `now`.
fn forget_passed(retry_due: &mut BTreeSet<Instant>, now: Instant) {
    while retry_due.first().is_some_and(|&first| first <= now) {
        retry_due.pop_first();
    }
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
            fetchers: config.fetchers,
            starved: AtomicBool::new(false),
            kept_up: AtomicUsize::new(0),
            outran: AtomicBool::new(false),
            idle: AtomicUsize::new(0),
            saturated: AtomicBool::new(false),
            start_window: config.lease_ttl.saturating_sub(config.lease_margin + config.heartbeat_trigger),
            starts: Mutex::new(VecDeque::new()),
            queue: Mutex::new(Queue { items: VecDeque::new(), reserved: 0 }),
            items: Semaphore::new(0),
            leases: Mutex::new(BTreeMap::new()),
            handlers: Mutex::new(BTreeMap::new()),
            refill: Notify::new(),
            refill_more: (1..config.fetchers).map(|_| Notify::new()).collect(),
            hint: Notify::new(),
            retry_due: Mutex::new(BTreeSet::new()),
            retry_noted: Notify::new(),
            contended_streak: AtomicUsize::new(0),
            contention_backoff: AtomicBool::new(false),
            contention_ended: Notify::new(),
            parked_seq: std::sync::atomic::AtomicU64::new(0),
            park_wake_disabled: config.park_wake_disabled_for_mutation_test,
            parked: Mutex::new(BTreeMap::new()),
            parked_noted: Notify::new(),
            stop: Notify::new(),
            stopping: AtomicBool::new(false),
        }
    }

    /// Items waiting for a worker.
    pub fn queue_len(&self) -> usize {
        lock(&self.queue).items.len()
    }

    /// Rows the fetches in flight may still lease.
    pub fn reserved(&self) -> usize {
        lock(&self.queue).reserved
    }

    /// The queue's marks now.
    pub fn marks(&self) -> Marks {
        *lock(&self.marks)
    }

    /// Reserves room for a fetch by fetcher `fetcher` (0 is the first) at local instant `now`, or `None` when no
    /// fetch is due: the queue is at or above its lower mark, its room is held by fetches in flight, `fetcher` is
    /// not the first and the queue is at dstack's size, or the pipeline is saturated and its workers can start
    /// nothing more within a start window (see the module doc). The limit is queue max − size − reserved while the
    /// queue is at dstack's size (dstack's own rule when one fetch is in flight), at most the queue's max while it
    /// is grown, and at most the saturated pipeline's allowance less the items queued and reserved.
    pub fn reserve(&self, fetcher: usize, now: Instant) -> Option<Reservation<'_>> {
        let marks = self.marks();
        let grown = marks.max > self.base.max || self.outran.load(Ordering::SeqCst);
        if fetcher > 0 && !grown {
            return None;
        }
        let allowance = self.allowance(now, marks.max);
        let mut queue = lock(&self.queue);
        if queue.items.len() >= marks.low {
            return None;
        }
        let held = queue.items.len() + queue.reserved;
        let room = if grown { marks.max * self.fetchers } else { marks.max };
        let mut limit = marks.max.min(room.saturating_sub(held));
        if let Some(allowance) = allowance {
            limit = limit.min(allowance.saturating_sub(held));
        }
        if limit == 0 {
            return None;
        }
        queue.reserved += limit;
        Some(Reservation { shared: self, limit, capped: allowance.is_some() })
    }

    /// How many items a saturated pipeline's workers can start within a start window from `now`: the idle workers
    /// plus the items taken from the queue in the last start window. `None` when the pipeline is not saturated,
    /// or the allowance reached `max` (the queue's max), which ends the saturation.
    fn allowance(&self, now: Instant, max: usize) -> Option<usize> {
        if !self.saturated.load(Ordering::SeqCst) {
            return None;
        }
        let since = now.checked_sub(self.start_window);
        let starts = lock(&self.starts);
        let recent = starts.iter().rev().take_while(|at| since.is_none_or(|since| **at > since)).count();
        let allowance = self.idle.load(Ordering::SeqCst) + recent;
        if allowance >= max {
            self.saturated.store(false, Ordering::SeqCst);
            return None;
        }
        Some(allowance)
    }

    /// Saturates the pipeline (see the module doc): the heartbeater gave back the lease of an item no worker
    /// started within its start window. The queue returns to dstack's size.
    pub fn saturate(&self) {
        self.saturated.store(true, Ordering::SeqCst);
        self.outran.store(false, Ordering::SeqCst);
        *lock(&self.marks) = self.base;
    }

    /// Whether the pipeline is saturated.
    pub fn is_saturated(&self) -> bool {
        self.saturated.load(Ordering::SeqCst)
    }

    /// Workers waiting for an item now.
    pub fn idle_workers(&self) -> usize {
        self.idle.load(Ordering::SeqCst)
    }

    /// Takes the items of `leases` that are still queued out of the queue, so that no worker starts them, and
    /// returns them (their leases stay in the ledger; the caller releases and forgets them). An item a worker is
    /// about to take (it holds the item's permit) is left to that worker.
    pub fn take_queued(&self, leases: &[Lease]) -> Vec<Item> {
        let mut queue = lock(&self.queue);
        let mut taken = Vec::new();
        for lease in leases {
            let Some(at) = queue.items.iter().position(|item| item.lease == *lease) else { continue };
            // Each queued item is promised to a permit: a worker that acquired one pops whatever item is at the
            // front. Taking an item out takes a permit too, so every worker that holds one still finds an item;
            // with no permit left, every queued item is promised to a worker about to pop it.
            match self.items.try_acquire() {
                Ok(permit) => permit.forget(),
                Err(_) => break,
            }
            taken.push(queue.items.remove(at).expect("a queued item at its position"));
        }
        taken
    }

    /// After a fetch that leased `fetched` of the `limit` rows it asked for: doubles the queue's size (up to the
    /// cap) if a worker found the queue empty since the last fetch and the store had every row asked for, halves a
    /// grown queue (down to dstack's size) once no worker did through `fetchers` + 1 full fetches in a row, or
    /// brings it back to dstack's size if the store had fewer (see the module doc). A queue that cannot grow counts
    /// as grown from such a fetch until one that leases fewer rows. Returns the new marks.
    pub fn adapt(&self, fetched: usize, limit: usize) -> Marks {
        let starved = self.starved.swap(false, Ordering::SeqCst);
        let mut marks = lock(&self.marks);
        if fetched < limit {
            *marks = self.base;
            self.outran.store(false, Ordering::SeqCst);
        } else if starved && self.cap <= self.base.max {
            self.outran.store(true, Ordering::SeqCst);
        } else if starved && marks.max < self.cap {
            *marks = self.scaled((marks.max * 2).min(self.cap));
        }
        // The workers kept up with the queue through `fetchers` + 1 full fetches in a row (items that turned slow
        // in a backlog): a grown queue would only keep rows leased that they cannot start soon (a new user's
        // trial: a queue grown on fast items held about 1 000 leases through 37 s of slow ones, each waiting about
        // 1 s). One fetch is not enough: with several fetchers, one fetch's rows can arrive before the workers
        // emptied another's.
        let kept_up = if starved || fetched < limit { 0 } else { self.kept_up.load(Ordering::SeqCst) + 1 };
        if kept_up > self.fetchers && marks.max > self.base.max {
            *marks = self.scaled((marks.max / 2).max(self.base.max));
            self.kept_up.store(0, Ordering::SeqCst);
        } else {
            self.kept_up.store(kept_up, Ordering::SeqCst);
        }
        *marks
    }

    /// Marks of a queue of `max` rows: the base ratio of the marks (dstack's 0.5 / 2.0), at least the base low mark.
    fn scaled(&self, max: usize) -> Marks {
        let low = (max * self.base.low).div_ceil(self.base.max).max(self.base.low);
        Marks { max, low }
    }

    /// Leases held: queued plus in processing.
    pub fn leases_len(&self) -> usize {
        lock(&self.leases).len()
    }

    /// Queues fetched rows and records their leases, giving back the room `reserved` of a fetch sent at `sent`.
    fn push(&self, reserved: usize, items: Vec<Item>, sent: Instant, ttl: Duration, margin: Duration) -> usize {
        let (queued, len) = {
            let mut leases = lock(&self.leases);
            let mut queue = lock(&self.queue);
            queue.reserved -= reserved;
            let mut queued = 0;
            for item in items {
                let deadline = sent + ttl - margin;
                let held = Held { token: item.lease.token, leased_at: sent, deadline, handler_deadline: None };
                // The ledger may already hold another lease of this row. An older one: after a stall longer than
                // the ttl (a paused process), the store's lease expired and this pipeline's fetch took the row
                // again before the heartbeater or the old worker noticed; the new lease supersedes it, the old
                // worker's apply is stale and its `forget` (guarded by token) leaves the new entry alone. A newer
                // one: with several fetchers, a fetch that stalled past the ttl answers after another fetch took
                // the row again; its lease is the lost one and its item is dropped here. Tokens only grow.
                match leases.get(&item.lease.id) {
                    Some(newer) if newer.token > item.lease.token => continue,
                    Some(same) => assert!(
                        same.token != item.lease.token,
                        "row {} queued twice with token {}",
                        item.lease.id,
                        same.token
                    ),
                    None => {}
                }
                leases.insert(item.lease.id, held);
                queue.items.push_back(item);
                queued += 1;
            }
            // Woken waiters join the queue past its marks: at most `parked_max` of them.
            let room = self.cap * self.fetchers + self.parked_max();
            let held = queue.items.len() + queue.reserved;
            assert!(held <= room, "queue {} plus reserved {} past its room {room}", queue.items.len(), queue.reserved);
            (queued, queue.items.len())
        };
        self.items.add_permits(queued);
        self.room_returned(len);
        queued
    }

    /// A fetch gave its room back with `len` items queued: a fetcher that found the room held by that fetch waits
    /// for a refill, and below the lower mark one may not come from the workers (an empty queue has no pops), so
    /// it comes from here.
    fn room_returned(&self, len: usize) {
        if len < self.marks().low {
            self.wake_fetchers();
        }
    }

    /// Wakes every fetcher waiting for a refill (stored permits: a fetcher not yet waiting wakes at once).
    fn wake_fetchers(&self) {
        self.refill.notify_one();
        for notify in &self.refill_more {
            notify.notify_one();
        }
    }

    /// Waits for the next item; `None` once the pipeline stops taking work. Wakes the fetcher when the queue
    /// drops below its lower mark (event-driven refill, DESIGN §3), or when it finds the queue empty. Records the
    /// start at `clock`'s now (see the module doc).
    pub async fn pop(&self, clock: &LocalClock) -> Option<Item> {
        self.promise().await?;
        self.take_promised(clock)
    }

    /// Waits for a permit, the promise of a queued item (see [`Shared::pop`]); `None` once the pipeline stops
    /// taking work.
    async fn promise(&self) -> Option<()> {
        let permit = match self.items.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {
                self.starved.store(true, Ordering::SeqCst);
                // Counted idle until the wait ends, or is dropped (an aborted worker).
                let _idle = Idle::new(&self.idle);
                // An idle worker is a reason to fetch even when no pop crossed the lower mark: the heartbeater
                // may have emptied the queue (see the module doc).
                self.wake_fetchers();
                self.items.acquire().await.ok()?
            }
        };
        permit.forget();
        Some(())
    }

    /// Takes the item a permit promised; `None` if [`Shared::close`] drained the queue since the permit was
    /// given (on a multi-threaded runtime a worker can hold a permit, not yet the queue's lock, while the
    /// pipeline shuts down: the item is among those `close` returned to release, and the worker stops).
    fn take_promised(&self, clock: &LocalClock) -> Option<Item> {
        let (item, len) = {
            let mut queue = lock(&self.queue);
            let Some(item) = queue.items.pop_front() else {
                assert!(self.is_stopping(), "a permit without an item while the pipeline runs");
                return None;
            };
            (item, queue.items.len())
        };
        {
            let mut starts = lock(&self.starts);
            if starts.len() == self.cap {
                starts.pop_front();
            }
            starts.push_back(clock.now());
        }
        if len < self.marks().low {
            self.wake_fetchers();
        }
        Some(item)
    }

    /// Stops handing out items and returns those still queued (their leases stay in the ledger until released).
    pub fn close(&self) -> Vec<Item> {
        self.stopping.store(true, Ordering::SeqCst);
        self.items.close();
        // Stored permits, so a fetcher between its stop check and its wait still wakes.
        self.wake_fetchers();
        self.hint.notify_one();
        self.stop.notify_waiters();
        // The parked waiters' lock first: a wake holds it while it queues its waiters, so none lands in the queue
        // after the drain.
        let mut parked = lock(&self.parked);
        let mut items: Vec<Item> = lock(&self.queue).items.drain(..).collect();
        let mut parked: Vec<Parked> = std::mem::take(&mut *parked).into_values().collect();
        parked.sort_by_key(|waiter| waiter.seq);
        items.extend(parked.into_iter().map(|waiter| waiter.item));
        items
    }

    /// A row a worker failed at local time `now` falls due for its retry at the local instant `due` (its
    /// [`Retry::After`] delay from the failure's answer, plus the fetch's expiry slack). The first fetcher ends a
    /// backoff it sleeps at the earliest such instant, so the row is fetched when its retry falls due rather than
    /// when the backoff ends (the retries; a new user's trial saw a 1 s retry wait 3.6 s). Every instant
    /// is kept until it passes, so a later retry is not lost behind an earlier one.
    ///
    /// [`Retry::After`]: crate::store::Retry::After
    pub fn note_retry(&self, due: Instant, now: Instant) {
        let mut retry_due = lock(&self.retry_due);
        forget_passed(&mut retry_due, now);
        let earliest = retry_due.first().is_none_or(|&first| due < first);
        retry_due.insert(due);
        drop(retry_due);
        if earliest {
            self.retry_noted.notify_one();
        }
    }

    /// The earliest retry instant noted ([`Shared::note_retry`]) that is later than `now`; those at or before
    /// `now` are forgotten, as the fetch about to run covers them.
    pub fn retry_due_after(&self, now: Instant) -> Option<Instant> {
        let mut retry_due = lock(&self.retry_due);
        forget_passed(&mut retry_due, now);
        retry_due.first().copied()
    }

    /// Whether a retry noted ([`Shared::note_retry`]) fell due at or before `now` and was not yet taken: the first
    /// fetcher takes them before a pass, so that a pass that fetches nothing for want of room can hand the rows to
    /// the other replicas ([`super::fetcher`]).
    pub fn take_due_retries(&self, now: Instant) -> bool {
        let mut retry_due = lock(&self.retry_due);
        let due = retry_due.first().is_some_and(|&first| first <= now);
        forget_passed(&mut retry_due, now);
        due
    }

    /// An item ended: `contended` when related rows that items of the pipeline in another replica hold turned it
    /// away (its lease reset for retry; [`ItemOutcome::Retried`](super::ItemOutcome::Retried)), which lengthens
    /// the contention streak; any other end (applied, failed, stale, or turned away by another pipeline's rows or
    /// by an item of this replica whose turn it waited for too long) breaks it, and ends a contention backoff the
    /// first fetcher sleeps: the pipeline's items got their rows again (an item that was turned away before the
    /// backoff began may have been the last to end). A streak that reaches a full queue's worth wakes the first
    /// fetcher, which backs off at once and gives back what is queued ([`Shared::backs_off_for_contention`]).
    pub fn note_ended(&self, contended: bool) {
        if contended {
            if self.contended_streak.fetch_add(1, Ordering::SeqCst) + 1 == self.base.max {
                self.refill.notify_one();
            }
        } else {
            self.contended_streak.store(0, Ordering::SeqCst);
            if self.contention_backoff.swap(false, Ordering::SeqCst) {
                self.contention_ended.notify_one();
            }
        }
    }

    /// Whether the first fetcher should back off instead of fetching, and give back what is queued: the last items
    /// to end, at least dstack's queue max of them (a full queue's worth), were all turned away by related rows that
    /// items of the pipeline hold in another replica. More of the backlog would meet the same holders and be reset
    /// too, each reset keeping its row from every replica for `retry_delay`, while the holders' replica, running the
    /// same pipeline, can take that backlog meanwhile: the queued items go back to the store unparked, for it to
    /// take at once. Rows another pipeline holds never count: that pipeline cannot take this one's backlog, and
    /// backing off would only cede the rows to it (the simulator's `rows-shared-two-pipelines` starved claims so).
    /// The backoff ends early when an item ends otherwise ([`Shared::note_ended`], [`Shared::contention_ended`]).
    /// When it answers yes, the fetch after the backoff is a probe (one more item turned away before any ends
    /// otherwise backs off again), the queue returns to dstack's size, and the workers' wait for an item in the
    /// backoff does not count as outrunning the fetch.
    pub fn backs_off_for_contention(&self) -> bool {
        if self.contended_streak.load(Ordering::SeqCst) < self.base.max {
            return false;
        }
        // One more item turned away after the backoff backs off again: the fetch after it is a probe.
        self.contended_streak.store(self.base.max - 1, Ordering::SeqCst);
        self.contention_backoff.store(true, Ordering::SeqCst);
        self.starved.store(false, Ordering::SeqCst);
        self.outran.store(false, Ordering::SeqCst);
        *lock(&self.marks) = self.base;
        true
    }

    /// Takes every queued item out of the queue (see [`Shared::take_queued`]).
    pub fn take_all_queued(&self) -> Vec<Item> {
        let leases: Vec<Lease> = lock(&self.queue).items.iter().map(|item| item.lease).collect();
        self.take_queued(&leases)
    }

    /// The first fetcher's contention backoff ended (whatever woke it): an item that ends later wakes nothing.
    pub fn contention_backoff_over(&self) {
        self.contention_backoff.store(false, Ordering::SeqCst);
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
        drop(leases);
        let mut parked = lock(&self.parked);
        if parked.get(&lease.id).is_some_and(|waiter| waiter.item.lease == lease) {
            parked.remove(&lease.id);
        }
    }

    /// Most items parked at once: dstack's queue max (2 × workers). A contended item past it is reset for retry.
    pub fn parked_max(&self) -> usize {
        self.base.max
    }

    /// Items parked now.
    pub fn parked_len(&self) -> usize {
        lock(&self.parked).len()
    }

    /// Parks `item`, which waits on `rows`, until a wake names one of them or until `due` (local clock); returns
    /// whether it did: false, parking nothing, when the pipeline is stopping, [`Shared::parked_max`] items are
    /// parked, or the ledger no longer holds the item's lease (the caller then resets it or lets it go).
    pub fn park(&self, item: Item, rows: Vec<RowId>, due: Instant) -> bool {
        let lost = lock(&self.leases).get(&item.lease.id).is_none_or(|held| held.token != item.lease.token);
        if self.is_stopping() || lost {
            return false;
        }
        let mut parked = lock(&self.parked);
        if parked.len() >= self.parked_max() {
            return false;
        }
        let seq = self.parked_seq.fetch_add(1, Ordering::SeqCst);
        parked.insert(item.lease.id, Parked { item, rows, due, seq });
        drop(parked);
        self.parked_noted.notify_one();
        true
    }

    /// Wakes the parked waiters on any of `rows` (a wake hint: a write freed them): each goes to the front of the
    /// queue, the oldest first. Every waiter on the row, not only the oldest: waking one a row starved
    /// scenarios/open/claims-pairs-starve.toml (every seed of 20, against none with all woken), as the others waited
    /// out the holder's lease (BENCHMARKS.md, "(7) Retention and the wait queue"). Returns how many were woken.
    pub fn wake_rows(&self, rows: &[RowId]) -> usize {
        if self.park_wake_disabled {
            return 0;
        }
        self.wake(|waiter| waiter.rows.iter().any(|row| rows.contains(row)))
    }

    /// Takes every parked waiter out (see [`Shared::take_all_queued`]: the contention backoff gives their leases
    /// back too, so that the replica holding the rows takes their items).
    pub fn take_all_parked(&self) -> Vec<Item> {
        let parked = std::mem::take(&mut *lock(&self.parked));
        parked.into_values().map(|waiter| waiter.item).collect()
    }

    /// Wakes the parked waiters whose due instant passed at `now` (the lock they met expired).
    pub fn wake_due(&self, now: Instant) -> usize {
        self.wake(|waiter| waiter.due <= now)
    }

    /// Wakes every parked waiter (hints were lost: a lag or the catch-up hint).
    pub fn wake_all(&self) -> usize {
        self.wake(|_| true)
    }

    /// The earliest due instant of a parked waiter.
    pub fn next_park_due(&self) -> Option<Instant> {
        lock(&self.parked).values().map(|waiter| waiter.due).min()
    }

    fn wake(&self, woken: impl Fn(&Parked) -> bool) -> usize {
        // Under the parked waiters' lock throughout, so that `close` takes every waiter not yet queued.
        let mut parked = lock(&self.parked);
        if self.is_stopping() {
            return 0;
        }
        let ids: Vec<RowId> = parked.iter().filter(|(_, waiter)| woken(waiter)).map(|(id, _)| *id).collect();
        if ids.is_empty() {
            return 0;
        }
        let mut waiters: Vec<Parked> = ids.iter().filter_map(|id| parked.remove(id)).collect();
        // The oldest waiter ends at the front: push the youngest first.
        waiters.sort_by_key(|waiter| std::cmp::Reverse(waiter.seq));
        let count = waiters.len();
        {
            let mut queue = lock(&self.queue);
            for waiter in waiters {
                queue.items.push_front(waiter.item);
            }
        }
        self.items.add_permits(count);
        count
    }

    /// A copy of the ledger, by row id.
    pub fn leases(&self) -> BTreeMap<RowId, Held> {
        lock(&self.leases).clone()
    }

    /// Notes that a worker started `lease`'s handler, which times out at `deadline` (local clock); returns the
    /// signal that [`Shared::cut_handlers`] gives once the deadline passed. The worker waits on it beside the
    /// handler rather than on a timer of its own: a timer per item would wake every worker task once more at its
    /// deadline, long after the item ended, and reshuffle the simulator's schedule.
    pub fn start_handler(&self, lease: Lease, deadline: Instant) -> std::sync::Arc<Notify> {
        if let Some(held) = lock(&self.leases).get_mut(&lease.id)
            && held.token == lease.token
        {
            held.handler_deadline = Some(deadline);
        }
        let cut = std::sync::Arc::new(Notify::new());
        let running = RunningHandler { deadline, cut: cut.clone() };
        lock(&self.handlers).insert(lease, running);
        cut
    }

    /// Notes that `lease`'s handler returned (or was given up).
    pub fn end_handler(&self, lease: Lease) {
        if let Some(held) = lock(&self.leases).get_mut(&lease.id)
            && held.token == lease.token
        {
            held.handler_deadline = None;
        }
        lock(&self.handlers).remove(&lease);
    }

    /// Signals every handler whose deadline passed at `now` to be given up (the heartbeater's pass); returns their
    /// leases.
    pub fn cut_handlers(&self, now: Instant) -> Vec<Lease> {
        let handlers = lock(&self.handlers);
        let past = handlers.iter().filter(|(_, running)| now >= running.deadline);
        past.map(|(lease, running)| {
            running.cut.notify_one();
            *lease
        })
        .collect()
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

#[cfg(all(test, not(madsim)))]
mod tests {
    use crate::pipeline::{Pipeline, PipelineConfig};
    use crate::store::{MemStore, NewRow, Store, Timestamp, TokioClock};
    use std::sync::Arc;

    /// CI's loaded run of the PostgreSQL drain bench: a worker took a permit, the pipeline shut down and drained
    /// the queue before the worker took the queue's lock, and the worker panicked ("a permit without an item").
    /// The interleaving needs two threads, so neither madsim nor a paused clock makes it; the halves of `pop` are
    /// run here in that order by hand.
    #[tokio::test(start_paused = true)]
    async fn a_worker_holding_a_permit_when_the_pipeline_closes_stops_without_an_item() {
        let store = MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000)));
        store.insert(NewRow::new("task", "ready", serde_json::json!({}))).await.unwrap();
        let pipeline = Pipeline::new(Arc::new(store), PipelineConfig::new("tasks", "task", &["ready"])).unwrap();
        pipeline.fetcher(1).run_once().await.unwrap();
        pipeline.shared.promise().await.expect("a permit for the queued item");
        let released = pipeline.shared.close();
        assert_eq!(released.len(), 1, "close returns the promised item, to be released");
        assert!(pipeline.shared.take_promised(&pipeline.clock).is_none(), "the worker stops");
    }

    /// Retries noted in any order are each kept until they pass: a later retry noted while an earlier one was
    /// pending is not lost when the earlier passes (the simulator's rows-retry-wake found a single "earliest"
    /// slot dropping it, and the row waited out the fetcher's backoff).
    #[tokio::test(start_paused = true)]
    async fn every_noted_retry_is_kept_until_it_passes() {
        let shared = super::Shared::new(&PipelineConfig::new("tasks", "task", &["ready"]));
        let t0 = tokio::time::Instant::now();
        let at = |millis: u64| t0 + std::time::Duration::from_millis(millis);
        shared.note_retry(at(500), t0);
        shared.note_retry(at(2_000), t0);
        shared.note_retry(at(1_000), t0);
        assert_eq!(shared.retry_due_after(t0), Some(at(500)));
        assert_eq!(shared.retry_due_after(at(500)), Some(at(1_000)), "the instant itself has passed");
        assert_eq!(shared.retry_due_after(at(1_500)), Some(at(2_000)));
        shared.note_retry(at(3_000), at(2_500));
        assert_eq!(shared.retry_due_after(at(2_500)), Some(at(3_000)), "noting forgets what passed");
        assert_eq!(shared.retry_due_after(at(3_000)), None);
    }

    /// A grown queue halves at every `fetchers` + 1 full fetches in a row after which no worker found it empty, down
    /// to dstack's size and no further; a starved full fetch restarts the count and grows it again.
    #[test]
    fn a_grown_queue_halves_while_the_workers_keep_up() {
        let config =
            PipelineConfig { workers: 4, fetch_limit_max: 64, ..PipelineConfig::new("tasks", "task", &["ready"]) };
        let shared = super::Shared::new(&config);
        let base = shared.marks();
        assert_eq!(base, super::Marks { max: 8, low: 2 });
        let starve = |starved: bool| shared.starved.store(starved, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..3 {
            starve(true);
            shared.adapt(64, 64);
        }
        assert_eq!(shared.marks(), super::Marks { max: 64, low: 16 });
        // With the default 2 fetchers, every third full fetch in a row with no worker starved halves it.
        let mut maxes = Vec::new();
        for _ in 0..12 {
            starve(false);
            maxes.push(shared.adapt(64, 64).max);
        }
        assert_eq!(maxes, [64, 64, 32, 32, 32, 16, 16, 16, 8, 8, 8, 8], "halved down to dstack's size");
        for _ in 0..3 {
            starve(true);
            shared.adapt(64, 64);
        }
        starve(false);
        shared.adapt(64, 64);
        starve(true);
        shared.adapt(64, 64);
        starve(false);
        shared.adapt(64, 64);
        starve(false);
        assert_eq!(shared.adapt(64, 64).max, 64, "a starved fetch between restarts the count");
        assert_eq!(shared.adapt(64, 64).max, 32, "the third in a row halves it");
        for _ in 0..6 {
            starve(false);
            shared.adapt(64, 64);
        }
        assert_eq!(shared.marks(), base);
        starve(true);
        assert_eq!(shared.adapt(8, 8), super::Marks { max: 16, low: 4 }, "outran again: it grows");
    }

    /// The contention backoff needs a full queue's worth (dstack's max, 2 × workers) of items turned away in a row,
    /// which wakes the fetcher; any other end breaks the streak; answering brings a grown queue back to dstack's
    /// size and makes the next fetch a probe; an item that ends otherwise during the backoff ends it.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_of_contended_items_in_a_row_backs_the_fetcher_off() {
        use futures_util::FutureExt;
        let config =
            PipelineConfig { workers: 2, fetch_limit_max: 64, ..PipelineConfig::new("tasks", "task", &["ready"]) };
        let shared = super::Shared::new(&config);
        let base = shared.marks();
        assert_eq!(base.max, 4);
        for _ in 0..3 {
            shared.note_ended(true);
        }
        assert!(!shared.backs_off_for_contention(), "three of four");
        shared.note_ended(false);
        for _ in 0..3 {
            shared.note_ended(true);
        }
        assert!(!shared.backs_off_for_contention(), "an applied item broke the streak");
        assert!(shared.refill.notified().now_or_never().is_none(), "no wake before the streak is full");
        shared.note_ended(true);
        assert!(shared.refill.notified().now_or_never().is_some(), "a full streak wakes the fetcher");
        shared.starved.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_ne!(shared.adapt(8, 8), base, "a starved full fetch grows the queue");
        assert!(shared.backs_off_for_contention(), "four in a row");
        assert_eq!(shared.marks(), base, "the queue is back at dstack's size");
        assert!(!shared.starved.load(std::sync::atomic::Ordering::SeqCst), "the backoff is no outrunning");
        assert!(!shared.backs_off_for_contention(), "the fetch after the backoff is due");
        shared.note_ended(true);
        assert!(shared.backs_off_for_contention(), "the probe's first item turned away backs off again");
        shared.contention_backoff_over();
        shared.note_ended(false);
        assert!(shared.contention_ended.notified().now_or_never().is_none(), "the backoff was over");
        shared.note_ended(true);
        assert!(!shared.backs_off_for_contention(), "an item that ended otherwise restarted the streak");
        for _ in 0..3 {
            shared.note_ended(true);
        }
        assert!(shared.backs_off_for_contention());
        // An item that ends otherwise wakes the fetcher from its backoff, once; outside a backoff nothing.
        shared.note_ended(false);
        assert!(shared.contention_ended.notified().now_or_never().is_some(), "applied during the backoff");
        shared.note_ended(false);
        assert!(shared.contention_ended.notified().now_or_never().is_none(), "no backoff, no wake");
    }

    /// A handler that hangs past its lease's loss, whose row this replica leases again and starts a second handler
    /// for, is still cut at its own deadline: the second handler does not take its signal.
    #[tokio::test(start_paused = true)]
    async fn a_hung_handler_is_cut_after_its_row_was_leased_again() {
        use crate::store::{Lease, LockToken, RowId};
        use tokio::time::{Duration, Instant};
        let shared = super::Shared::new(&PipelineConfig::new("tasks", "task", &["ready"]));
        let start = Instant::now();
        let first = Lease { id: RowId(7), token: LockToken(1) };
        let second = Lease { id: RowId(7), token: LockToken(2) };
        let first_cut = shared.start_handler(first, start + Duration::from_secs(5));
        let second_cut = shared.start_handler(second, start + Duration::from_secs(20));
        assert_eq!(shared.cut_handlers(start + Duration::from_secs(6)), vec![first]);
        tokio::time::timeout(Duration::from_millis(1), first_cut.notified()).await.expect("the first handler is cut");
        assert!(tokio::time::timeout(Duration::from_millis(1), second_cut.notified()).await.is_err());
        shared.end_handler(first);
        assert_eq!(shared.cut_handlers(start + Duration::from_secs(21)), vec![second]);
    }
}
