//! The fetcher: leases ready rows into the bounded queue, backs off on empty fetches, wakes on hints and on
//! refill (DESIGN §3; dstack PIPELINES, "Overview" and checklist 1–2).

use super::Core;
use super::config::PipelineConfig;
use super::metrics::Metrics;
use super::queue::Item;
use crate::buggify::{self, Point};
use crate::store::{FetchParams, Lease, Store, StoreError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::Ordering;
use tokio::time::Duration;

/// What one fetch pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchPass {
    /// No fetch was due: the queue was at or above its lower mark, its room was held by fetches in flight, or (a
    /// fetcher other than the first) the queue was at dstack's size. Nothing was fetched.
    Full,
    /// Leased `fetched` rows of at most `limit`.
    Fetched {
        /// Rows leased (0 for an empty fetch).
        fetched: usize,
        /// Most rows the fetch asked for: the room it reserved in the queue
        /// ([`Reservation::limit`](super::queue::Reservation::limit)); a fetch that leased `limit` rows is
        /// followed by another at once.
        limit: usize,
    },
    /// No fetch was made, and the queued items were given back: a full queue's worth of the pipeline's items in a
    /// row were turned away by rows its items in another replica hold ([`Shared::backs_off_for_contention`]); the
    /// fetcher sleeps the first backoff step (not counted as an empty fetch).
    ///
    /// [`Shared::backs_off_for_contention`]: super::queue::Shared::backs_off_for_contention
    Contended,
}

/// One pipeline's fetcher. Drive it with [`Fetcher::run_once`] in tests; [`Fetcher::run`] is its loop.
pub struct Fetcher<S: Store> {
    core: Core<S>,
    rng: ChaCha8Rng,
    empty_streak: u32,
    /// What the last fetch found out about the rows it had to skip: how long until the first of their leases ends
    /// (only after a fetch that leased nothing; [`Store::fetch_with_expiry`]).
    expiry: Option<Duration>,
}

/// The delay after the `empty_streak`-th consecutive empty fetch (1-based): the backoff sequence by streak, the
/// shortest one with `fetch_shortest_chance`, times a uniform factor in [1 − jitter, 1 + jitter] (DESIGN §3).
pub fn fetch_backoff(config: &PipelineConfig, empty_streak: u32, rng: &mut impl Rng) -> Duration {
    let steps = &config.fetch_backoff;
    let step = (empty_streak.max(1) as usize - 1).min(steps.len() - 1);
    let shortest = rng.random_bool(config.fetch_shortest_chance);
    let base = if shortest { steps[0] } else { steps[step] };
    let factor = if config.fetch_jitter > 0.0 {
        rng.random_range(1.0 - config.fetch_jitter..=1.0 + config.fetch_jitter)
    } else {
        1.0
    };
    base.mul_f64(factor)
}

impl<S: Store> Fetcher<S> {
    pub(crate) fn new(core: Core<S>, rng: ChaCha8Rng) -> Fetcher<S> {
        Fetcher { core, rng, empty_streak: 0, expiry: None }
    }

    /// Consecutive empty fetches so far.
    pub fn empty_streak(&self) -> u32 {
        self.empty_streak
    }

    /// One pass of the first fetcher: if the queue is below its lower mark and has room ([`Shared::reserve`]),
    /// lease up to the room's rows and queue them, then adapt the queue's size to whether the workers outran the
    /// fetch ([`Shared::adapt`]).
    ///
    /// [`Shared::reserve`]: super::queue::Shared::reserve
    /// [`Shared::adapt`]: super::queue::Shared::adapt
    ///
    /// Errors: the store's, with nothing queued (a fetch whose reply was lost leaves its leases to expire).
    pub async fn run_once(&mut self) -> Result<FetchPass, StoreError> {
        self.expiry = None;
        if !self.core.config.contention_backoff_disabled_for_mutation_test
            && self.core.shared.backs_off_for_contention()
        {
            Metrics::bump(&self.core.metrics.contention_backoffs);
            self.give_back_queued().await?;
            return Ok(FetchPass::Contended);
        }
        let (pass, expiry) = fetch(&self.core, 0).await?;
        self.expiry = expiry;
        match pass {
            FetchPass::Fetched { fetched: 0, .. } => {
                self.empty_streak += 1;
                Metrics::bump(&self.core.metrics.empty_fetches);
            }
            FetchPass::Fetched { .. } => self.empty_streak = 0,
            FetchPass::Full | FetchPass::Contended => {}
        }
        Ok(pass)
    }

