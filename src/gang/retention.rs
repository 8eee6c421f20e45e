//! Retention of the gang controller's rows (`lockstep serve --retain`; docs/real-mode.md, "Retention"): which kinds
//! may leave the table, and under which condition, so that nothing a replica or an agent still reads goes.
//!
//! - `operation`: in a final status (`completed`, `failed`, `aborted`). The store keeps it while any row names it as
//!   its parent, so it goes after its jobs and inbox messages; `lockstep status` then says there is no such
//!   operation.
//! - `job`: in a final status, and only once its operation is final: a pass counts an operation's finished jobs
//!   while it runs (completion, `max_failed_job_count`, restarts).
//! - `inbox`: `done` or `new`, once its operation is final: a pass reads an operation's undone messages, and a
//!   report that arrives after the operation ended stays `new` for good (it would keep the operation otherwise).
//! - never `allocation`, `node` or `gang_queue`: live rows that agents lease and every pass reads.
//!
//! A rule names the kind's statuses; [`rule`] adds the parent condition and refuses what is not safe.

use super::model::{
    INBOX_DONE, INBOX_NEW, JobStatus, KIND_ALLOCATION, KIND_INBOX, KIND_JOB, KIND_NODE, KIND_OPERATION, OperationStatus,
};
use super::placement::KIND_GANG_QUEUE;
use crate::pipeline::RetentionRule;

/// The final statuses of an operation: what its children's rules require of it.
fn operation_final() -> Vec<&'static str> {
    OperationStatus::ALL.into_iter().filter(|s| s.is_terminal()).map(OperationStatus::as_str).collect()
}

/// The statuses a rule of `kind` may name, or why the kind may not have a rule.
fn purgeable(kind: &str) -> Result<Vec<&'static str>, String> {
    match kind {
        KIND_OPERATION => Ok(operation_final()),
        KIND_JOB => Ok(JobStatus::ALL.into_iter().filter(|s| s.is_terminal()).map(JobStatus::as_str).collect()),
        KIND_INBOX => Ok(vec![INBOX_DONE, INBOX_NEW]),
        KIND_ALLOCATION | KIND_NODE | KIND_GANG_QUEUE => {
            Err(format!("{kind} rows are live: agents lease them and every pass reads them, so they never go"))
        }
        other => Err(format!(
            "{other} is not a kind of the gang controller (kinds that may go: {KIND_OPERATION}, {KIND_JOB}, \
             {KIND_INBOX})"
        )),
    }
}

/// `rule` as the controller may run it: its kind one that may go, its statuses that kind's final ones, and for a
/// child kind (`job`, `inbox`) the parent condition that its operation is final. Errors: a message naming the
/// rule and what is wrong with it (the caller names its flag).
pub fn rule(rule: RetentionRule) -> Result<RetentionRule, String> {
    let allowed = purgeable(&rule.kind)?;
    if let Some(status) = rule.statuses.iter().find(|status| !allowed.contains(&status.as_str())) {
        let kind = &rule.kind;
        return Err(format!("{status} is not a status a {kind} row may go in (those are: {})", allowed.join(", ")));
    }
    let parent = match rule.kind.as_str() {
        KIND_JOB | KIND_INBOX => operation_final(),
        _ => Vec::new(),
    };
    // A rule this function returned already carries the parent condition: checking it again changes nothing.
    if !rule.parent_statuses.is_empty() && rule.parent_statuses.iter().map(String::as_str).ne(parent.iter().copied()) {
        return Err(format!("{} rule with parent statuses: the controller sets them itself", rule.kind));
    }
    Ok(if parent.is_empty() { rule } else { rule.with_parent_statuses(&parent) })
}

