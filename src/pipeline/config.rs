//! A pipeline's configuration, with dstack's measured defaults (DESIGN §3, `seeds/dstack-pipelines.md`).

use std::time::Duration;

/// Default lease length on the store's clock (DESIGN §3: ttl default 30 s).
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(30);
/// Default heartbeat period on the local clock (DESIGN §3: every 1 s).
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Default safety margin: a holder treats its lease as lost at (fetch or heartbeat sent) + ttl − margin on its own
/// monotonic clock (DESIGN §2, Time), so a lease is given up locally before the store can hand it out again.
pub const LEASE_MARGIN_DEFAULT: Duration = Duration::from_secs(2);
/// Default number of workers per pipeline (dstack's typical pipeline size, seed "Performance analysis").
pub const WORKERS_DEFAULT: usize = 20;
/// Default minimum interval between two processings of one row.
pub const MIN_PROCESSING_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default delay before a row reset for retry is fetched again: the shortest empty-fetch backoff, so a retry
/// costs no more than one fetch pass (seed, "Reset-and-retry").
pub const RETRY_DELAY_DEFAULT: Duration = Duration::from_millis(500);
/// Default of [`PipelineConfig::park_waiters`]: BENCHMARKS.md, "(7) Retention and the wait queue", holds the
/// measurement that decides it.
pub const PARK_WAITERS_DEFAULT: bool = false;
/// Queue upper bound factor: queue max = ceil(workers × 2.0) (DESIGN §3, dstack).
pub const QUEUE_UPPER_FACTOR_DEFAULT: f64 = 2.0;
/// Queue lower mark factor: fetch when size < ceil(workers × 0.5) (DESIGN §3, dstack).
pub const QUEUE_LOWER_FACTOR_DEFAULT: f64 = 0.5;
/// Empty-fetch backoff by consecutive empty fetches: 0.5, 1, 2, 5 s (DESIGN §3, dstack).
pub const FETCH_BACKOFF_DEFAULT: [Duration; 4] =
    [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(5)];
/// Jitter of each backoff: ×(1 ± 0.2) (DESIGN §3, dstack).
pub const FETCH_JITTER_DEFAULT: f64 = 0.2;
/// Chance that a backoff uses the shortest delay whatever the streak (DESIGN §3, dstack: 10%).
pub const FETCH_SHORTEST_CHANCE_DEFAULT: f64 = 0.1;

/// Default slack a fetcher waits past the first expiry of the leases an empty fetch had to skip before it fetches
/// again (takeover without waiting out a backoff). The wait starts when the store's answer arrived, so
/// on an exact local clock it never ends before the store-side expiry; the slack covers a local clock running
/// fast (30 ms over a 30 s lease at 0.1 % drift) with room to spare, and bounds how often a fetcher looks again at
/// a lease its holder extended meanwhile (at most once per slack).
pub const FETCH_EXPIRY_SLACK_DEFAULT: Duration = Duration::from_millis(100);

/// Default longest wait of an apply for others to join its batch (DESIGN §3, Batching: "a small, configured
/// window"). A batch waits only while an earlier batch of the pipeline is in the store, so an unsaturated
/// pipeline adds no delay; 2 ms is about two batched applies' round trips on PostgreSQL on these machines
/// (docs/benchmarks-history.md, "How the batchers decide").
pub const APPLY_BATCH_WINDOW_DEFAULT: Duration = Duration::from_millis(2);
/// Default most applies in one batch (and, times `apply_batches_in_flight`, unanswered at once per pipeline): 600,
/// as [`FETCH_LIMIT_MAX_DEFAULT`], so that a full fetch's rows go back in one batch (a drain whose fetches leased
/// 400 rows but applied in batches of 100 filled its apply slots 77 % of the time and ran no faster than with 100
/// of each, docs/benchmarks-history.md, "Eighth round").
pub const APPLY_BATCH_MAX_DEFAULT: usize = 600;
/// Default most apply batches of a pipeline in the store at once: 2, so the next batch goes while one commits. A
/// 1 × 8 drain on PostgreSQL with two fetches in flight waited on its one apply batch (its 100 unanswered applies
/// filled their slots 77–86 % of the time); with two of each it ran 1.4–2.1 × (median 1.7 ×) as fast as with one
/// of each (docs/benchmarks-history.md, "Second round").
pub const APPLY_BATCHES_IN_FLIGHT_DEFAULT: usize = 2;
/// Default most rows one fetch leases once the workers outrun dstack's queue size: 600 (100 before). A drain of
/// 200 000 no-op items on PostgreSQL, 1 replica × 8 workers, ran 1.50–1.69 × as fast as with 100 (four pairs), at
/// 0.66–0.75 × the PostgreSQL CPU per item: each statement's fixed cost is spread over more rows. 300 gave about
/// 1.3 ×, and 1 000 nothing more than 600 beyond the noise (docs/benchmarks-history.md, "Eighth round"). The queue
/// grows to it only while the workers outrun the fetches and the store has the rows, and halves back once they keep
/// up ([`Shared::adapt`](super::queue::Shared::adapt)), so a pipeline whose handlers take their time keeps dstack's
/// queue of twice its workers.
pub const FETCH_LIMIT_MAX_DEFAULT: usize = 600;
/// Default fetch loops per pipeline: 2. The second loop fetches only while the queue is grown (the workers outran
/// the fetches and the store has more rows), so an idle or slow pipeline fetches as dstack's one loop does; a busy
/// one has a second fetch in flight while the first is answered (`tests/batching.rs`: twice the rows per second at
/// 10 ms a call). A 1 × 8 drain on PostgreSQL spent about 80 % of its time with its one fetch in flight and every
/// worker idle; with two fetchers and two apply batches in flight it ran 1.4–2.1 × (median 1.7 ×) as fast
/// (docs/benchmarks-history.md, "Second round").
pub const FETCHERS_DEFAULT: usize = 2;

