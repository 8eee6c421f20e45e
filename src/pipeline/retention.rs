//! Retention: finished rows leave the table after an age, in small batches (river's job cleaner, pgmq's
//! archive; docs/engine.md, "Retention"). A queue table that keeps every finished row grows for good, and its
//! indexes with it.
//!
//! A [`Retention`] holds rules, each a kind, its final statuses and an age; a pass runs each rule's
//! [`Store::purge`] in batches of `batch` rows until a batch comes back short (or `batches_per_pass` ran), so
//! one pass never holds many locks and never waits for one (`SKIP LOCKED` on PostgreSQL). The store decides what
//! is safe to delete: never a row under a lease, a lock or an owner mark, never a parent before its children.
//! Rules are off unless given: a kind some reader still needs (the gang controller reads an operation's jobs and
//! allocations while the operation lives) must only be given statuses no one reads again, or a parent condition
//! ([`RetentionRule::with_parent_statuses`]: jobs once their operation is final; `crate::gang::retention`).

use crate::store::{PurgeParams, Store, StoreError, check_purge};
use std::time::Duration;

/// How often a retention task runs a pass, by default: once a minute (local clock).
pub const RETENTION_EVERY_DEFAULT: Duration = Duration::from_secs(60);

/// Rows one purge call deletes at most, by default.
pub const RETENTION_BATCH_DEFAULT: usize = 1_000;

/// Batches one rule runs in one pass at most, by default: a pass of a large backlog stops after
/// `batch × batches_per_pass` rows per rule and the next pass goes on.
pub const RETENTION_BATCHES_PER_PASS_DEFAULT: usize = 100;

/// One retention rule: rows of `kind` in one of `statuses` go once their `updated_at` is `older_than` old (store
/// clock), and with `parent_statuses`, only while their parent is in one of those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionRule {
    /// The rows' kind.
    pub kind: String,
    /// The kind's final statuses (at least one).
    pub statuses: Vec<String>,
    /// Their age before they go.
    pub older_than: Duration,
    /// The statuses their parent must be in ([`PurgeParams::parent_statuses`]): for a child kind that its parent
    /// reads while it lives. Empty: any parent, or none.
    pub parent_statuses: Vec<String>,
}

impl RetentionRule {
    /// Rows of `kind` in one of `statuses` go once `older_than` old.
    pub fn new(kind: impl Into<String>, statuses: &[&str], older_than: Duration) -> RetentionRule {
        let statuses = statuses.iter().map(|s| s.to_string()).collect();
        RetentionRule { kind: kind.into(), statuses, older_than, parent_statuses: Vec::new() }
    }

    /// The same rule, for rows whose parent is in one of `statuses` only.
    pub fn with_parent_statuses(mut self, statuses: &[&str]) -> RetentionRule {
        self.parent_statuses = statuses.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Parses `KIND:STATUS[,STATUS…]:AGE` (for a command line or a config file of the caller's), the age as every
    /// duration flag of `lockstep` takes it (`168h`, `30m`; more than zero). Spaces around each part are dropped.
    ///
    /// Errors: a message naming the part that is wrong; one that does not have three parts shows the form with an
    /// example, a rule `lockstep serve --retain` also takes (the gang controller's jobs end `completed`, `failed` or
    /// `aborted`), so that the example holds wherever the message is shown.
    pub fn parse(text: &str) -> Result<RetentionRule, String> {
        let mut parts = text.splitn(3, ':');
        let (Some(kind), Some(statuses), Some(age)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "retention rule {text:?}: expected KIND:STATUS[,STATUS...]:AGE, e.g. job:completed,failed:168h"
            ));
        };
        let (kind, age) = (kind.trim(), age.trim());
        if kind.is_empty() {
            return Err(format!("retention rule {text:?}: the kind is empty"));
        }
        let statuses: Vec<String> = statuses.split(',').map(|status| status.trim().to_string()).collect();
        if statuses.iter().any(String::is_empty) {
            return Err(format!("retention rule {text:?}: a status is empty (statuses are separated by commas)"));
        }
        let older_than =
            crate::duration::parse_nonzero(age).map_err(|error| format!("retention rule {text:?}: age: {error}"))?;
        Ok(RetentionRule { kind: kind.to_string(), statuses, older_than, parent_statuses: Vec::new() })
    }
}

