//! PgStore's one lock order (DESIGN §2, "One lock order"): every statement that locks several rows locks them in id
//! order, so a heartbeat of a lease never deadlocks with the apply, reset, release or related lock of the same
//! lease; and a call that still fails with a deadlock or serialization failure (nothing written) is run again at
//! once, so the engine never sees it. Needs PostgreSQL (see `support::pg`; never skips).

#![cfg(not(madsim))]

use crate::support;

use lockstep::store::conformance::Harness;
use lockstep::store::{
    ApplyOutcome, ApplyParams, FetchParams, HeartbeatParams, Lease, LockOutcome, LockRelatedParams, NewRow, PgStore,
    RelatedUpdate, RowId, RowUpdate, Store, StoreError,
};
use sqlx::{Connection, PgConnection};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::pg::{PgHarness, database_url};
use tokio::sync::Barrier;

/// Rounds of the race: each leases a fresh parent with related rows on both sides of its id and runs heartbeats
/// against one of the lease's other writes. Before the lock order was fixed, the heartbeat-against-apply rounds
/// deadlocked within the first dozen (PostgreSQL then reports 40P01 after its 1 s `deadlock_timeout`).
const ROUNDS: usize = 70;
/// Heartbeats racing the write in each round.
const HEARTBEATS_PER_ROUND: usize = 2;
const LEASE_TTL: Duration = Duration::from_secs(60);
/// Longest wait for a session to be seen waiting on a row lock.
const LOCK_WAIT_SEEN_MAX: Duration = Duration::from_secs(10);

/// The write that races the heartbeats in a round.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// Apply with related updates (the case: related rows were written before the main row).
    ApplyRelated,
    /// Apply of the main row only; the related rows are unlocked with it.
    ApplyMain,
    /// A batch of the family's apply with related updates and a lone row's apply.
    BatchRelated,
    /// A batch of main-row applies; the family's related rows are unlocked with its parent.
    BatchMain,
    ResetForRetry,
    Release,
    /// A second related lock of the same holder over more rows.
    LockMore,
}

const WRITES: [Write; 7] = [
    Write::ApplyRelated,
    Write::ApplyMain,
    Write::BatchRelated,
    Write::BatchMain,
    Write::ResetForRetry,
    Write::Release,
    Write::LockMore,
];

/// A leased parent whose related rows (locked with its token) have ids below and above its own, and rows it may
/// lock later.
struct Family {
    parent: Lease,
    related: Vec<RowId>,
    more: Vec<RowId>,
    /// A leased row of its own (the second item of the batches).
    lone: Lease,
}

fn fetch_params(kind: &str) -> FetchParams {
    FetchParams {
        pipeline: "ops".into(),
        kind: kind.into(),
        statuses: vec!["ready".into()],
        limit: 1,
        lease_ttl: LEASE_TTL,
        min_processing_interval: Duration::from_secs(3600),
        retry_delay: Duration::from_secs(3600),
    }
}

async fn lease_one(store: &PgStore, kind: &str) -> Lease {
    let rows = store.fetch(fetch_params(kind)).await.expect("fetch");
    assert_eq!(rows.len(), 1, "one {kind} row to lease");
    Lease { id: rows[0].id, token: rows[0].lock_token.expect("a leased row carries a token") }
}

/// Inserts related rows, the parent, more related rows and a lone row (ids in that order), leases the parent and
/// the lone row, and locks the related rows with the parent's token.
async fn family(store: &PgStore, round: usize) -> Family {
    let (parent_kind, lone_kind) = (format!("op{round}"), format!("lone{round}"));
    let job = || NewRow::new("job", "waiting", serde_json::json!({}));
    let mut rows = vec![job(), job(), NewRow::new(&parent_kind, "ready", serde_json::json!({})), job(), job()];
    rows.extend([job(), job(), NewRow::new(&lone_kind, "ready", serde_json::json!({}))]);
    let ids = store.insert_many(rows, Vec::new()).await.expect("insert");
    let parent = lease_one(store, &parent_kind).await;
    assert_eq!(parent.id, ids[2]);
    let lone = lease_one(store, &lone_kind).await;
    let related = vec![ids[0], ids[1], ids[3], ids[4]];
    let locked = store
        .lock_related(LockRelatedParams {
            holder: parent,
            related: related.clone(),
            owner: "ops".into(),
            lease_ttl: LEASE_TTL,
            retry_delay: std::time::Duration::from_millis(500),
            park: false,
        })
        .await
        .expect("lock_related");
    assert_eq!(locked, LockOutcome::Locked);
    Family { parent, related, more: vec![ids[5], ids[6]], lone }
}

fn apply_related(family: &Family) -> ApplyParams {
    let related =
        family.related.iter().map(|id| RelatedUpdate { id: *id, update: RowUpdate::status("running") }).collect();
    ApplyParams { related, ..ApplyParams::new(family.parent, RowUpdate::status("running")) }
}

