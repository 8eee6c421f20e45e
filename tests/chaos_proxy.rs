//! The chaos proxy's link faults against a real PostgreSQL: what each mode does to a session, seen
//! from the client and from the server. Each test has its own schema and names its sessions after it. Needs
//! PostgreSQL (see `support::pg`; never skips).

#![cfg(not(madsim))]

use crate::support;

use lockstep::chaos::proxy::{LinkFault, ProxyHandle};
use sqlx::{Connection, Executor, PgConnection};
use std::time::{Duration, Instant};
use support::chaos::{Scoped, wait_until};

/// Longest a query through a passing proxy may take on a loaded machine.
const QUERY_WAIT: Duration = Duration::from_secs(10);

async fn query_value(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT 7").fetch_one(conn).await
}

#[tokio::test]
async fn a_passing_link_carries_sessions_and_names_them() {
    let run = Scoped::new().await;
    let proxy = run.proxy(1).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    assert_eq!(query_value(&mut conn).await.expect("a query through the proxy"), 7);
    let open = proxy.handle().connections();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].application_name.as_deref(), Some(run.app("a").as_str()));
    assert!(proxy.handle().stats().bytes_up > 0 && proxy.handle().stats().bytes_down > 0);
    conn.close().await.expect("a clean close passes through");
    run.finish().await;
}

#[tokio::test]
async fn a_cut_resets_open_sessions_and_new_ones_pass() {
    let run = Scoped::new().await;
    let proxy = run.proxy(2).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    assert_eq!(proxy.handle().cut(), 1);
    let failed = query_value(&mut conn).await;
    assert!(failed.is_err(), "a query on a cut session: {failed:?}");
    // The server ended the session too: its socket was reset.
    wait_until("the cut session ends on the server", || run.sessions_named("a")).await;
    let mut again = run.connect_through(&proxy, "b").await;
    assert_eq!(query_value(&mut again).await.expect("a new session passes"), 7);
    assert_eq!(proxy.handle().stats().resets, 1);
    run.finish().await;
}

#[tokio::test]
async fn a_stalled_link_holds_a_query_until_it_heals() {
    let run = Scoped::new().await;
    let proxy = run.proxy(3).await;
    let handle = proxy.handle();
    let mut conn = run.connect_through(&proxy, "a").await;
    assert_eq!(handle.requests_in_flight(), 0, "nothing on its way up between queries");
    handle.set(LinkFault::Stall);
    let query = tokio::spawn(async move { query_value(&mut conn).await });
    wait_for_proxy(&handle, "the query is held", |h| h.stats().chunks_held > 0).await;
    assert!(!query.is_finished(), "a stalled query returned");
    assert!(handle.requests_in_flight() >= 1, "the held query is on its way up");
    handle.set(LinkFault::Pass);
    let value = tokio::time::timeout(QUERY_WAIT, query).await.expect("the held query ends").expect("join");
    assert_eq!(value.expect("the held query succeeds once the link heals"), 7);
    assert_eq!(handle.requests_in_flight(), 0, "the query reached the server");
    run.finish().await;
}

#[tokio::test]
async fn a_black_hole_neither_answers_nor_closes_and_its_sessions_stay_dead_after_healing() {
    let run = Scoped::new().await;
    let proxy = run.proxy(4).await;
    let handle = proxy.handle();
    let mut conn = run.connect_through(&proxy, "a").await;
    handle.set(LinkFault::BlackHole);
    let query = tokio::spawn(async move { query_value(&mut conn).await });
    wait_for_proxy(&handle, "the query is swallowed", |h| h.stats().chunks_lost > 0).await;
    handle.set(LinkFault::Pass);
    // A session opened after the link healed works; the black-holed one still waits (no FIN, no RST came).
    let mut fresh = run.connect_through(&proxy, "b").await;
    assert_eq!(query_value(&mut fresh).await.expect("a new session passes"), 7);
    assert!(!query.is_finished(), "the black-holed query returned");
    let dead: Vec<_> = handle.connections().into_iter().filter(|c| c.black_holed).collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].application_name.as_deref(), Some(run.app("a").as_str()));
    // The server never saw the query: its session of `a` sits idle.
    assert!(run.idle_session_named("a").await, "the server saw the black-holed query");
    drop(proxy);
    let ended = tokio::time::timeout(QUERY_WAIT, query).await.expect("a dropped proxy resets").expect("join");
    assert!(ended.is_err(), "{ended:?}");
    run.finish().await;
}

#[tokio::test]
async fn black_holing_chosen_sessions_leaves_the_others_alone() {
    let run = Scoped::new().await;
    let proxy = run.proxy(5).await;
    let handle = proxy.handle();
    let mut victim = run.connect_through(&proxy, "victim").await;
    let mut other = run.connect_through(&proxy, "other").await;
    let victim_name = run.app("victim");
    let chosen = handle.black_hole_connections(|c| c.application_name.as_deref() == Some(victim_name.as_str()));
    assert_eq!(chosen, 1);
    assert_eq!(query_value(&mut other).await.expect("the other session passes"), 7);
    let query = tokio::spawn(async move { query_value(&mut victim).await });
    wait_for_proxy(&handle, "the victim's query is swallowed", |h| h.stats().chunks_lost > 0).await;
    assert!(!query.is_finished(), "the black-holed query returned");
    drop(proxy);
    run.finish().await;
}

#[tokio::test]
async fn a_delayed_link_slows_each_round_trip_by_both_ways() {
    let run = Scoped::new().await;
    let proxy = run.proxy(6).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    let delay = Duration::from_millis(200);
    proxy.handle().set(LinkFault::Delay(delay));
    let started = Instant::now();
    assert_eq!(query_value(&mut conn).await.expect("a delayed query"), 7);
    let took = started.elapsed();
    assert!(took >= delay * 2, "a round trip took {took:?}, less than the delay both ways");
    run.finish().await;
}