    /// The fetcher's loop, until the pipeline stops. After a full queue it waits for a refill, a hint or a retry
    /// this replica noted falling due (which, if the queue has no room then, it hints to the other replicas:
    /// `Fetcher::hand_retries_on`); after
    /// an empty fetch it sleeps the backoff, cut short by the first expiry of a lease it had to skip
    /// ([`Fetcher::empty_wait`]), unless a hint comes; after a fetch it did not make for contention
    /// ([`FetchPass::Contended`]) it sleeps the backoff unless one of its items ends otherwise (hints wait; see
    /// `sleep_unless_woken`); after a partial fetch (the store had fewer
    /// ready rows than the limit) it sleeps the shortest backoff unless a hint comes. A store error is logged
    /// and treated as an empty fetch. The pipeline's other fetchers ([`PipelineConfig::fetchers`]) run alongside
    /// it on the same task (`run_more`), so the loop ends, and an abort stops them, together.
    pub async fn run(self) {
        let core = self.core.clone();
        let more = (1..core.config.fetchers).map(|fetcher| run_more(&core, fetcher));
        tokio::join!(self.run_first(), futures_util::future::join_all(more));
    }

    async fn run_first(mut self) {
        let shared = self.core.shared.clone();
        while !shared.is_stopping() {
            let retries_due = shared.take_due_retries(self.core.clock.now());
            let pass = self.run_once().await;
            if retries_due && matches!(pass, Ok(FetchPass::Full | FetchPass::Contended)) {
                self.hand_retries_on().await;
            }
            let wait = match pass {
                Ok(FetchPass::Full) => None,
                Ok(FetchPass::Fetched { fetched, limit }) if fetched == limit => continue,
                Ok(FetchPass::Fetched { fetched: 0, .. }) => Some(self.empty_wait()),
                Ok(FetchPass::Fetched { .. }) => Some(self.core.config.fetch_backoff[0]),
                Ok(FetchPass::Contended) => {
                    // The first step of the sequence, whatever the empty fetches before: the items it gave up wait
                    // out `retry_delay` (500 ms) at most, and a fetcher that idled before the row got hot would
                    // otherwise sleep up to 5 s through hints (a trial: bursts of claims waited 4-5 s).
                    let delay = fetch_backoff(&self.core.config, 1, &mut self.rng);
                    self.sleep_unless_woken(delay, Wake::Contended).await;
                    shared.contention_backoff_over();
                    continue;
                }
                Err(error) => {
                    tracing::warn!(pipeline = %self.core.config.name, %error, "fetch failed");
                    self.empty_streak += 1;
                    Some(self.backoff())
                }
            };
            match wait {
                // Full: only a worker (refill) or a hint can make a fetch useful.
                // `biased`: tokio's `select!` otherwise draws its branch order from a thread-local RNG seeded
                // from a process-wide counter, which madsim does not control, so the same seed would not give
                // the same run twice in one process (DESIGN §5: a run is a function of the seed).
                // A retry this replica noted falling due wakes it too: with no room, it hands the row on.
                None => {
                    let retry = shared.retry_due_after(self.core.clock.now());
                    tokio::select! {
                        biased;
                        _ = shared.stop.notified() => {}
                        _ = shared.refill.notified() => {}
                        _ = shared.hint.notified() => {}
                        _ = shared.retry_noted.notified() => {}
                        _ = self.core.clock.sleep_until(retry.unwrap_or_else(|| self.core.clock.now())), if retry.is_some() => {}
                    }
                }
                Some(delay) => self.sleep_unless_woken(delay, Wake::Backoff).await,
            }
        }
    }

    /// Sleeps `delay` of local time, ended early by a stop, the retry of a row this replica failed falling due
    /// ([`Shared::note_retry`]; a retry noted during the sleep shortens it), and as `wake` says: a hint in a
    /// backoff after a fetch, an item that ended otherwise than turned away in a contention backoff
    /// ([`Shared::contention_ended`]). A contention backoff lets hints wait (they stay stored for the next wait):
    /// the hinted rows' holders, items of this pipeline in another replica, got the same hint (a store's hints
    /// reach every replica), and a fetch here would only lease the new rows to reset them.
    ///
    /// [`Shared::note_retry`]: super::queue::Shared::note_retry
    /// [`Shared::contention_ended`]: super::queue::Shared::contention_ended
    async fn sleep_unless_woken(&self, delay: Duration, wake: Wake) {
        let contended = wake == Wake::Contended;
        let (shared, clock) = (&self.core.shared, &self.core.clock);
        let deadline = clock.now() + delay;
        loop {
            let until = shared.retry_due_after(clock.now()).map_or(deadline, |due| due.min(deadline));
            tokio::select! {
                biased;
                _ = shared.stop.notified() => return,
                _ = shared.hint.notified(), if !contended => return,
                _ = shared.contention_ended.notified(), if contended => return,
                _ = shared.retry_noted.notified() => {}
                _ = clock.sleep_until(until) => return,
            }
        }
    }