/// `rules` as the controller runs them, in the order each pass runs them: children (`job`, then `inbox`) before
/// `operation`, so that one pass deletes an old operation's children and then the operation. Errors: the first
/// rule [`rule`] refuses.
pub fn rules(rules: Vec<RetentionRule>) -> Result<Vec<RetentionRule>, String> {
    let mut checked = rules.into_iter().map(rule).collect::<Result<Vec<_>, _>>()?;
    let order = |rule: &RetentionRule| [KIND_JOB, KIND_INBOX, KIND_OPERATION].iter().position(|k| *k == rule.kind);
    checked.sort_by_key(order);
    Ok(checked)
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use crate::pipeline::Retention;
    use crate::store::{ManualClock, MemStore, NewRow, RowId, Store, Timestamp};
    use serde_json::json;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn only_final_operations_jobs_and_inbox_messages_may_go_and_children_wait_for_their_operation() {
        let job = rule(RetentionRule::new("job", &["completed", "aborted"], DAY)).expect("a job rule");
        assert_eq!(job.parent_statuses, ["completed", "failed", "aborted"]);
        let operation = rule(RetentionRule::new("operation", &["failed"], DAY)).expect("an operation rule");
        assert!(operation.parent_statuses.is_empty(), "operations have no parent");
        let refused = |kind: &str, statuses: &[&str]| rule(RetentionRule::new(kind, statuses, DAY)).unwrap_err();
        assert!(refused("allocation", &["free"]).contains("allocation rows are live"));
        assert!(refused("node", &["lost"]).contains("node rows are live"));
        assert!(refused("gang_queue", &["queue"]).contains("gang_queue rows are live"));
        assert!(refused("jobs", &["completed"]).contains("jobs is not a kind of the gang controller"));
        let running = refused("job", &["completed", "running"]);
        assert_eq!(running, "running is not a status a job row may go in (those are: completed, failed, aborted)");
        assert!(refused("operation", &["running"]).contains("running is not a status"));
        assert!(refused("inbox", &["read"]).contains("(those are: done, new)"));
        let ordered = rules(vec![
            RetentionRule::new("operation", &["completed"], DAY),
            RetentionRule::new("inbox", &["done"], DAY),
            RetentionRule::new("job", &["completed"], DAY),
        ])
        .expect("rules");
        let kinds: Vec<&str> = ordered.iter().map(|rule| rule.kind.as_str()).collect();
        assert_eq!(kinds, ["job", "inbox", "operation"], "children before their operation");
    }

    /// The example a malformed rule's message gives (`RetentionRule::parse`) is a rule the controller runs: the
    /// message reaches `serve --retain`'s users, whose jobs end `completed`, never `done`.
    #[test]
    fn the_example_of_a_malformed_rules_message_is_a_rule_the_controller_runs() {
        let error = RetentionRule::parse("job:completed").expect_err("two parts");
        let example = error.rsplit("e.g. ").next().expect("an example");
        assert_eq!(example, "job:completed,failed:168h", "{error}");
        let parsed = RetentionRule::parse(example).expect("the example parses");
        let checked = rule(parsed).unwrap_or_else(|refused| panic!("the example {example} is refused: {refused}"));
        assert_eq!(checked.parent_statuses, ["completed", "failed", "aborted"], "once its operation is final");
    }

    /// An operation with jobs under it and inbox messages under it, as the controller leaves them.
    async fn operation(store: &MemStore, status: &str, jobs: &[&str], inbox: &[&str]) -> (RowId, Vec<RowId>) {
        let id = store.insert(NewRow::new(KIND_OPERATION, status, json!({}))).await.expect("insert").id;
        let mut children = Vec::new();
        for (kind, status) in jobs.iter().map(|s| (KIND_JOB, s)).chain(inbox.iter().map(|s| (KIND_INBOX, s))) {
            children
                .push(store.insert(NewRow::new(kind, *status, json!({})).with_parent(id)).await.expect("insert").id);
        }
        (id, children)
    }

    /// `serve`'s retention on MemStore: once a day has passed, a finished operation goes with its jobs and inbox
    /// messages in one pass (children first), while a running operation keeps its finished jobs and its done
    /// messages, which its passes still count.
    #[tokio::test]
    async fn a_finished_operations_jobs_and_inbox_go_after_the_age_and_a_running_ones_stay() {
        let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
        let store = MemStore::new(clock.clone());
        let (finished, finished_children) =
            operation(&store, "completed", &["completed", "completed", "aborted"], &["done", "done", "new"]).await;
        let (running, running_children) = operation(&store, "running", &["completed", "running"], &["done"]).await;
        let allocation = store.insert(NewRow::new(KIND_ALLOCATION, "free", json!({}))).await.expect("insert").id;
        let retention = Retention::new(
            rules(vec![
                RetentionRule::new("operation", &["completed", "failed", "aborted"], DAY),
                RetentionRule::new("job", &["completed", "failed", "aborted"], DAY),
                RetentionRule::new("inbox", &["done", "new"], DAY),
            ])
            .expect("rules"),
        );
        assert_eq!(retention.pass(&store).await.expect("pass"), 0, "rows younger than a day went");
        clock.advance(DAY + Duration::from_secs(1));
        assert_eq!(retention.pass(&store).await.expect("pass"), 7, "the finished operation and its six children");
        for id in finished_children.iter().chain([&finished]) {
            assert!(store.get(*id).await.expect("get").is_none(), "row {id} of the finished operation stayed");
        }
        for id in running_children.iter().chain([&running, &allocation]) {
            assert!(store.get(*id).await.expect("get").is_some(), "row {id} of the running operation went");
        }
    }

    /// A replica given `retention` runs it beside its operation pipeline: an hour after a finished operation was
    /// last written it is gone with its children, while a submitted operation that waits for nodes, and a message
    /// its pass consumed, stay.
    #[tokio::test(start_paused = true)]
    async fn a_replica_runs_its_retention_beside_the_operation_pipeline() {
        use crate::gang::{SpecFormat, api, replica::ReplicaConfig};
        use crate::store::TokioClock;
        let store = std::sync::Arc::new(MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000))));
        let (finished, children) = operation(&store, "completed", &["completed"], &["done"]).await;
        let waiting = api::submit_text(store.as_ref(), "{tasks={w={job_count=1;command=c}}}", SpecFormat::Yson)
            .await
            .expect("submit");
        let consumed = store.insert(NewRow::new(KIND_INBOX, INBOX_DONE, json!({})).with_parent(waiting)).await;
        let consumed = consumed.expect("insert").id;
        let hour = Duration::from_secs(3600);
        let config = ReplicaConfig {
            retention: vec![
                RetentionRule::new("operation", &["completed", "failed", "aborted"], hour),
                RetentionRule::new("job", &["completed", "failed", "aborted"], hour),
                RetentionRule::new("inbox", &["done", "new"], hour),
            ],
            ..ReplicaConfig::default()
        };
        let mut manager = config.start(store.clone()).expect("a replica");
        tokio::time::sleep(hour - Duration::from_secs(30)).await;
        assert!(store.get(finished).await.expect("get").is_some(), "the operation went before its age");
        tokio::time::sleep(Duration::from_secs(91)).await;
        manager.shutdown().await;
        for id in children.iter().chain([&finished]) {
            assert!(store.get(*id).await.expect("get").is_none(), "row {id} of the finished operation stayed");
        }
        for id in [waiting, consumed] {
            assert!(store.get(id).await.expect("get").is_some(), "row {id} of the waiting operation went");
        }
        let refused = ReplicaConfig { retention: vec![RetentionRule::new("node", &["lost"], hour)], ..config };
        let error = refused.start(store).err().expect("a node rule");
        assert!(error.to_string().contains("node rows are live"), "{error}");
    }
}