/// Default longest wait of a worker's refetch for other workers' refetches to join it in one store call: the
/// apply batch window's 2 ms. As for applies, a batch waits only while an earlier refetch batch of the pipeline is
/// in the store, so the window binds only on a store slower than it (a refetch batch by primary key takes well
/// under a millisecond on PostgreSQL on these machines, docs/benchmarks-history.md, "What made it faster").
pub const REFETCH_BATCH_WINDOW_DEFAULT: Duration = APPLY_BATCH_WINDOW_DEFAULT;

/// Default of [`PipelineConfig::refetch`]: on, as DESIGN §3's worker loads by token.
pub const REFETCH_DEFAULT: bool = true;
/// Default of [`PipelineConfig::refetch_after`]: a row that waited less than 1 s since its fetch is loaded as
/// fetched. Items that outrun their fetches wait milliseconds (docs/benchmarks-history.md, "Reading the tables":
/// a queue of 100 rows drains in under
/// 10 ms), and a reread of each then doubled the store's work per item; a row that waited longer (slow items, whose
/// queue is dstack's size) is reread.
pub const REFETCH_AFTER_DEFAULT: Duration = Duration::from_secs(1);

/// Default of [`PipelineConfig::handler_timeout`]: 1 minute, River's default job time-out (its `JobTimeout`). A
/// pass of the gang controller takes milliseconds, and its longest, the first pass of a 100 000-job spec, seconds
/// (docs/benchmarks-history.md, "(4) Controller scale"); a handler that needs longer sets its pipeline's own bound.
pub const HANDLER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// Default most attempts of an item before it gives up: river's and graphile-worker's default of 25 (Oban's is 20,
/// pg-boss retries 2 times). With the default backoff the 25th attempt comes ≈ 2.8 h after the first failure.
pub const RETRY_ATTEMPTS_MAX_DEFAULT: u32 = 25;
/// Default delay after the first failure; each further failure in a row doubles it (graphile-worker and Oban back
/// off exponentially too). 1 s is twice the shortest empty-fetch backoff, so a failing row costs at most one fetch
/// pass of its pipeline per second even when its failures are instant.
pub const RETRY_BACKOFF_BASE_DEFAULT: Duration = Duration::from_secs(1);
/// Default longest delay between two attempts: 10 minutes, reached at the 11th failure. River caps nothing (its
/// attempt⁴ seconds reach 4.5 days at 25), graphile-worker at e¹⁰ s ≈ 6 h; a pipeline reconciles resources that
/// users wait on, so a cured cause (a node back, a bug fixed) should be picked up within minutes.
pub const RETRY_BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(600);
/// Default relative jitter of each retry delay, ×(1 ± 0.2): the fetch backoff's (DESIGN §3), so rows that failed
/// together (a dependency down) do not come back together. River jitters ±10%.
pub const RETRY_JITTER_DEFAULT: f64 = 0.2;
/// Default status a row takes when its pipeline gives up on it (river's `discarded`, pg-boss's `failed`).
pub const RETRY_FAILED_STATUS_DEFAULT: &str = "failed";

const _: () = assert!(RETRY_BACKOFF_BASE_DEFAULT.as_millis() <= RETRY_BACKOFF_MAX_DEFAULT.as_millis());
// PostgreSQL's defaults fit the default pipeline: the default pool holds exactly its connections (workers, fetch
// loops, heartbeater, apply batches in flight: `PipelineConfig::connections_needed`), and a call stuck on a row lock
// gives up (`lock_timeout`) well before the lease it serves is due for its heartbeat (ttl / 2). Stated here, above
// the store, which names no layer above it; only the normal build has PostgreSQL.
#[cfg(not(madsim))]
const _: () = {
    use crate::store::PgOptions;
    let needed = WORKERS_DEFAULT + FETCHERS_DEFAULT + 1 + APPLY_BATCHES_IN_FLIGHT_DEFAULT;
    assert!(needed == PgOptions::MAX_CONNECTIONS_DEFAULT as usize, "update PgOptions::MAX_CONNECTIONS_DEFAULT");
    assert!(PgOptions::LOCK_TIMEOUT_DEFAULT.as_millis() * 4 <= LEASE_TTL_DEFAULT.as_millis());
};
const _: () = assert!(HEARTBEAT_INTERVAL_DEFAULT.as_millis() * 2 <= LEASE_TTL_DEFAULT.as_millis());
const _: () = assert!(APPLY_BATCH_WINDOW_DEFAULT.as_millis() < LEASE_MARGIN_DEFAULT.as_millis());
const _: () = assert!(REFETCH_BATCH_WINDOW_DEFAULT.as_millis() < LEASE_MARGIN_DEFAULT.as_millis());
const _: () = assert!(
    LEASE_MARGIN_DEFAULT.as_millis() + HEARTBEAT_INTERVAL_DEFAULT.as_millis() * 2 <= LEASE_TTL_DEFAULT.as_millis() / 2
);