    /// A retry this replica noted fell due while it had no room to fetch (its queue full, or backing off for
    /// contention): it publishes a fetch hint of its kind, so that a replica with an idle worker takes the row now
    /// rather than at its own poll (the swarm saw claims fetched up to 0.5 s past their retry while another
    /// replica's worker idled). A store error is logged: the rows wait for a poll, as before.
    async fn hand_retries_on(&self) {
        let kind = &self.core.config.kind;
        if let Err(error) = self.core.store.hint(kind, None).await {
            tracing::warn!(pipeline = %self.core.config.name, %error, "could not hint a retry that fell due");
        }
    }

    /// Gives the leases of every queued item, and of every parked waiter, back to the store unparked ([`Core::give_back`]), so that the replica
    /// holding the rows they wait for can take them at once, where each would otherwise meet that holder here and
    /// be reset, kept from every replica for `retry_delay`. Errors: the store's.
    async fn give_back_queued(&self) -> Result<(), StoreError> {
        let mut items = self.core.shared.take_all_queued();
        items.extend(self.core.shared.take_all_parked());
        let leases: Vec<Lease> = items.into_iter().map(|item| item.lease).collect();
        if leases.is_empty() {
            return Ok(());
        }
        self.core.give_back(leases).await
    }

    fn backoff(&mut self) -> Duration {
        fetch_backoff(&self.core.config, self.empty_streak, &mut self.rng)
    }

    /// The wait after an empty fetch: the backoff, or, if a lease or intent mark the fetch had to skip expires
    /// sooner (the expiry the fetch brought back, [`Store::fetch_with_expiry`]), until `fetch_expiry_slack` after
    /// that, so that a dead holder's rows are taken over at once rather than a backoff later. No expiry
    /// known (none, or the store could not tell) keeps the backoff.
    pub fn empty_wait(&mut self) -> Duration {
        let backoff = self.backoff();
        match self.expiry {
            Some(expiry) => backoff.min(expiry + self.core.config.fetch_expiry_slack),
            None => backoff,
        }
    }
}

/// What ends a fetcher's backoff early, besides a stop and a retry falling due ([`Fetcher::sleep_unless_woken`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// After an empty or partial fetch, or a failed one: a fetch hint.
    Backoff,
    /// After a fetch not made for contention ([`FetchPass::Contended`]): an item that ended otherwise.
    Contended,
}

/// The parameters of a fetch of `limit` rows by the pipeline of `config`.
fn fetch_params(config: &PipelineConfig, limit: usize) -> FetchParams {
    FetchParams {
        pipeline: config.name.clone(),
        kind: config.kind.clone(),
        statuses: config.statuses.clone(),
        limit,
        lease_ttl: config.lease_ttl,
        min_processing_interval: config.min_processing_interval,
        retry_delay: config.retry_delay,
    }
}