#[tokio::test]
async fn dropped_chunks_reset_their_session_and_a_zero_chance_drops_none() {
    let run = Scoped::new().await;
    let proxy = run.proxy(7).await;
    let handle = proxy.handle();
    let mut conn = run.connect_through(&proxy, "a").await;
    handle.set(LinkFault::Drop { probability: 0.0 });
    for _ in 0..20 {
        assert_eq!(query_value(&mut conn).await.expect("nothing dropped at chance 0"), 7);
    }
    handle.set(LinkFault::Drop { probability: 1.0 });
    let failed = query_value(&mut conn).await;
    assert!(failed.is_err(), "a query whose bytes were dropped: {failed:?}");
    assert_eq!(handle.stats().resets, 1);
    run.finish().await;
}

#[tokio::test]
async fn a_lost_reply_leaves_the_write_done_and_the_client_in_the_dark() {
    let run = Scoped::new().await;
    let proxy = run.proxy(8).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    proxy.handle().set(LinkFault::LoseReplies { probability: 1.0 });
    // A simple query, so the first reply is the statement's (a prepared one's first reply is its Parse's).
    let insert = sqlx::AssertSqlSafe(format!("INSERT INTO {}.marks VALUES (1)", run.schema));
    let failed = conn.execute(insert).await;
    assert!(failed.is_err(), "the client heard: {failed:?}");
    wait_until("the autocommitted insert is visible", || run.mark_exists(1)).await;
    run.finish().await;
}

#[tokio::test]
async fn a_session_cut_before_its_commit_writes_nothing() {
    let run = Scoped::new().await;
    let proxy = run.proxy(9).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    proxy.handle().cut_before(b"COMMIT");
    let committed = run.insert_in_transaction(&mut conn, 2).await;
    assert!(committed.is_err(), "the commit was cut: {committed:?}");
    assert_eq!(proxy.handle().triggers_armed(), 0, "the trigger fired");
    // Once the server ended the session, its transaction is rolled back.
    wait_until("the cut session ends on the server", || run.sessions_named("a")).await;
    assert!(!run.mark_exists(2).await, "a transaction whose COMMIT never arrived was committed");
    run.finish().await;
}

#[tokio::test]
async fn a_reply_lost_after_commit_leaves_the_transaction_committed() {
    let run = Scoped::new().await;
    let proxy = run.proxy(10).await;
    let mut conn = run.connect_through(&proxy, "a").await;
    proxy.handle().lose_reply_after(b"COMMIT");
    let committed = run.insert_in_transaction(&mut conn, 3).await;
    assert!(committed.is_err(), "the client heard the commit: {committed:?}");
    wait_until("the committed insert is visible", || run.mark_exists(3)).await;
    run.finish().await;
}

#[tokio::test]
async fn a_black_hole_trigger_takes_the_session_that_sends_its_pattern() {
    let run = Scoped::new().await;
    let proxy = run.proxy(11).await;
    let handle = proxy.handle();
    let mut listener = run.connect_through(&proxy, "listener").await;
    let mut other = run.connect_through(&proxy, "other").await;
    handle.black_hole_from(b"LISTEN");
    assert_eq!(query_value(&mut other).await.expect("no pattern, no black hole"), 7);
    let listen = tokio::spawn(async move { sqlx::query("LISTEN some_channel").execute(&mut listener).await });
    wait_for_proxy(&handle, "the LISTEN is swallowed", |h| h.triggers_armed() == 0).await;
    assert!(!listen.is_finished(), "the black-holed LISTEN returned");
    let dead: Vec<_> = handle.connections().into_iter().filter(|c| c.black_holed).collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].application_name.as_deref(), Some(run.app("listener").as_str()));
    assert_eq!(query_value(&mut other).await.expect("the other session still passes"), 7);
    drop(proxy);
    run.finish().await;
}

/// Waits, on the proxy's change signal, until `done` holds for the proxy.
async fn wait_for_proxy(handle: &ProxyHandle, what: &str, done: impl Fn(&ProxyHandle) -> bool) {
    let mut changes = handle.watch();
    let waited = tokio::time::timeout(QUERY_WAIT, async {
        while !done(handle) {
            changes.changed().await.expect("the proxy is running");
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: not within {QUERY_WAIT:?}");
}

#[tokio::test]
async fn a_held_commit_waits_while_its_session_is_terminated_and_then_fails_writing_nothing() {
    let run = Scoped::new().await;
    let proxy = run.proxy(12).await;
    let handle = proxy.handle();
    let mut conn = run.connect_through(&proxy, "a").await;
    handle.hold_before(b"COMMIT");
    let schema = run.schema.clone();
    let commit = tokio::spawn(async move {
        let mut tx = conn.begin().await.expect("begin");
        let insert = format!("INSERT INTO {schema}.marks VALUES (4)");
        sqlx::query(sqlx::AssertSqlSafe(insert)).execute(&mut *tx).await.expect("insert");
        tx.commit().await
    });
    wait_for_proxy(&handle, "the COMMIT is held", |h| h.holding().len() == 1).await;
    assert!(!commit.is_finished(), "a held commit returned");
    assert_eq!(run.terminate_idle_in_transaction("a").await, 1, "the session sat idle in its transaction");
    assert_eq!(handle.release_held(), 1);
    let committed = tokio::time::timeout(QUERY_WAIT, commit).await.expect("the commit ends").expect("join");
    assert!(committed.is_err(), "a commit on a terminated session: {committed:?}");
    assert!(!run.mark_exists(4).await, "a terminated session's transaction was committed");
    run.finish().await;
}