/// How a pipeline treats an item that failed (DESIGN §3, failures; river, graphile-worker, pg-boss and Oban all count
/// attempts, back off exponentially with jitter and stop after a maximum).
///
/// A failure is the handler's: `WorkError::Failed` from `load` or `process`, a panic in either, or a value the store
/// refuses (`StoreError::Invalid`). It is written on the row at once by a guarded write
/// ([`Store::record_failure`](crate::store::Store::record_failure)): one more attempt, the error, and either the
/// time before which no fetch takes the row again, or, at the last attempt, [`RetryPolicy::failed_status`]. The
/// store failing or timing out is not the item's fault: those failures leave the lease to expire as before and
/// count no attempt. [`Handler::retry`](super::Handler::retry) can decide otherwise per error.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts after which the row gives up: the failure that makes `attempts` reach this takes `failed_status`.
    /// `None` retries for ever. At least 1. Default `Some(`[`RETRY_ATTEMPTS_MAX_DEFAULT`]`)`.
    pub attempts_max: Option<u32>,
    /// Delay, store clock, after the first failure in a row; the n-th waits `backoff_base × 2ⁿ⁻¹`, at most
    /// `backoff_max`, then jittered. Not zero. Default [`RETRY_BACKOFF_BASE_DEFAULT`].
    pub backoff_base: Duration,
    /// Longest delay between two attempts (before jitter, which stays under it). At least `backoff_base`. Default
    /// [`RETRY_BACKOFF_MAX_DEFAULT`].
    pub backoff_max: Duration,
    /// Relative jitter of each delay, in [0, 1): the delay is multiplied by a uniform draw from 1 ± this, from the
    /// pipeline's seeded random stream. Default [`RETRY_JITTER_DEFAULT`].
    pub jitter: f64,
    /// The status a row takes when the pipeline gives up on it; must not be one of the pipeline's `statuses`, or
    /// the row would be fetched again. Default [`RETRY_FAILED_STATUS_DEFAULT`].
    pub failed_status: String,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts_max: Some(RETRY_ATTEMPTS_MAX_DEFAULT),
            backoff_base: RETRY_BACKOFF_BASE_DEFAULT,
            backoff_max: RETRY_BACKOFF_MAX_DEFAULT,
            jitter: RETRY_JITTER_DEFAULT,
            failed_status: RETRY_FAILED_STATUS_DEFAULT.to_string(),
        }
    }
}

impl RetryPolicy {
    /// Whether the failure of attempt `attempt` (from 1) is the last one.
    pub fn gives_up_at(&self, attempt: u32) -> bool {
        self.attempts_max.is_some_and(|max| attempt >= max)
    }

    /// The delay before the attempt after failed attempt `attempt` (from 1): `backoff_base × 2^(attempt − 1)`,
    /// capped at `backoff_max`, times `1 + jitter × draw` where `draw` is in [-1, 1], and never past `backoff_max`.
    pub fn backoff(&self, attempt: u32, draw: f64) -> Duration {
        let exponential = self.backoff_base.saturating_mul(1u32 << attempt.saturating_sub(1).min(31));
        let capped = exponential.min(self.backoff_max);
        let factor = 1.0 + self.jitter * draw.clamp(-1.0, 1.0);
        capped.mul_f64(factor.max(0.0)).min(self.backoff_max)
    }
}