/// Runs `write` on `family` and checks its outcome: every write of the lease's holder succeeds.
async fn write(store: &PgStore, family: &Family, write: Write) -> Result<(), StoreError> {
    let applied = |outcome: &ApplyOutcome| matches!(outcome, ApplyOutcome::Applied { .. });
    let lone = ApplyParams::new(family.lone, RowUpdate::status("done"));
    match write {
        Write::ApplyRelated => assert!(applied(&store.apply(apply_related(family)).await?)),
        Write::ApplyMain => {
            assert!(applied(&store.apply(ApplyParams::new(family.parent, RowUpdate::status("running"))).await?))
        }
        Write::BatchRelated => {
            let outcomes = store.apply_batch(vec![apply_related(family), lone]).await?;
            assert!(outcomes.iter().all(applied), "{outcomes:?}");
        }
        Write::BatchMain => {
            let main = ApplyParams::new(family.parent, RowUpdate::status("running"));
            let outcomes = store.apply_batch(vec![main, lone]).await?;
            assert!(outcomes.iter().all(applied), "{outcomes:?}");
        }
        Write::ResetForRetry => {
            assert!(store.reset_for_retry(family.parent, std::time::Duration::from_millis(500)).await?)
        }
        Write::Release => assert_eq!(store.release(vec![family.parent, family.lone]).await?, 2),
        Write::LockMore => {
            let mut related = family.related.clone();
            related.extend(&family.more);
            let params = LockRelatedParams {
                holder: family.parent,
                related,
                owner: "ops".into(),
                lease_ttl: LEASE_TTL,
                retry_delay: std::time::Duration::from_millis(500),
                park: false,
            };
            assert_eq!(store.lock_related(params).await?, LockOutcome::Locked);
        }
    }
    Ok(())
}