/// A replica's retention: its rules and how a pass runs them (docs/engine.md, "Retention").
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use lockstep::pipeline::{ManagerOptions, PipelineManager, Retention, RetentionRule};
/// use lockstep::store::{MemStore, Timestamp, TokioClock};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let store = Arc::new(MemStore::new(TokioClock::new(Timestamp::EPOCH)));
/// let mut manager = PipelineManager::new(store, ManagerOptions::default());
/// // Jobs done or failed for a week go, with their events; the first pass runs a minute after `start`.
/// let week = Duration::from_secs(7 * 24 * 3600);
/// manager.retain(Retention::new(vec![RetentionRule::new("job", &["done", "failed"], week)]))?;
/// manager.start();
/// manager.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// The rules, run in order each pass.
    pub rules: Vec<RetentionRule>,
    /// Time between passes (local clock); [`RETENTION_EVERY_DEFAULT`].
    pub every: Duration,
    /// Rows per purge call, 1 to [`PURGE_LIMIT_MAX`](crate::store::PURGE_LIMIT_MAX); [`RETENTION_BATCH_DEFAULT`].
    pub batch: usize,
    /// Most purge calls per rule per pass; [`RETENTION_BATCHES_PER_PASS_DEFAULT`].
    pub batches_per_pass: usize,
}

impl Retention {
    /// Retention by `rules` with every other field at its default.
    pub fn new(rules: Vec<RetentionRule>) -> Retention {
        Retention {
            rules,
            every: RETENTION_EVERY_DEFAULT,
            batch: RETENTION_BATCH_DEFAULT,
            batches_per_pass: RETENTION_BATCHES_PER_PASS_DEFAULT,
        }
    }

    /// Checks every rule as the store will ([`check_purge`]) and the pass's bounds. Errors: the rule or field and
    /// what is wrong with it.
    pub fn validate(&self) -> Result<(), String> {
        if self.every.is_zero() {
            return Err("retention: every must be more than zero".to_string());
        }
        if self.batches_per_pass == 0 {
            return Err("retention: batches_per_pass must be at least 1".to_string());
        }
        for rule in &self.rules {
            check_purge(&self.params(rule)).map_err(|error| format!("retention: {error}"))?;
        }
        Ok(())
    }

    fn params(&self, rule: &RetentionRule) -> PurgeParams {
        PurgeParams {
            kind: rule.kind.clone(),
            statuses: rule.statuses.clone(),
            older_than: rule.older_than,
            limit: self.batch,
            parent_statuses: rule.parent_statuses.clone(),
        }
    }

