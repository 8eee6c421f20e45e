//! Property test of the lease protocol (DESIGN §2): random interleavings of fetch, heartbeat, lock_related,
//! apply, reset_for_retry, release, update_unleased and clock advances, by several holders of two pipelines (two
//! holders per name, as two replicas would be), driven straight through the [`Store`] trait on a MemStore with a
//! [`ManualClock`].
//!
//! A model tracks every token ever handed out and what each row must carry: its token and lease expiry (from the
//! fetches, related locks and heartbeats that succeeded) and its data (from the applies that succeeded). After
//! every step the store must match the model, and:
//! 1. an apply, heartbeat, reset, release or lock_related with a superseded (or consumed, or never issued) token
//!    never succeeds, and one with the row's current token does;
//! 2. a fetch, a related lock or a write API never takes a row whose lease is live: at most one live lease per
//!    row at any time;
//! 3. a row's data is only ever written by the apply of the latest token's holder.
#![cfg(not(madsim))]

use lockstep::store::{
    ApplyOutcome, ApplyParams, FetchParams, HeartbeatParams, Lease, LockOutcome, LockRelatedParams, LockToken,
    ManualClock, MemStore, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store, Timestamp, WriteOutcome,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Rows every case starts with, all of kind [`KIND`] in status `ready`.
const ROWS: usize = 4;
/// Holders; holder `i` fetches as pipeline `PIPELINES[i % 2]`.
const HOLDERS: usize = 4;
const PIPELINES: [&str; 2] = ["p", "q"];
const KIND: &str = "k";
/// Most steps in one case.
const STEPS_MAX: usize = 80;
/// Store time at the start of every case.
const START: Timestamp = Timestamp(1_700_000_000_000_000);

/// One step of an interleaving. Indices (`holder`, `pick`, `row`) are reduced modulo what exists, so every
/// generated step means something; `pick` chooses among every lease the holder was ever given, superseded or not.
#[derive(Clone, Debug)]
enum Step {
    Fetch { holder: usize, limit: usize, ttl_ms: u64, min_interval_ms: u64, retry_delay_ms: u64 },
    Heartbeat { holder: usize, picks: Vec<usize>, ttl_ms: u64 },
    LockRelated { holder: usize, pick: usize, rows: BTreeSet<usize>, shared: bool, ttl_ms: u64 },
    Apply { holder: usize, pick: usize, related_rows: BTreeSet<usize> },
    Reset { holder: usize, pick: usize },
    Release { holder: usize, picks: Vec<usize> },
    UpdateUnleased { row: usize },
    Advance { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    let holder = 0..HOLDERS;
    let pick = 0..16usize;
    let ttl_ms = 1_000..=6_000u64;
    let rows = proptest::collection::btree_set(0..ROWS, 0..=2);
    prop_oneof![
        3 => (holder.clone(), 1..=3usize, ttl_ms.clone(), prop_oneof![Just(0u64), Just(2_000)], prop_oneof![Just(0u64), Just(1_000)])
            .prop_map(|(holder, limit, ttl_ms, min_interval_ms, retry_delay_ms)| Step::Fetch { holder, limit, ttl_ms, min_interval_ms, retry_delay_ms }),
        2 => (holder.clone(), proptest::collection::vec(pick.clone(), 1..=3), ttl_ms.clone())
            .prop_map(|(holder, picks, ttl_ms)| Step::Heartbeat { holder, picks, ttl_ms }),
        2 => (holder.clone(), pick.clone(), proptest::collection::btree_set(0..ROWS, 1..=2), any::<bool>(), ttl_ms)
            .prop_map(|(holder, pick, rows, shared, ttl_ms)| Step::LockRelated { holder, pick, rows, shared, ttl_ms }),
        3 => (holder.clone(), pick.clone(), rows).prop_map(|(holder, pick, related_rows)| Step::Apply { holder, pick, related_rows }),
        1 => (holder.clone(), pick.clone()).prop_map(|(holder, pick)| Step::Reset { holder, pick }),
        1 => (holder, proptest::collection::vec(pick, 1..=3)).prop_map(|(holder, picks)| Step::Release { holder, picks }),
        1 => (0..ROWS).prop_map(|row| Step::UpdateUnleased { row }),
        3 => (0..=8_000u64).prop_map(|ms| Step::Advance { ms }),
    ]
}

/// How often the cases reached each outcome, so the properties cannot hold vacuously.
#[derive(Debug, Default)]
struct Reached {
    applied: usize,
    stale_applies: usize,
    takeovers: usize,
    heartbeats_refused: usize,
    locked: usize,
    contended: usize,
    /// Contended locks that only the holder's own pipeline's items turned away.
    contended_by_own_pipeline: usize,
    resets: usize,
    released: usize,
    written: usize,
}

/// What the store must show for one row.
#[derive(Clone, Debug, Default, PartialEq)]
struct Expected {
    /// The token the row carries and when its lease expires (store clock), if any.
    lease: Option<(LockToken, Timestamp)>,
    /// The row's data: the last successful write.
    data: Value,
}

struct Model {
    store: MemStore,
    clock: ManualClock,
    ids: Vec<RowId>,
    rows: BTreeMap<RowId, Expected>,
    /// Latest token handed out per row, by a fetch or a related lock.
    latest: BTreeMap<RowId, LockToken>,
    /// Largest token ever handed out.
    token_max: LockToken,
    /// Every lease each holder was ever given, oldest first; holders never forget one.
    given: Vec<Vec<Lease>>,
}

impl Model {
    async fn new() -> Model {
        let clock = ManualClock::new(START);
        let store = MemStore::new(clock.clone());
        let mut ids = Vec::new();
        let mut rows = BTreeMap::new();
        for index in 0..ROWS {
            let row = store.insert(NewRow::new(KIND, "ready", json!({ "index": index }))).await.unwrap();
            rows.insert(row.id, Expected { lease: None, data: row.data });
            ids.push(row.id);
        }
        Model {
            store,
            clock,
            ids,
            rows,
            latest: BTreeMap::new(),
            token_max: LockToken(0),
            given: vec![Vec::new(); HOLDERS],
        }
    }

    fn now(&self) -> Timestamp {
        use lockstep::store::Clock;
        self.clock.now()
    }

    /// The live lease on `id` at `now`, if any.
    fn live(&self, id: RowId, now: Timestamp) -> Option<(LockToken, Timestamp)> {
        self.rows[&id].lease.filter(|(_, expires)| *expires > now)
    }

    fn carries(&self, id: RowId, token: LockToken) -> bool {
        self.rows[&id].lease.is_some_and(|(t, _)| t == token)
    }

    /// A lease of `holder` chosen by `pick`; a holder that was never given one uses token 0, never issued.
    fn lease(&self, holder: usize, pick: usize) -> Lease {
        let given = &self.given[holder];
        if given.is_empty() {
            return Lease { id: self.ids[pick % ROWS], token: LockToken(0) };
        }
        given[pick % given.len()]
    }

    /// Clears every row carrying `token` (the main row and its related locks): an apply, reset or release
    /// consumed it.
    fn consume(&mut self, token: LockToken) {
        for expected in self.rows.values_mut() {
            if expected.lease.is_some_and(|(t, _)| t == token) {
                expected.lease = None;
            }
        }
    }

    /// Property 1: a write that succeeded carried the row's latest token.
    fn assert_latest(&self, what: &str, id: RowId, token: LockToken) {
        assert_eq!(
            self.latest.get(&id),
            Some(&token),
            "{what} succeeded on row {id} with token {token}, but the latest token handed out is {:?}",
            self.latest.get(&id)
        );
    }

    async fn step(&mut self, step: &Step, reached: &mut Reached) {
        let now = self.now();
        match step.clone() {
            Step::Fetch { holder, limit, ttl_ms, min_interval_ms, retry_delay_ms } => {
                let pipeline = PIPELINES[holder % 2].to_string();
                let lease_ttl = Duration::from_millis(ttl_ms);
                let params = FetchParams {
                    pipeline: pipeline.clone(),
                    kind: KIND.into(),
                    statuses: vec!["ready".into()],
                    limit,
                    lease_ttl,
                    min_processing_interval: Duration::from_millis(min_interval_ms),
                    retry_delay: Duration::from_millis(retry_delay_ms),
                };
                let rows = self.store.fetch(params).await.unwrap();
                assert!(rows.len() <= limit, "fetch returned {} rows past its limit {limit}", rows.len());
                for row in rows {
                    let token = row.lock_token.expect("a fetched row carries a token");
                    // Property 2: no fetch takes a row whose lease is live.
                    if let Some((live, expires)) = self.live(row.id, now) {
                        panic!(
                            "fetch by {pipeline} took row {} (token {token}) while token {live} was live until {expires} (now {now})",
                            row.id
                        );
                    }
                    if self.rows[&row.id].lease.is_some() {
                        reached.takeovers += 1;
                    }
                    assert!(
                        token > self.token_max,
                        "token {token} of row {} is not fresh (max so far {})",
                        row.id,
                        self.token_max
                    );
                    assert_eq!(row.lock_expires_at, Some(now.plus(lease_ttl)), "row {} expiry", row.id);
                    assert_eq!(row.lock_owner.as_deref(), Some(pipeline.as_str()), "row {} owner", row.id);
                    self.token_max = token;
                    self.latest.insert(row.id, token);
                    self.rows.get_mut(&row.id).unwrap().lease = Some((token, now.plus(lease_ttl)));
                    self.given[holder].push(Lease { id: row.id, token });
                }
            }
            Step::Heartbeat { holder, picks, ttl_ms } => {
                let leases: Vec<Lease> = picks.iter().map(|pick| self.lease(holder, *pick)).collect();
                // Held: the row carries the token and the lease has not expired (a heartbeat never revives one).
                let expected: Vec<Lease> = leases
                    .iter()
                    .copied()
                    .filter(|l| self.live(l.id, now).is_some_and(|(t, _)| t == l.token))
                    .collect();
                let lease_ttl = Duration::from_millis(ttl_ms);
                let held = self.store.heartbeat(HeartbeatParams { leases: leases.clone(), lease_ttl }).await.unwrap();
                assert_eq!(held, expected, "heartbeat of {leases:?}: held leases");
                reached.heartbeats_refused += leases.len() - held.len();
                for lease in &held {
                    self.assert_latest("heartbeat", lease.id, lease.token);
                    for expected in self.rows.values_mut() {
                        if let Some((token, expires)) = &mut expected.lease
                            && *token == lease.token
                        {
                            // A heartbeat extends a lease and never shortens it (`Store::heartbeat`): a
                            // shorter ttl than the lease has left keeps the later expiry.
                            *expires = (*expires).max(now.plus(lease_ttl));
                        }
                    }
                }
            }
            Step::LockRelated { holder, pick, rows, shared, ttl_ms } => {
                let lease = self.lease(holder, pick);
                let related: Vec<RowId> = rows.iter().map(|i| self.ids[*i]).filter(|id| *id != lease.id).collect();
                if related.is_empty() {
                    return;
                }
                let pipeline = PIPELINES[holder % 2];
                let owner = if shared { format!("{pipeline}:{}", lease.id) } else { pipeline.to_string() };
                let before: BTreeMap<RowId, Row> = self.store.rows().into_iter().map(|row| (row.id, row)).collect();
                let available: Vec<RowId> =
                    related.iter().copied().filter(|id| available(&before[id], lease, &owner, now)).collect();
                let expected = if !self.carries(lease.id, lease.token) {
                    LockOutcome::Stale
                } else if available.len() == related.len() {
                    LockOutcome::Locked
                } else {
                    // Turned away by its own pipeline's items only: every unavailable row carries a token under
                    // an owner that names the holder's pipeline, plainly or as `pipeline:item`.
                    let own = |id: &RowId| {
                        let held_by = before[id].lock_owner.as_deref().unwrap_or("");
                        let named = held_by == pipeline || held_by.starts_with(&format!("{pipeline}:"));
                        named && before[id].lock_token.is_some()
                    };
                    let by_own_pipeline = related.iter().filter(|id| !available.contains(id)).all(own);
                    LockOutcome::Contended { by_own_pipeline }
                };
                let lease_ttl = Duration::from_millis(ttl_ms);
                let retry_delay = Duration::from_millis(500);
                let params = LockRelatedParams {
                    holder: lease,
                    related: related.clone(),
                    owner,
                    lease_ttl,
                    retry_delay,
                    park: false,
                };
                let outcome = self.store.lock_related(params).await.unwrap();
                assert_eq!(outcome, expected, "lock_related of {related:?} for {lease:?}");
                match outcome {
                    LockOutcome::Stale => {}
                    LockOutcome::Locked => {
                        reached.locked += 1;
                        self.assert_latest("lock_related", lease.id, lease.token);
                        for id in related {
                            // Property 2: a related lock never takes a row leased live under another token.
                            if let Some((live, _)) = self.live(id, now) {
                                assert_eq!(
                                    live, lease.token,
                                    "lock_related for {lease:?} took row {id} live under {live}"
                                );
                            }
                            self.latest.insert(id, lease.token);
                            self.rows.get_mut(&id).unwrap().lease = Some((lease.token, now.plus(lease_ttl)));
                        }
                    }
                    LockOutcome::Contended { by_own_pipeline } => {
                        reached.contended += 1;
                        reached.contended_by_own_pipeline += usize::from(by_own_pipeline);
                        // The available rows take an intent mark without a token: whatever token they carried
                        // (expired, or the holder's own) is gone.
                        for id in available {
                            self.rows.get_mut(&id).unwrap().lease = None;
                        }
                    }
                }
            }
            Step::Apply { holder, pick, related_rows } => {
                let lease = self.lease(holder, pick);
                let related: Vec<RowId> =
                    related_rows.iter().map(|i| self.ids[*i]).filter(|id| *id != lease.id).collect();
                let written = json!({ "writer": lease.token.0, "row": lease.id.0 });
                let mut params = ApplyParams::new(lease, RowUpdate { status: None, data: Some(written.clone()) });
                params.related = related
                    .iter()
                    .map(|id| RelatedUpdate {
                        id: *id,
                        update: RowUpdate { status: None, data: Some(json!({ "writer": lease.token.0, "row": id.0 })) },
                    })
                    .collect();
                let expected =
                    self.carries(lease.id, lease.token) && related.iter().all(|id| self.carries(*id, lease.token));
                let outcome = self.store.apply(params).await.unwrap();
                assert_eq!(
                    matches!(outcome, ApplyOutcome::Applied { .. }),
                    expected,
                    "apply of {lease:?} with related {related:?}: {outcome:?}"
                );
                if !expected {
                    reached.stale_applies += 1;
                    return;
                }
                reached.applied += 1;
                // Property 3: the data is written by the latest token's holder only.
                self.assert_latest("apply", lease.id, lease.token);
                self.rows.get_mut(&lease.id).unwrap().data = written;
                for id in related {
                    self.assert_latest("apply (related row)", id, lease.token);
                    self.rows.get_mut(&id).unwrap().data = json!({ "writer": lease.token.0, "row": id.0 });
                }
                self.consume(lease.token);
            }
            Step::Reset { holder, pick } => {
                let lease = self.lease(holder, pick);
                let expected = self.carries(lease.id, lease.token);
                let held = self.store.reset_for_retry(lease, Duration::from_millis(500)).await.unwrap();
                assert_eq!(held, expected, "reset of {lease:?}");
                if held {
                    reached.resets += 1;
                    self.assert_latest("reset_for_retry", lease.id, lease.token);
                    self.consume(lease.token);
                }
            }
            Step::Release { holder, picks } => {
                let leases: Vec<Lease> = picks.iter().map(|pick| self.lease(holder, *pick)).collect();
                let expected: Vec<Lease> = leases.iter().copied().filter(|l| self.carries(l.id, l.token)).collect();
                let released = self.store.release(leases.clone()).await.unwrap();
                assert_eq!(released, expected.len(), "release of {leases:?}");
                reached.released += released;
                for lease in expected {
                    self.assert_latest("release", lease.id, lease.token);
                    self.consume(lease.token);
                }
            }
            Step::UpdateUnleased { row } => {
                let id = self.ids[row];
                let data = json!({ "writer": "api", "at": now.as_micros() });
                let update = RowUpdate { status: None, data: Some(data.clone()) };
                let outcome = self.store.update_unleased(id, update).await.unwrap();
                if outcome == WriteOutcome::Written {
                    reached.written += 1;
                    // Property 2: a write API never overrides a live lease.
                    assert_eq!(self.live(id, now), None, "update_unleased wrote row {id} under a live lease");
                    if let Some((token, _)) = self.rows[&id].lease {
                        // The write takes the row over, and the rows locked as related with its token (PostgreSQL's
                        // `related_token`), but not the main row of the token: that lease is its holder's to lose.
                        let main = self.given.iter().flatten().find(|lease| lease.token == token).map(|lease| lease.id);
                        for (row_id, expected) in self.rows.iter_mut() {
                            let carries = expected.lease.is_some_and(|(t, _)| t == token);
                            if carries && (*row_id == id || Some(*row_id) != main) {
                                expected.lease = None;
                            }
                        }
                    }
                    self.rows.get_mut(&id).unwrap().data = data;
                }
            }
            Step::Advance { ms } => self.clock.advance(Duration::from_millis(ms)),
        }
    }

    /// The store matches the model row by row, and holds at most one live lease per row.
    fn assert_store_matches(&self, after: &Step) {
        let now = self.now();
        for row in self.store.rows() {
            let expected = &self.rows[&row.id];
            let actual = row.lock_token.map(|token| (token, row.lock_expires_at.expect("a token without an expiry")));
            assert_eq!(actual, expected.lease, "after {after:?}: row {} lease (token, expiry)", row.id);
            assert_eq!(row.data, expected.data, "after {after:?}: row {} data", row.id);
            if let Some(token) = row.lock_token {
                assert_eq!(
                    self.latest.get(&row.id),
                    Some(&token),
                    "after {after:?}: row {} carries a superseded token",
                    row.id
                );
            }
            // Property 2, as the holders see it: of all the leases ever given out on this row, at most one is live.
            let live: BTreeSet<LockToken> = self
                .given
                .iter()
                .flatten()
                .filter(|lease| lease.id == row.id && row.lock_token == Some(lease.token))
                .filter(|_| row.lock_expires_at.is_some_and(|expires| expires > now))
                .map(|lease| lease.token)
                .collect();
            assert!(live.len() <= 1, "after {after:?}: row {} has live leases {live:?}", row.id);
        }
    }
}

/// The documented rule of [`Store::lock_related`]: a related row is available unless it holds a live lease with
/// another token, or carries another owner's mark with no token that has not expired (a reset row's mark has no
/// expiry and never does). A shared lock (`owner` = `P:i`) also takes a row marked `P` (its own pipeline's reset
/// or parent mark) and a fresh mark `Q:j` of a younger item (`j > i`, any pipeline Q): the age rule.
fn available(row: &Row, holder: Lease, owner: &str, now: Timestamp) -> bool {
    let live = row.lock_expires_at.is_none_or(|expires| expires > now);
    let item =
        |text: &str| text.split_once(':').map(|(pipeline, id)| (pipeline.to_string(), id.parse::<i64>().unwrap()));
    match (row.lock_token, row.lock_owner.as_deref()) {
        (Some(token), _) => token == holder.token || !live,
        (None, None) => true,
        (None, Some(mark)) if mark == owner || !live => true,
        (None, Some(mark)) => match (item(owner), item(mark)) {
            (Some((pipeline, _)), None) => mark == pipeline,
            (Some((_, mine)), Some((_, theirs))) => theirs > mine,
            (None, _) => false,
        },
    }
}

fn run_case(steps: &[Step], reached: &mut Reached) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    runtime.block_on(async {
        let mut model = Model::new().await;
        for step in steps {
            model.step(step, reached).await;
            model.assert_store_matches(step);
        }
    });
}

#[test]
fn leases_stay_exclusive_under_random_interleavings() {
    // Case count and seed follow PROPTEST_CASES / PROPTEST_RNG_SEED; a failure prints its shrunk steps.
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let reached = RefCell::new(Reached::default());
    let steps = proptest::collection::vec(step(), 1..=STEPS_MAX);
    let result = runner.run(&steps, |steps| {
        run_case(&steps, &mut reached.borrow_mut());
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    // Every outcome the properties speak of must have been reached, or they held vacuously.
    let reached = reached.into_inner();
    let counts = [
        reached.applied,
        reached.stale_applies,
        reached.takeovers,
        reached.heartbeats_refused,
        reached.locked,
        reached.contended,
        reached.contended_by_own_pipeline,
        reached.resets,
        reached.released,
        reached.written,
    ];
    assert!(counts.iter().all(|count| *count > 0), "some outcome was never reached: {reached:?}");
}