/// One pipeline: which rows it leases and how it paces itself. Build with [`PipelineConfig::new`] and change
/// fields; [`PipelineConfig::validate`] names the first broken rule.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    /// Pipeline name; written to `lock_owner` of its leases. Default: none (required).
    pub name: String,
    /// Row kind it processes. Default: none (required).
    pub kind: String,
    /// Statuses that make a row eligible. Default: none (required, not empty).
    pub statuses: Vec<String>,
    /// Concurrent workers. Default [`WORKERS_DEFAULT`].
    pub workers: usize,
    /// Lease length, store clock. Default [`LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// Local safety margin before the store-side expiry. Default [`LEASE_MARGIN_DEFAULT`].
    pub lease_margin: Duration,
    /// Heartbeat period, local clock. Default [`HEARTBEAT_INTERVAL_DEFAULT`].
    pub heartbeat_interval: Duration,
    /// A lease is extended when its local deadline is this close (the lease of an item still queued then is given
    /// back instead, see [`super::queue`]). Shorter than `lease_ttl − lease_margin`. Default: `lease_ttl / 2`
    /// (DESIGN §3).
    pub heartbeat_trigger: Duration,
    /// Minimum time between two processings of one row, store clock. Default [`MIN_PROCESSING_INTERVAL_DEFAULT`].
    pub min_processing_interval: Duration,
    /// Delay before a row reset for retry is eligible again, store clock. Also the longest an item waits, local
    /// clock, for another item of the pipeline in this replica to hand on a related row's turn before it asks the
    /// store anyway ([`super::Waitlist`]). Not zero: a contended item would be fetched again at once, a spin
    /// against the store. Default [`RETRY_DELAY_DEFAULT`].
    pub retry_delay: Duration,
    /// Parked waiters (DESIGN §3, "Parked waiters"): an item whose related lock is contended is not reset for
    /// retry but parked in its replica, its lease kept by the heartbeater and no worker held, until the write that
    /// frees a row it waits on wakes it (a wake hint) or the longest lock it met expires, and then queued at the
    /// front; at most a queue max of items is parked, the others are reset as before. Default
    /// [`PARK_WAITERS_DEFAULT`].
    pub park_waiters: bool,
    /// Queue max = ceil(workers × this) while the fetcher keeps up. Default [`QUEUE_UPPER_FACTOR_DEFAULT`].
    pub queue_upper_factor: f64,
    /// Fetch when queue size < ceil(workers × this). Default [`QUEUE_LOWER_FACTOR_DEFAULT`].
    pub queue_lower_factor: f64,
    /// Empty-fetch backoff sequence, local clock; the last value repeats. Default [`FETCH_BACKOFF_DEFAULT`].
    pub fetch_backoff: Vec<Duration>,
    /// Relative jitter of each backoff, in [0, 1). Default [`FETCH_JITTER_DEFAULT`].
    pub fetch_jitter: f64,
    /// Chance in [0, 1] of using the shortest backoff. Default [`FETCH_SHORTEST_CHANCE_DEFAULT`].
    pub fetch_shortest_chance: f64,
    /// After an empty fetch, the fetcher asks the store when the first lease or intent mark it had to skip
    /// expires ([`Store::next_expiry`](crate::store::Store::next_expiry)) and fetches again this long after that,
    /// local clock, if that comes before the end of its backoff. Not zero. Default [`FETCH_EXPIRY_SLACK_DEFAULT`].
    pub fetch_expiry_slack: Duration,
    /// Longest a worker's guarded apply waits, local clock, for other workers' applies to join it in one store
    /// call ([`Store::apply_batch`](crate::store::Store::apply_batch); see [`super::batcher`]). Zero turns
    /// batching off: every apply is a store call of its own. Must be shorter than `lease_margin`. Default
    /// [`APPLY_BATCH_WINDOW_DEFAULT`].
    pub apply_batch_window: Duration,
    /// Most applies in one batch, at least 1 (1 turns batching off); with batching on, also the most applies
    /// the pipeline's workers have handed over and not yet seen answered. Default [`APPLY_BATCH_MAX_DEFAULT`].
    pub apply_batch_max: usize,
    /// Most apply batches of the pipeline in the store at once, at least 1: a batch that is not full goes to the
    /// store at once while fewer are in it, otherwise it collects applies until one is answered (within
    /// `apply_batch_window`). More than one lets the next batch start, on another connection, while one commits;
    /// each batch may use a store connection. With batching on, at most `apply_batch_max` × this many applies
    /// are unanswered. Default [`APPLY_BATCHES_IN_FLIGHT_DEFAULT`].
    pub apply_batches_in_flight: usize,
    /// Most rows the queue grows to, so one fetch leases at most this many, when workers find the queue empty
    /// while the store has more ready rows (DESIGN §3, Batching: fetch many rows per statement; the rule is in
    /// [`super::queue`]). At most dstack's queue max has no effect. Default [`FETCH_LIMIT_MAX_DEFAULT`].
    pub fetch_limit_max: usize,
    /// Fetch loops, at least 1: the first is dstack's fetcher (backoff, hints); each other one fetches only while
    /// the queue is grown past dstack's size, or, for a queue that cannot grow (`fetch_limit_max` at most dstack's
    /// max, as in per-item mode), while the workers outrun it (the workers outran the fetches and the store has more
    /// rows), so up
    /// to this many fetches are in flight at once and the queue holds up to this many times its max (the rule is
    /// in [`super::queue`]). Each may use a store connection. Default [`FETCHERS_DEFAULT`].
    pub fetchers: usize,
    /// Whether a worker rereads its row by `id + lock_token` before `load` (DESIGN §3: load = refetch by token)
    /// when the row waited `refetch_after` or longer since its fetch. The reread drops, unprocessed, an item
    /// whose lease the store gave to someone else while this replica's clock
    /// did not see the time pass (a suspended machine: its monotonic clock stops, the database's does not).
    /// With `false` the worker loads the row as the fetch returned it, one store round trip less per item: while
    /// the lease is live no one else can write the row (every write is guarded by the token or refused while
    /// leased), so the two reads differ only in `hinted` and `lock_expires_at`; a taken-over item is then
    /// processed and its apply found stale, writing nothing. Default [`REFETCH_DEFAULT`].
    pub refetch: bool,
    /// TEST ONLY (simulator `[mutation] waitlist_disabled`): items take no turns in the replica's
    /// [`Waitlist`](super::Waitlist) and meet only in the store, as before it: on a hot row each waiting item is
    /// reset once per turn, and checker `starvation` must fire (scenarios/rows-hot-row.toml).
    #[doc(hidden)]
    pub waitlist_disabled_for_mutation_test: bool,
    /// TEST ONLY (simulator `[mutation] retry_wake_disabled`): a worker that records a failure does not wake its
    /// fetcher when the row's retry falls due ([`Shared::note_retry`](super::queue::Shared::note_retry)), so the
    /// row waits for the fetcher's empty-fetch backoff, as before: checker `retries` must fire
    /// (scenarios/rows-failing.toml).
    #[doc(hidden)]
    pub retry_wake_disabled_for_mutation_test: bool,
    /// TEST ONLY: the first fetcher fetches whatever its items' contention
    /// ([`Shared::backs_off_for_contention`](super::queue::Shared::backs_off_for_contention)), as before it: a
    /// replica whose items meet a hot row another replica holds leases and resets its whole backlog
    /// (`tests/engine.rs`, `hot_row_across_replicas_…`).
    #[doc(hidden)]
    pub contention_backoff_disabled_for_mutation_test: bool,
    /// TEST ONLY (simulator `[mutation] park_wake_disabled`): a wake hint wakes no parked waiter
    /// ([`Shared::wake_rows`](super::queue::Shared::wake_rows)), so each waits until the lock it met expires, as if
    /// the releasing write had not told it: on scenarios/rows-hot-row.toml checker `starvation` must fire.
    #[doc(hidden)]
    pub park_wake_disabled_for_mutation_test: bool,
    /// With `refetch` on, the least time, on the local clock, from the fetch of a row to its worker's load for the
    /// worker to reread it; a row loaded sooner is loaded as the fetch returned it. The fetch read the row under
    /// the same lease and returned all of it, so a reread this soon finds the same row (see `refetch`) at the
    /// cost of a store call. What is given up: for a row loaded sooner, the reread's check of a lease lost while
    /// the local clock stood still (a suspended machine; the local wait then reads short whatever the store saw),
    /// so such an item is processed, and its guarded apply, not the reread, finds it stale and writes nothing
    /// (side effects outside the store must be idempotent anyway, DESIGN §3). Zero rereads every row. Default
    /// [`REFETCH_AFTER_DEFAULT`].
    pub refetch_after: Duration,
    /// Longest a worker's refetch waits, local clock, for other workers' refetches to join it in one store call
    /// ([`Store::refetch_batch`](crate::store::Store::refetch_batch); see [`super::batcher`]); a batch holds at
    /// most `workers` refetches. Zero turns refetch batching off: every refetch is a store call of its own. Its
    /// own field rather than `apply_batch_window`, so either batching can be turned off (or measured) alone: a
    /// refetch is a read the worker waits for, an apply a write it hands over. Must be shorter than
    /// `lease_margin`, as a refetch that waits for its batch holds a lease only checked locally before. Default
    /// [`REFETCH_BATCH_WINDOW_DEFAULT`].
    pub refetch_batch_window: Duration,
    /// What becomes of an item that failed: attempts, backoff, give-up status (see [`RetryPolicy`]). Default
    /// [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// Longest a handler's `load` and `process` of one item may take together, local clock. Past it (at the
    /// heartbeater's next pass, so within one `heartbeat_interval`) the worker gives the handler up and the item fails (`WorkError::Failed`, recorded on the row as any failure, then
    /// retried or given up by `retry`), and the heartbeater renews its lease no more, even while a handler that
    /// blocks its thread keeps the worker from noticing: a handler that never returns would otherwise hold its row
    /// for the life of the process. A handler that blocks its thread past the bound and then returns
    /// goes on to its guarded apply, stale if another holder took the row meanwhile. Zero: unbounded. Default [`HANDLER_TIMEOUT_DEFAULT`].
    pub handler_timeout: Duration,
}