    /// One pass: each rule's purges until a batch comes back short or `batches_per_pass` ran. Returns the rows
    /// deleted. A store error ends the pass (the next pass tries again): nothing is lost, rows are only left for
    /// later.
    pub async fn pass<S: Store>(&self, store: &S) -> Result<usize, StoreError> {
        let mut deleted = 0;
        for rule in &self.rules {
            for _ in 0..self.batches_per_pass {
                let count = store.purge(self.params(rule)).await?;
                deleted += count;
                if count < self.batch {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// Runs a pass every `every` until the task is aborted, logging what each deleted and any error.
    pub async fn run<S: Store>(self, store: std::sync::Arc<S>) {
        loop {
            tokio::time::sleep(self.every).await;
            match self.pass(store.as_ref()).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "retention pass"),
                Err(error) => tracing::warn!(%error, "retention pass failed; the next pass tries again"),
            }
        }
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use crate::pipeline::{ManagerOptions, PipelineManager};
    use crate::store::{ManualClock, MemStore, NewRow, PURGE_LIMIT_MAX, Timestamp};
    use serde_json::json;

    #[test]
    fn a_rule_parses_from_its_flag_text_and_a_wrong_part_is_named() {
        let rule = RetentionRule::parse("job:done,failed:168h").expect("a rule");
        assert_eq!(rule, RetentionRule::new("job", &["done", "failed"], Duration::from_secs(7 * 86_400)));
        let error = RetentionRule::parse("job:done").expect_err("two parts");
        assert!(error.contains("KIND:STATUS"), "{error}");
        let error = RetentionRule::parse("job:done,:7d").expect_err("an empty status");
        assert!(error.contains("a status is empty"), "{error}");
        let error = RetentionRule::parse("job:done:seven days").expect_err("a bad age");
        assert!(error.contains("age: invalid duration \"seven days\""), "{error}");
        let error = RetentionRule::parse(":done:1h").expect_err("no kind");
        assert!(error.contains("kind is empty"), "{error}");
        let spaced = RetentionRule::parse(" job : done, failed : 168h").expect("spaces around the parts");
        assert_eq!(spaced, rule, "spaces around the parts are dropped");
    }

    #[test]
    fn a_retention_the_store_would_refuse_is_refused_before_it_runs() {
        let mut retention = Retention::new(vec![RetentionRule::new("job", &[], Duration::from_secs(60))]);
        assert!(retention.validate().expect_err("no statuses").contains("statuses is empty"));
        retention.rules = vec![RetentionRule::new("", &["done"], Duration::from_secs(60))];
        assert!(retention.validate().expect_err("no kind").contains("kind is empty"));
        retention.rules = vec![RetentionRule::new("job", &[""], Duration::from_secs(60))];
        assert!(retention.validate().expect_err("an empty status").contains("a status is empty"));
        retention.rules = vec![RetentionRule::new("job", &["done"], Duration::from_secs(60))];
        retention.batch = PURGE_LIMIT_MAX + 1;
        assert!(retention.validate().expect_err("a batch past the cap").contains("limit"));
        retention.batch = 10;
        assert_eq!(retention.validate(), Ok(()));
    }

    #[tokio::test]
    async fn a_pass_deletes_in_batches_until_one_comes_back_short_and_stops_at_its_bound() {
        let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
        let store = MemStore::new(clock.clone());
        for _ in 0..25 {
            store.insert(NewRow::new("job", "done", json!({}))).await.expect("insert");
        }
        store.insert(NewRow::new("job", "ready", json!({}))).await.expect("insert");
        clock.advance(Duration::from_secs(3600));
        let mut retention = Retention::new(vec![RetentionRule::new("job", &["done"], Duration::from_secs(60))]);
        retention.batch = 10;
        retention.batches_per_pass = 2;
        assert_eq!(retention.pass(&store).await.expect("pass"), 20, "two batches of ten, then the pass's bound");
        assert_eq!(retention.pass(&store).await.expect("pass"), 5, "the rest, in a batch that came back short");
        assert_eq!(retention.pass(&store).await.expect("pass"), 0);
        assert_eq!(store.list("job", None).await.expect("list").len(), 1, "the ready job stays");
    }

    /// A manager given retention runs its passes on its own from `start` on, and stops them with the rest.
    #[tokio::test(start_paused = true)]
    async fn a_manager_runs_its_retention_every_period_until_it_stops() {
        let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
        let store = std::sync::Arc::new(MemStore::new(clock.clone()));
        let old = store.insert(NewRow::new("job", "done", json!({}))).await.expect("insert");
        clock.advance(Duration::from_secs(3600));
        let mut manager = PipelineManager::new(store.clone(), ManagerOptions::default());
        let mut retention = Retention::new(vec![RetentionRule::new("job", &["done"], Duration::from_secs(60))]);
        retention.every = Duration::from_secs(10);
        manager.retain(retention).expect("a valid retention");
        manager.start();
        assert!(store.get(old.id).await.expect("get").is_some(), "deleted before the first period");
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(store.get(old.id).await.expect("get").is_none(), "the first pass did not delete the old row");
        let young = store.insert(NewRow::new("job", "done", json!({}))).await.expect("insert");
        clock.advance(Duration::from_secs(3600));
        manager.shutdown().await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(store.get(young.id).await.expect("get").is_some(), "a pass ran after the manager stopped");
        let refused = Retention::new(vec![RetentionRule::new("job", &[], Duration::from_secs(60))]);
        let error = manager.retain(refused).expect_err("no statuses");
        assert!(error.to_string().contains("statuses is empty"), "{error}");
    }
}