/// One fetch by fetcher `fetcher` (0 is the first): reserve room, lease up to its rows, queue them, adapt the
/// queue's size. The first fetcher also learns, from an empty fetch, when the first lease it skipped ends
/// ([`Store::fetch_with_expiry`]; the others never back off). Errors: the store's, with nothing queued and the
/// room given back.
async fn fetch<S: Store>(core: &Core<S>, fetcher: usize) -> Result<(FetchPass, Option<Duration>), StoreError> {
    let shared = &core.shared;
    let Some(reservation) = shared.reserve(fetcher, core.clock.now()) else {
        return Ok((FetchPass::Full, None));
    };
    let (limit, capped) = (reservation.limit(), reservation.capped());
    let config = &core.config;
    let params = fetch_params(config, limit);
    let clock = &core.clock;
    let sent = clock.now();
    let (rows, expiry) = match fetcher {
        0 => core.store.fetch_with_expiry(params).await?,
        _ => (core.store.fetch(params).await?, None),
    };
    core.metrics.fetch_latency.record(clock.now().duration_since(sent));
    if buggify::fires(Point::FetchStall) {
        // The rows arrive with a lease ttl gone: their local deadlines (from `sent`) have passed, so the
        // heartbeater and the workers must treat them as lost, whatever the store says.
        clock.sleep(config.lease_ttl).await;
    }
    let fetched = rows.len();
    core.metrics.fetched.fetch_add(fetched as u64, Ordering::Relaxed);
    let items = rows
        .into_iter()
        .map(|row| {
            let token = row.lock_token.expect("a fetched row carries its lease token");
            Item { lease: Lease { id: row.id, token }, row, fetched_at: sent }
        })
        .collect();
    let queued = reservation.fill(items, sent, config.lease_ttl, config.lease_margin);
    core.metrics.stale.fetch_add((fetched - queued) as u64, Ordering::Relaxed);
    if !capped {
        shared.adapt(fetched, limit);
    }
    Ok((FetchPass::Fetched { fetched, limit }, expiry))
}

/// The loop of a fetcher other than the first: while the queue is grown, it fetches whenever the queue is below its
/// lower mark and has room, so its fetch overlaps the first fetcher's; otherwise it waits for a refill. It never
/// backs off and never waits for hints: an empty or partial fetch brings the queue back to dstack's size, where
/// only the first fetcher runs. A store error is logged, and the fetcher waits for the next refill.
async fn run_more<S: Store>(core: &Core<S>, fetcher: usize) {
    let shared = &core.shared;
    while !shared.is_stopping() {
        match fetch(core, fetcher).await {
            Ok((FetchPass::Fetched { .. }, _)) => continue,
            Ok((FetchPass::Full | FetchPass::Contended, _)) => {}
            Err(error) => tracing::warn!(pipeline = %core.config.name, fetcher, %error, "fetch failed"),
        }
        // `biased`: see `Fetcher::run_first`.
        tokio::select! {
            biased;
            _ = shared.stop.notified() => {}
            _ = shared.refill_more[fetcher - 1].notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn config() -> PipelineConfig {
        PipelineConfig::new("p", "k", &["ready"])
    }

    #[test]
    fn backoff_follows_the_sequence_within_jitter_bounds() {
        let config = config();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for streak in 1..=6u32 {
            let expected = FETCH_STEPS[(streak as usize - 1).min(3)];
            for _ in 0..500 {
                let delay = fetch_backoff(&config, streak, &mut rng).as_secs_f64();
                let shortest = FETCH_STEPS[0];
                let within = |base: f64| delay >= base * 0.8 - 1e-9 && delay <= base * 1.2 + 1e-9;
                assert!(within(expected) || within(shortest), "streak {streak}: {delay}s");
            }
        }
    }

    const FETCH_STEPS: [f64; 4] = [0.5, 1.0, 2.0, 5.0];

    #[test]
    fn backoff_takes_the_shortest_about_one_time_in_ten() {
        let config = config();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let draws = 10_000;
        let shortest = (0..draws).filter(|_| fetch_backoff(&config, 4, &mut rng) < Duration::from_secs(1)).count();
        let share = shortest as f64 / draws as f64;
        assert!((0.08..0.12).contains(&share), "share of shortest backoffs {share}");
    }

    #[test]
    fn backoff_jitter_spans_both_sides() {
        let config = PipelineConfig { fetch_shortest_chance: 0.0, ..config() };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let delays: Vec<f64> = (0..2_000).map(|_| fetch_backoff(&config, 2, &mut rng).as_secs_f64()).collect();
        let min = delays.iter().cloned().fold(f64::MAX, f64::min);
        let max = delays.iter().cloned().fold(0.0, f64::max);
        assert!((0.8..0.82).contains(&min), "min {min}");
        assert!(max > 1.18 && max <= 1.2, "max {max}");
    }

    #[test]
    fn backoff_without_jitter_is_exact() {
        let config = PipelineConfig { fetch_jitter: 0.0, fetch_shortest_chance: 0.0, ..config() };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let delays: Vec<Duration> = (1..=5).map(|streak| fetch_backoff(&config, streak, &mut rng)).collect();
        let secs = |s: f64| Duration::from_secs_f64(s);
        assert_eq!(delays, vec![secs(0.5), secs(1.0), secs(2.0), secs(5.0), secs(5.0)]);
    }
}