/// A configuration that breaks a rule; the message names the field, the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field breaks a rule.
    #[error("pipeline {pipeline}: {field}: {rule}")]
    Field {
        /// The pipeline's name ([`PipelineConfig::name`]).
        pipeline: String,
        /// The field, as [`PipelineConfig`] names it (`workers`, `lease_ttl`, …).
        field: &'static str,
        /// The rule broken, naming the value.
        rule: String,
    },
    /// Two pipelines share a name (and so a lock owner).
    #[error("pipeline {0}: registered twice")]
    Duplicate(String),
    /// The store's connection pool cannot serve every worker, fetcher and heartbeater (DESIGN §3).
    #[error(
        "store allows {available} connections but the pipelines need {needed} (workers + fetchers + heartbeater + \
         apply batches in flight each): open the store with a pool of at least {needed} \
         (PgOptions::with_pool_for(configs) sizes it for the configs you register, or set PgOptions::max_connections; \
         `serve --max-connections`), or give the pipelines fewer workers"
    )]
    Connections {
        /// Connections the registered pipelines and this one need together
        /// ([`PipelineConfig::connections_needed`] summed).
        needed: usize,
        /// Connections the store's pool offers ([`Store::connection_limit`](crate::store::Store::connection_limit)).
        available: usize,
    },
    /// A retention rule the store would refuse ([`Retention::validate`](super::Retention::validate)).
    #[error("{0}")]
    Retention(String),
}

