//! A pipeline's waitlist for related rows in one replica: its items that lock the same related row take turns in
//! memory, first come first served, instead of meeting in the store.
//!
//! Without it, an item whose related row another item of the same replica holds finds it contended in the store,
//! is reset for retry (dstack PIPELINES, checklist 7) and is fetched again no sooner than `retry_delay` later. On a
//! hot shared row that is a reset per waiting item per turn, and a worker's own apply still in flight under
//! apply batching holds the row its next item asks for: a new user's trial measured 60 claims of 20 ms on one row
//! at 12 s with 1 worker and 40 s with 4 (`tests/engine.rs`, `items_contending_for_one_hot_row_…`).
//!
//! The rule: before [`LoadCx`](super::LoadCx) asks the store for related locks, it takes each row's turn here, in
//! row-id order. A row whose turn another lease of the pipeline has is waited for, until that item ends (its apply
//! answered, its reset made, whatever the outcome) and hands the turn on, but at most `retry_delay` in all, which
//! is what a reset would cost at least. Then the store decides, as before: the waitlist only orders this replica's
//! items, and never stands in for a lock (other replicas and pipelines, and an item whose wait ran out, still meet
//! in the store, which resets the loser).
//!
//! No wait can deadlock: every wait is bounded, and a turn is held from the call that takes it until its item ends.

use super::clock::LocalClock;
use crate::store::{Lease, RowId};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::oneshot;

/// The turns of one pipeline's related rows in one replica (see the module doc).
#[derive(Default)]
pub struct Waitlist {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each row whose turn a lease has, with the leases waiting for it in order of arrival.
    rows: BTreeMap<RowId, Turn>,
    /// The rows whose turn each lease has, to hand them on when its item ends.
    turns: BTreeMap<Lease, Vec<RowId>>,
}

struct Turn {
    holder: Lease,
    waiting: VecDeque<(Lease, oneshot::Sender<()>)>,
}

impl Waitlist {
    /// Takes the turn of each of `rows` for `lease`, in row-id order, waiting for a row another lease has until it
    /// is handed on, at most `wait` (local time, `clock`) in all. Returns whether every turn was taken; when the
    /// wait runs out, the rows after the one waited for are not taken, and the caller asks the store anyway.
    pub async fn take(&self, lease: Lease, rows: &[RowId], wait: Duration, clock: &LocalClock) -> bool {
        let mut rows = rows.to_vec();
        rows.sort_unstable();
        rows.dedup();
        let deadline = clock.now() + wait;
        for row in rows {
            let turn = {
                let mut state = self.lock();
                match state.rows.get_mut(&row) {
                    Some(turn) if turn.holder == lease => continue,
                    Some(_) if wait.is_zero() => return false,
                    Some(turn) => {
                        let (handed, turn_given) = oneshot::channel();
                        turn.waiting.push_back((lease, handed));
                        turn_given
                    }
                    None => {
                        state.rows.insert(row, Turn { holder: lease, waiting: VecDeque::new() });
                        state.turns.entry(lease).or_default().push(row);
                        continue;
                    }
                }
            };
            if !self.wait_for(lease, row, turn, deadline, clock).await {
                return false;
            }
        }
        true
    }

    /// Waits for `row`'s turn until `deadline`; whether it was handed to `lease`.
    async fn wait_for(
        &self,
        lease: Lease,
        row: RowId,
        mut turn: oneshot::Receiver<()>,
        deadline: tokio::time::Instant,
        clock: &LocalClock,
    ) -> bool {
        // `biased`: tokio's `select!` otherwise draws its branch order from an RNG madsim does not seed.
        tokio::select! {
            biased;
            handed = &mut turn => return handed.is_ok(),
            _ = clock.sleep_until(deadline) => {}
        }
        // The wait ran out: leave the line, unless the turn was handed over meanwhile (under the same lock).
        let mut state = self.lock();
        if turn.try_recv().is_ok() {
            return true;
        }
        if let Some(waiting) = state.rows.get_mut(&row) {
            waiting.waiting.retain(|(waiter, _)| *waiter != lease);
        }
        false
    }

    /// Hands on every turn `lease` has, each to its row's first live waiter (its item has ended).
    pub fn release(&self, lease: Lease) {
        let mut state = self.lock();
        let Some(rows) = state.turns.remove(&lease) else {
            return;
        };
        for row in rows {
            let Some(mut turn) = state.rows.remove(&row) else {
                continue;
            };
            while let Some((waiter, handed)) = turn.waiting.pop_front() {
                if handed.send(()).is_ok() {
                    turn.holder = waiter;
                    state.turns.entry(waiter).or_default().push(row);
                    state.rows.insert(row, turn);
                    break;
                }
            }
        }
    }

    /// Rows whose turn some lease has (for tests and metrics).
    pub fn held(&self) -> usize {
        self.lock().rows.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    fn lease(id: i64) -> Lease {
        Lease { id: RowId(id), token: crate::store::LockToken(id) }
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_goes_to_the_first_waiter_when_its_holder_ends() {
        let list = std::sync::Arc::new(Waitlist::default());
        let clock = LocalClock::exact();
        assert!(list.take(lease(1), &[RowId(9)], Duration::from_secs(1), &clock).await);
        let (second, third) = (list.clone(), list.clone());
        let (c2, c3) = (clock.clone(), clock.clone());
        let second = tokio::spawn(async move { second.take(lease(2), &[RowId(9)], Duration::from_secs(1), &c2).await });
        tokio::task::yield_now().await;
        let third = tokio::spawn(async move { third.take(lease(3), &[RowId(9)], Duration::from_secs(1), &c3).await });
        tokio::task::yield_now().await;
        list.release(lease(1));
        assert!(second.await.unwrap(), "the first waiter gets the turn");
        assert!(!third.is_finished(), "the second waiter still waits");
        list.release(lease(2));
        assert!(third.await.unwrap());
        list.release(lease(3));
        assert_eq!(list.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_bound_and_leaves_the_line() {
        let list = Waitlist::default();
        let clock = LocalClock::exact();
        assert!(list.take(lease(1), &[RowId(9)], Duration::from_secs(1), &clock).await);
        let started = tokio::time::Instant::now();
        assert!(!list.take(lease(2), &[RowId(8), RowId(9)], Duration::from_millis(500), &clock).await);
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        list.release(lease(1));
        assert_eq!(list.held(), 1, "row 8's turn, taken before the wait, stays with lease 2 until its item ends");
        list.release(lease(2));
        assert_eq!(list.held(), 0, "row 9's turn went to nobody: its waiter had left");
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_wait_a_held_row_is_left_to_the_store_at_once() {
        let list = Waitlist::default();
        let clock = LocalClock::exact();
        assert!(list.take(lease(1), &[RowId(9)], Duration::ZERO, &clock).await, "a free row's turn needs no wait");
        assert!(!list.take(lease(2), &[RowId(9)], Duration::ZERO, &clock).await);
        assert!(list.take(lease(1), &[RowId(9)], Duration::ZERO, &clock).await, "its holder has it already");
    }
}