/// The heartbeat of the family's lease, run while its write is in flight. It may find the lease already given up
/// (the write finished first); it must never fail.
async fn heartbeat(store: &PgStore, family: &Family) -> Result<(), StoreError> {
    let held = store.heartbeat(HeartbeatParams { leases: vec![family.parent], lease_ttl: LEASE_TTL }).await?;
    assert!(held.len() <= 1, "{held:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_never_deadlock_with_the_writes_of_the_same_lease() {
    let h = PgHarness::with(|o| o.max_connections = 8).await;
    let store = Arc::new(h.store().clone());
    for round in 0..ROUNDS {
        let kind = WRITES[round % WRITES.len()];
        let family = Arc::new(family(&store, round).await);
        let start = Arc::new(Barrier::new(HEARTBEATS_PER_ROUND + 1));
        let mut calls = Vec::new();
        for _ in 0..HEARTBEATS_PER_ROUND {
            let (store, family, start) = (store.clone(), family.clone(), start.clone());
            calls.push(tokio::spawn(async move {
                start.wait().await;
                ("heartbeat", heartbeat(&store, &family).await)
            }));
        }
        let (racing, family_, start_) = (store.clone(), family.clone(), start.clone());
        calls.push(tokio::spawn(async move {
            start_.wait().await;
            ("write", write(&racing, &family_, kind).await)
        }));
        for call in calls {
            let (which, outcome) = call.await.expect("no call panicked");
            if let Err(error) = outcome {
                panic!("round {round} ({kind:?}): the {which} failed: {error}");
            }
        }
    }
    // A deadlock that was retried away is still a lock-order bug.
    assert_eq!(store.conflict_retries(), 0, "calls that met a deadlock or serialization failure and were retried");
}

/// Waits until a session named `application_name` waits on a lock.
async fn until_waiting_on_a_lock(conn: &mut PgConnection, application_name: &str) {
    let started = Instant::now();
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock')",
        )
        .bind(application_name)
        .fetch_one(&mut *conn)
        .await
        .expect("pg_stat_activity is readable");
        if waiting {
            return;
        }
        assert!(started.elapsed() < LOCK_WAIT_SEEN_MAX, "{application_name} not seen waiting on a lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_chosen_as_a_deadlock_victim_is_run_again_and_succeeds() {
    let h = PgHarness::new().await;
    let schema = h.store().schema().to_string();
    // The session name is scoped to this test's schema, so no other run's sessions are looked at.
    let application_name = format!("{schema}_victim");
    let victim = support::pg::store_with(|o| {
        o.schema = schema.clone();
        o.application_name = application_name.clone();
    })
    .await;
    let family = family(&victim, 0).await;
    let high = *family.related.last().expect("related rows");
    assert!(high > family.parent.id);

    // 1. Another session (not lockstep: nothing stops a person running SQL) locks the highest related row.
    let mut other = PgConnection::connect(&database_url()).await.expect("connect");
    let other_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut other).await.expect("pid");
    sqlx::query("BEGIN").execute(&mut other).await.expect("begin");
    // Its own deadlock check fires long after the store's (the server default, 1 s), so the store is the victim.
    sqlx::query("SET LOCAL deadlock_timeout = '30s'").execute(&mut other).await.expect("set");
    let lock = format!("SELECT 1 FROM \"{schema}\".resources WHERE id = $1 FOR UPDATE");
    sqlx::query(sqlx::AssertSqlSafe(lock.clone())).bind(high.0).execute(&mut other).await.expect("lock high");
    // 2. The heartbeat locks the parent and waits for that row.
    let heartbeat = tokio::spawn({
        let victim = victim.clone();
        async move { victim.heartbeat(HeartbeatParams { leases: vec![family.parent], lease_ttl: LEASE_TTL }).await }
    });
    let mut watcher = PgConnection::connect(&database_url()).await.expect("connect");
    until_waiting_on_a_lock(&mut watcher, &application_name).await;
    // 3. The other session asks for the parent: a deadlock. After its 1 s `deadlock_timeout` PostgreSQL aborts
    //    the heartbeat's transaction, and the store runs it again at once.
    let parent = family.parent.id.0;
    let other_wants_parent = tokio::spawn(async move {
        let _ = sqlx::query(sqlx::AssertSqlSafe(lock)).bind(parent).execute(&mut other).await;
        other
    });
    let started = Instant::now();
    while victim.conflict_retries() == 0 {
        assert!(started.elapsed() < LOCK_WAIT_SEEN_MAX, "no deadlock within {LOCK_WAIT_SEEN_MAX:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 4. The other session goes away (had it won the parent back, the run again would meet it once more: a row
    //    lock freed by an aborted transaction goes to whoever asks first). The heartbeat, run again, goes through.
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(other_pid)
        .fetch_one(&mut watcher)
        .await
        .expect("end the other session");
    assert!(ended, "the other session (pid {other_pid}) ended");
    drop(other_wants_parent.await.expect("no panic"));
    let held = heartbeat.await.expect("no panic").expect("the heartbeat was run again after the deadlock");
    assert_eq!(held, vec![family.parent]);
    assert_eq!(victim.conflict_retries(), 1, "the deadlock was retried once");
}

/// The statement of an apply's fetch hints marks several rows, so it locks them in id order like every other such
/// statement (DESIGN §2, one lock order): while it waits for a lower row another session holds, a higher row it
/// names is not locked yet, even when the hints name the higher row first and the lower row's live version lies
/// after the higher one's in the table (it was written since).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hints_of_an_apply_lock_their_rows_in_id_order() {
    use lockstep::store::NewHint;
    let h = PgHarness::new().await;
    let schema = h.store().schema().to_string();
    // The session name is scoped to this test's schema, so no other run's sessions are looked at.
    let application_name = format!("{schema}_hints");
    let store = support::pg::store_with(|o| {
        o.schema = schema.clone();
        o.application_name = application_name.clone();
    })
    .await;
    let job = || NewRow::new("job", "waiting", serde_json::json!({}));
    let rows = vec![job(), job(), NewRow::new("task", "ready", serde_json::json!({}))];
    let ids = store.insert_many(rows, Vec::new()).await.expect("insert");
    let (low, high) = (ids[0], ids[1]);
    for round in 0..3 {
        let update = RowUpdate { status: None, data: Some(serde_json::json!({ "round": round })) };
        store.update_unleased(low, update).await.expect("update the lower row");
    }
    let main = lease_one(&store, "task").await;

    // 1. Another session locks the lower row.
    let mut other = PgConnection::connect(&database_url()).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut other).await.expect("begin");
    let lock = |id: RowId, nowait: &str| {
        format!("SELECT 1 FROM \"{schema}\".resources WHERE id = {} FOR UPDATE {nowait}", id.0)
    };
    sqlx::query(sqlx::AssertSqlSafe(lock(low, ""))).execute(&mut other).await.expect("lock the lower row");
    // 2. An apply whose hints name the higher row first: it commits, then its hints wait for the lower row.
    let hints = vec![NewHint::row("job", high), NewHint::row("job", low)];
    let params = ApplyParams { hints, ..ApplyParams::new(main, RowUpdate::status("done")) };
    let apply = tokio::spawn({
        let store = store.clone();
        async move { store.apply(params).await }
    });
    let mut watcher = PgConnection::connect(&database_url()).await.expect("connect");
    until_waiting_on_a_lock(&mut watcher, &application_name).await;
    // 3. Meanwhile the higher row is free: it is locked only after the lower one.
    sqlx::query("BEGIN").execute(&mut watcher).await.expect("begin");
    let free = sqlx::query(sqlx::AssertSqlSafe(lock(high, "NOWAIT"))).execute(&mut watcher).await;
    assert!(free.is_ok(), "the hints locked row {high} before row {low}: {free:?}");
    sqlx::query("ROLLBACK").execute(&mut watcher).await.expect("rollback");
    // 4. The other session lets go; the hints go through.
    sqlx::query("ROLLBACK").execute(&mut other).await.expect("rollback");
    let outcome = apply.await.expect("no panic").expect("the apply");
    assert!(matches!(outcome, ApplyOutcome::Applied { .. }), "{outcome:?}");
    for id in [low, high] {
        assert!(store.get(id).await.expect("get").expect("the row").hinted, "row {id} hinted");
    }
}