/// A pipeline holds at most [`PipelineConfig::connections_needed`] connections of its store's pool
/// (`PgOptions::with_pool_for` takes its config).
impl crate::store::PoolUser for PipelineConfig {
    fn connections_needed(&self) -> usize {
        PipelineConfig::connections_needed(self)
    }
}

impl PipelineConfig {
    /// A pipeline `name` over rows of `kind` in one of `statuses`, with every other field at its default.
    pub fn new(name: impl Into<String>, kind: impl Into<String>, statuses: &[&str]) -> PipelineConfig {
        PipelineConfig {
            name: name.into(),
            kind: kind.into(),
            statuses: statuses.iter().map(|s| s.to_string()).collect(),
            workers: WORKERS_DEFAULT,
            lease_ttl: LEASE_TTL_DEFAULT,
            lease_margin: LEASE_MARGIN_DEFAULT,
            heartbeat_interval: HEARTBEAT_INTERVAL_DEFAULT,
            heartbeat_trigger: LEASE_TTL_DEFAULT / 2,
            min_processing_interval: MIN_PROCESSING_INTERVAL_DEFAULT,
            retry_delay: RETRY_DELAY_DEFAULT,
            park_waiters: PARK_WAITERS_DEFAULT,
            queue_upper_factor: QUEUE_UPPER_FACTOR_DEFAULT,
            queue_lower_factor: QUEUE_LOWER_FACTOR_DEFAULT,
            fetch_backoff: FETCH_BACKOFF_DEFAULT.to_vec(),
            fetch_jitter: FETCH_JITTER_DEFAULT,
            fetch_shortest_chance: FETCH_SHORTEST_CHANCE_DEFAULT,
            fetch_expiry_slack: FETCH_EXPIRY_SLACK_DEFAULT,
            apply_batch_window: APPLY_BATCH_WINDOW_DEFAULT,
            apply_batch_max: APPLY_BATCH_MAX_DEFAULT,
            apply_batches_in_flight: APPLY_BATCHES_IN_FLIGHT_DEFAULT,
            fetch_limit_max: FETCH_LIMIT_MAX_DEFAULT,
            fetchers: FETCHERS_DEFAULT,
            refetch: REFETCH_DEFAULT,
            waitlist_disabled_for_mutation_test: false,
            retry_wake_disabled_for_mutation_test: false,
            contention_backoff_disabled_for_mutation_test: false,
            park_wake_disabled_for_mutation_test: false,
            refetch_after: REFETCH_AFTER_DEFAULT,
            refetch_batch_window: REFETCH_BATCH_WINDOW_DEFAULT,
            retry: RetryPolicy::default(),
            handler_timeout: HANDLER_TIMEOUT_DEFAULT,
        }
    }

    /// The same config with `lease_ttl` set and `heartbeat_trigger` at its default of `lease_ttl / 2`.
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> PipelineConfig {
        self.lease_ttl = lease_ttl;
        self.heartbeat_trigger = lease_ttl / 2;
        self
    }

    /// Queue max: ceil(workers × `queue_upper_factor`).
    pub fn queue_len_max(&self) -> usize {
        (self.workers as f64 * self.queue_upper_factor).ceil() as usize
    }

    /// Queue lower mark: the fetcher fetches while the queue is shorter, ceil(workers × `queue_lower_factor`).
    pub fn queue_len_low(&self) -> usize {
        (self.workers as f64 * self.queue_lower_factor).ceil() as usize
    }

    /// Store connections this pipeline can use at once: one per worker and fetch loop, the heartbeater's, and,
    /// with apply batching on ([`PipelineConfig::apply_batching`]), one per apply batch in flight
    /// (`apply_batches_in_flight`). A worker hands its apply over and takes its next item, whose load needs a
    /// connection while the batch holds another; sized without the batches, a slow database's batches held
    /// connections the workers then timed out waiting for, and each item dropped so waited a lease ttl.
    /// A refetch batch needs none of its own: the workers waiting for it make no store call meanwhile.
    pub fn connections_needed(&self) -> usize {
        let batches = if self.apply_batching() { self.apply_batches_in_flight } else { 0 };
        self.workers + self.fetchers + 1 + batches
    }

    /// Whether workers hand their applies to batches ([`super::batcher`]): `apply_batch_window` is not zero and
    /// `apply_batch_max` is more than 1. Otherwise each worker makes its apply's store call itself.
    pub fn apply_batching(&self) -> bool {
        !self.apply_batch_window.is_zero() && self.apply_batch_max > 1
    }

    /// Checks every rule; the first broken one is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, rule: String| Err(ConfigError::Field { pipeline: self.name.clone(), field, rule });
        let show = crate::duration::format;
        if self.name.is_empty() {
            return fail("name", "must not be empty".into());
        }
        if self.name.contains(':') {
            let rule = format!("{:?} must not contain ':' (a shared lock's owner is `name:item_id`)", self.name);
            return fail("name", rule);
        }
        if self.kind.is_empty() {
            return fail("kind", "must not be empty".into());
        }
        if self.statuses.is_empty() {
            return fail("statuses", "must name at least one status".into());
        }
        if self.workers == 0 {
            return fail("workers", "0 must be at least 1".into());
        }
        if !(self.queue_lower_factor > 0.0 && self.queue_lower_factor <= self.queue_upper_factor) {
            let rule = format!(
                "queue_lower_factor {} must be > 0 and ≤ queue_upper_factor {}",
                self.queue_lower_factor, self.queue_upper_factor
            );
            return fail("queue_lower_factor", rule);
        }
        if self.retry_delay.is_zero() {
            // A contended item reset for retry would be fetched again at once and contend again: a spin against
            // the store (a new user's trial: claims stalled, and under a paused or simulated clock time stopped).
            return fail("retry_delay", "must not be zero: a contended item would be fetched again at once".into());
        }
        if self.heartbeat_interval.is_zero() {
            // A heartbeater that never waits spins; under the simulator it stops simulated time for good.
            return fail("heartbeat_interval", "must not be zero".into());
        }
        // A lease due for extension must still hold two heartbeats (one may be lost) before its margin begins.
        let least = self.heartbeat_interval * 2 + self.lease_margin;
        if self.heartbeat_trigger < least {
            let rule = format!(
                "{} is shorter than 2 × heartbeat_interval ({}) + lease_margin ({}) = {}: a lease due for extension \
                 must hold two heartbeats before its margin",
                show(self.heartbeat_trigger),
                show(self.heartbeat_interval),
                show(self.lease_margin),
                show(least)
            );
            return fail("heartbeat_trigger", rule);
        }
        if self.heartbeat_trigger + self.lease_margin >= self.lease_ttl {
            // What is left is the start window: how long a queued item's lease lasts before the heartbeater must
            // extend it, or give it back if no worker started the item (see `super::queue`).
            let rule = format!(
                "{} + lease_margin ({}) = {} must be shorter than lease_ttl ({})",
                show(self.heartbeat_trigger),
                show(self.lease_margin),
                show(self.heartbeat_trigger + self.lease_margin),
                show(self.lease_ttl)
            );
            return fail("heartbeat_trigger", rule);
        }
        if self.fetch_backoff.is_empty() || self.fetch_backoff.iter().any(|d| d.is_zero()) {
            return fail("fetch_backoff", "must hold at least one delay, none of them zero".into());
        }
        if !(0.0..1.0).contains(&self.fetch_jitter) {
            return fail("fetch_jitter", format!("{} must be in [0, 1)", self.fetch_jitter));
        }
        if !(0.0..=1.0).contains(&self.fetch_shortest_chance) {
            return fail("fetch_shortest_chance", format!("{} must be in [0, 1]", self.fetch_shortest_chance));
        }
        if self.fetch_expiry_slack.is_zero() {
            return fail("fetch_expiry_slack", "must not be zero".into());
        }
        if self.fetchers == 0 {
            return fail("fetchers", "0 must be at least 1".into());
        }
        if self.apply_batch_max == 0 {
            return fail("apply_batch_max", "0 must be at least 1".into());
        }
        if self.apply_batches_in_flight == 0 {
            return fail("apply_batches_in_flight", "0 must be at least 1".into());
        }
        if self.apply_batch_window >= self.lease_margin {
            let rule = format!(
                "{} must be shorter than lease_margin {}",
                show(self.apply_batch_window),
                show(self.lease_margin)
            );
            return fail("apply_batch_window", rule);
        }
        if self.refetch_batch_window >= self.lease_margin {
            let rule = format!(
                "{} must be shorter than lease_margin {}",
                show(self.refetch_batch_window),
                show(self.lease_margin)
            );
            return fail("refetch_batch_window", rule);
        }
        self.validate_retry()
    }

    fn validate_retry(&self) -> Result<(), ConfigError> {
        let fail = |field, rule: String| Err(ConfigError::Field { pipeline: self.name.clone(), field, rule });
        let retry = &self.retry;
        if retry.attempts_max == Some(0) {
            return fail("retry.attempts_max", "0 must be at least 1".into());
        }
        if retry.backoff_base.is_zero() {
            return fail("retry.backoff_base", "must not be zero".into());
        }
        if retry.backoff_max < retry.backoff_base {
            let show = crate::duration::format;
            let rule =
                format!("{} must be at least backoff_base {}", show(retry.backoff_max), show(retry.backoff_base));
            return fail("retry.backoff_max", rule);
        }
        if !(0.0..1.0).contains(&retry.jitter) {
            return fail("retry.jitter", format!("{} must be in [0, 1)", retry.jitter));
        }
        if retry.failed_status.is_empty() || self.statuses.contains(&retry.failed_status) {
            let rule = format!("{:?} must be a status outside statuses {:?}", retry.failed_status, self.statuses);
            return fail("retry.failed_status", rule);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_queue_marks_follow_dstack_factors() {
        let config = PipelineConfig::new("p", "k", &["ready"]);
        assert_eq!(config.queue_len_max(), 40);
        assert_eq!(config.queue_len_low(), 10);
        let odd = PipelineConfig { workers: 3, ..config };
        assert_eq!(odd.queue_len_max(), 6);
        assert_eq!(odd.queue_len_low(), 2);
    }

    #[test]
    fn connections_needed_counts_workers_fetch_loops_the_heartbeater_and_apply_batches_in_flight() {
        let config = PipelineConfig {
            workers: 7,
            fetchers: 2,
            apply_batches_in_flight: 3,
            ..PipelineConfig::new("p", "k", &["ready"])
        };
        assert!(config.apply_batching(), "batching is on by default");
        assert_eq!(config.connections_needed(), 7 + 2 + 1 + 3);
        let unbatched = PipelineConfig { apply_batch_window: Duration::ZERO, ..config.clone() };
        assert!(!unbatched.apply_batching());
        assert_eq!(unbatched.connections_needed(), 7 + 2 + 1, "each worker makes its own apply");
        let single = PipelineConfig { apply_batch_max: 1, ..config };
        assert_eq!(single.connections_needed(), 7 + 2 + 1, "batches of one are no batching");
        let default = PipelineConfig::new("p", "k", &["ready"]);
        assert_eq!(
            default.connections_needed(),
            WORKERS_DEFAULT + FETCHERS_DEFAULT + 1 + APPLY_BATCHES_IN_FLIGHT_DEFAULT,
            "the default pipeline"
        );
    }

    #[test]
    fn defaults_validate() {
        PipelineConfig::new("p", "k", &["ready"]).validate().unwrap();
    }

    #[test]
    fn a_zero_heartbeat_interval_is_refused_naming_it() {
        let config = PipelineConfig { heartbeat_interval: Duration::ZERO, ..PipelineConfig::new("p", "k", &["ready"]) };
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("heartbeat_interval") && error.contains("must not be zero"), "{error}");
    }

    #[test]
    fn a_zero_retry_delay_is_refused_naming_it() {
        let config = PipelineConfig { retry_delay: Duration::ZERO, ..PipelineConfig::new("p", "k", &["ready"]) };
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("retry_delay") && error.contains("must not be zero"), "{error}");
    }

    #[test]
    fn retry_backoff_doubles_from_the_base_up_to_the_cap_and_jitters_under_it() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(1, 0.0), Duration::from_secs(1));
        assert_eq!(policy.backoff(2, 0.0), Duration::from_secs(2));
        assert_eq!(policy.backoff(10, 0.0), Duration::from_secs(512));
        assert_eq!(policy.backoff(11, 0.0), Duration::from_secs(600));
        assert_eq!(policy.backoff(u32::MAX, 0.0), Duration::from_secs(600));
        assert_eq!(policy.backoff(3, 1.0), Duration::from_secs_f64(4.8));
        assert_eq!(policy.backoff(3, -1.0), Duration::from_secs_f64(3.2));
        assert_eq!(policy.backoff(20, 1.0), Duration::from_secs(600), "jitter stays under the cap");
        assert!(!policy.gives_up_at(24));
        assert!(policy.gives_up_at(25));
        assert!(!RetryPolicy { attempts_max: None, ..policy }.gives_up_at(u32::MAX));
    }

    #[test]
    fn a_failed_status_the_pipeline_fetches_is_refused() {
        let mut config = PipelineConfig::new("p", "k", &["ready", "failed"]);
        let message = config.validate().unwrap_err().to_string();
        assert!(
            message.starts_with("pipeline p: retry.failed_status: \"failed\" must be a status outside"),
            "{message}"
        );
        config.retry.failed_status = "gave-up".into();
        config.validate().unwrap();
        config.retry.attempts_max = Some(0);
        assert_eq!(config.validate().unwrap_err().to_string(), "pipeline p: retry.attempts_max: 0 must be at least 1");
    }

    #[test]
    fn validation_names_the_field() {
        let config = PipelineConfig { workers: 0, ..PipelineConfig::new("p", "k", &["ready"]) };
        assert_eq!(config.validate().unwrap_err().to_string(), "pipeline p: workers: 0 must be at least 1");
        let config = PipelineConfig::new("p", "k", &["ready"]).with_lease_ttl(std::time::Duration::from_secs(3));
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "pipeline p: heartbeat_trigger: 1.5s is shorter than 2 × heartbeat_interval (1s) + lease_margin (2s) = 4s: \
             a lease due for extension must hold two heartbeats before its margin"
        );
        let config = PipelineConfig::new("p", "k", &["ready"]).with_lease_ttl(std::time::Duration::from_secs(8));
        config.validate().unwrap();
        let config = PipelineConfig {
            heartbeat_trigger: std::time::Duration::from_secs(28),
            ..PipelineConfig::new("p", "k", &["ready"])
        };
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "pipeline p: heartbeat_trigger: 28s + lease_margin (2s) = 30s must be shorter than lease_ttl (30s)"
        );
        let config = PipelineConfig::new("p", "k", &[]);
        assert!(config.validate().unwrap_err().to_string().contains("statuses"));
        let config = PipelineConfig::new("jobs:2", "k", &["ready"]);
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "pipeline jobs:2: name: \"jobs:2\" must not contain ':' (a shared lock's owner is `name:item_id`)"
        );
        let config = PipelineConfig {
            refetch_batch_window: std::time::Duration::from_secs(2),
            ..PipelineConfig::new("p", "k", &["ready"])
        };
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "pipeline p: refetch_batch_window: 2s must be shorter than lease_margin 2s"
        );
    }
}
