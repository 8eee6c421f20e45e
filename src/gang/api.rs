//! Write and read APIs of the gang controller: submit, abort, spec update, status (DESIGN §3, write APIs; §4).
//!
//! Write APIs respect leases by never writing a row a pipeline may hold: submit inserts a new operation row, and
//! abort and spec updates insert a message into the operation's inbox; both then send a fetch hint naming the operation so a
//! replica takes it at once. A pass consumes the message under its lease. There is no read-modify-write of a
//! leased row, so a request can neither be lost to a concurrent pass nor be refused as busy.

use super::controller::EVENT_INCARNATION_STARTED;
use super::model::{
    DecodeError, INBOX_NEW, Job, KIND_INBOX, KIND_JOB, KIND_OPERATION, Message, OperationData, OperationStatus,
};
use super::spec::{OperationSpec, SpecError, SpecFormat};
use super::validate;
use crate::store::{Event, InsertKeyedParams, NewRow, RowId, Store, StoreError};
use std::time::Duration;

/// Why a gang API call was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GangError {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No operation has this id.
    #[error("operation {0} not found")]
    NotFound(RowId),
    /// The operation already ended.
    #[error("operation {operation} already {status}")]
    Ended {
        /// The operation's row.
        operation: RowId,
        /// The terminal status it ended in.
        status: OperationStatus,
    },
    /// A row did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A submission's key breaks a rule ([`check_submit_key`]); names the rule.
    #[error("submit key {key:?}: {rule}")]
    Key {
        /// The key as given.
        key: String,
        /// The rule it breaks.
        rule: String,
    },
    /// An abort's reason breaks a rule ([`check_abort_reason`]); names the rule.
    #[error("abort reason: {rule}")]
    Reason {
        /// The rule the reason breaks (empty, too long, a control character).
        rule: String,
    },
}

/// Most bytes of an abort's reason ([`abort`]): the operation's result shows it in `status` and `list`, one line.
pub const ABORT_REASON_BYTES_MAX: usize = 1024;

/// Checks an abort's reason: 1 to [`ABORT_REASON_BYTES_MAX`] bytes, no control character (it is shown on one line
/// of a table). Errors: [`GangError::Reason`] naming the rule.
pub fn check_abort_reason(reason: &str) -> Result<(), GangError> {
    let fail = |rule: String| Err(GangError::Reason { rule });
    if reason.trim().is_empty() {
        return fail("must not be empty".into());
    }
    if reason.len() > ABORT_REASON_BYTES_MAX {
        return fail(format!("is {} bytes, more than {ABORT_REASON_BYTES_MAX}", reason.len()));
    }
    if reason.chars().any(char::is_control) {
        return fail("contains a control character".into());
    }
    Ok(())
}

/// Most bytes of a submission's key ([`submit_keyed`]): a name people type or a client makes, far within what the
/// store's key index holds ([`KEY_TEXT_BYTES_MAX`](crate::store::KEY_TEXT_BYTES_MAX)).
pub const SUBMIT_KEY_BYTES_MAX: usize = 256;

/// Checks a submission's key: 1 to [`SUBMIT_KEY_BYTES_MAX`] bytes, no control character (it is printed on one
/// line). Errors: [`GangError::Key`] naming the rule.
pub fn check_submit_key(key: &str) -> Result<(), GangError> {
    let fail = |rule: String| Err(GangError::Key { key: key.to_string(), rule });
    if key.is_empty() {
        return fail("must not be empty".into());
    }
    if key.len() > SUBMIT_KEY_BYTES_MAX {
        return fail(format!("is {} bytes, more than {SUBMIT_KEY_BYTES_MAX}", key.len()));
    }
    if key.chars().any(char::is_control) {
        return fail("contains a control character".into());
    }
    Ok(())
}

/// How [`submit_keyed`] retries a submission whose outcome is unknown: at most `attempts_max` attempts, waiting
/// `backoff_min` after the first failure and twice as long after each next one, up to `backoff_max` (local clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmitRetry {
    /// Most attempts, at least 1.
    pub attempts_max: u32,
    /// Wait after the first failed attempt.
    pub backoff_min: Duration,
    /// Longest wait between two attempts.
    pub backoff_max: Duration,
}

/// What [`submit_keyed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The operation the key names.
    pub operation: RowId,
    /// Whether this call created it (false: an earlier submission with the key did, and this one created nothing).
    pub created: bool,
    /// Attempts it took, from 1.
    pub attempts: u32,
}

/// Submits an operation running `spec`, after checking its rules again (a spec may be built in code). Returns
/// the operation's id (its row). The operation starts `starting`; a controller pass creates its jobs. Not safe to
/// retry after a store error (the operation may exist already, and a retry creates a second one): a client that
/// retries submits with [`submit_keyed`].
pub async fn submit<S: Store>(store: &S, spec: OperationSpec) -> Result<RowId, GangError> {
    let violations = validate::violations(&spec);
    if !violations.is_empty() {
        return Err(SpecError::Invalid { violations }.into());
    }
    let data = OperationData::new(spec).to_json();
    let row = store.insert(NewRow::new(KIND_OPERATION, OperationStatus::Starting.as_str(), data)).await?;
    store.hint(KIND_OPERATION, Some(row.id)).await?;
    Ok(row.id)
}

/// Submits an operation running `spec` at most once per `key` (a retried submit runs once): checks the
/// spec's rules and the key ([`check_submit_key`]), inserts the operation under the key ([`Store::insert_keyed`]),
/// then sends the fetch hint naming it, and on a store error (the outcome unknown: the insert or its reply may have
/// been lost, or the hint failed) tries both again with the same key, as `retry` allows. The first attempt that
/// gets through returns the operation the key names: the one it created, or the one an earlier submission with the
/// key created (`created` false; nothing is inserted, whatever spec the later one carries). The real `submit`
/// command and the simulator's client both submit through it.
///
/// Errors: the spec's violations and a bad key, before any store call; `Store` when the store refuses the call
/// (`Invalid`, not retried) or when the last attempt failed (its outcome unknown: submitting again with the same
/// key is safe).
pub async fn submit_keyed<S: Store>(
    store: &S,
    spec: OperationSpec,
    key: &str,
    retry: SubmitRetry,
) -> Result<Submitted, GangError> {
    let violations = validate::violations(&spec);
    if !violations.is_empty() {
        return Err(SpecError::Invalid { violations }.into());
    }
    check_submit_key(key)?;
    let row = NewRow::new(KIND_OPERATION, OperationStatus::Starting.as_str(), OperationData::new(spec).to_json());
    let mut backoff = retry.backoff_min;
    let mut attempt = 1;
    loop {
        let params = InsertKeyedParams { key: key.to_string(), row: row.clone() };
        let outcome = match store.insert_keyed(params).await {
            Ok(done) => store.hint(KIND_OPERATION, Some(done.id)).await.map(|()| done),
            Err(error) => Err(error),
        };
        match outcome {
            Ok(done) => return Ok(Submitted { operation: done.id, created: done.inserted, attempts: attempt }),
            Err(error @ StoreError::Invalid(_)) => return Err(error.into()),
            Err(error) if attempt >= retry.attempts_max => return Err(error.into()),
            Err(error) => {
                tracing::warn!(%key, attempt, %error, "submit's outcome is unknown; submitting again with its key");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(retry.backoff_max);
                attempt += 1;
            }
        }
    }
}

/// Parses `text` as a spec in `format` and submits it (see [`submit`]).
pub async fn submit_text<S: Store>(store: &S, text: &str, format: SpecFormat) -> Result<RowId, GangError> {
    submit(store, OperationSpec::parse(text, format)?).await
}

/// Asks to abort `operation` with `reason`: the next pass aborts its jobs, releases its allocations and ends it
/// `aborted`. Errors: a reason [`check_abort_reason`] refuses (before any store call), no such operation, or it
/// already ended.
pub async fn abort<S: Store>(store: &S, operation: RowId, reason: &str) -> Result<(), GangError> {
    check_abort_reason(reason)?;
    let status = operation_status(store, operation).await?;
    if status.is_terminal() {
        return Err(GangError::Ended { operation, status });
    }
    let message = Message::Abort { reason: reason.to_string() };
    store.insert(NewRow::new(KIND_INBOX, INBOX_NEW, message.to_json()).with_parent(operation)).await?;
    store.hint(KIND_OPERATION, Some(operation)).await?;
    Ok(())
}

/// Asks to replace the spec of a running `operation` with `spec`. Checked now against the spec in force
/// ([`validate::update_violations`]: every rule of a spec, no task added or removed, no `job_count` change in a
/// gang operation) and again when a pass consumes it. A plain task whose `job_count` grows gets jobs for the new
/// cookies; one whose `job_count` shrinks has the jobs of the removed cookies aborted. Errors: the violations, no
/// such operation, or it already ended.
pub async fn update_spec<S: Store>(store: &S, operation: RowId, spec: OperationSpec) -> Result<(), GangError> {
    let status = operation_status(store, operation).await?;
    if status.is_terminal() {
        return Err(GangError::Ended { operation, status });
    }
    let row = store.get(operation).await?.ok_or(GangError::NotFound(operation))?;
    let running = OperationData::from_row(&row)?.spec;
    let violations = validate::update_violations(&running, &spec);
    if !violations.is_empty() {
        return Err(SpecError::Invalid { violations }.into());
    }
    let message = Message::UpdateSpec { spec: Box::new(spec) };
    store.insert(NewRow::new(KIND_INBOX, INBOX_NEW, message.to_json()).with_parent(operation)).await?;
    store.hint(KIND_OPERATION, Some(operation)).await?;
    Ok(())
}

async fn operation_status<S: Store>(store: &S, operation: RowId) -> Result<OperationStatus, GangError> {
    let row = store.get(operation).await?.filter(|r| r.kind == KIND_OPERATION).ok_or(GangError::NotFound(operation))?;
    OperationStatus::parse(&row.status).ok_or_else(|| {
        GangError::Decode(DecodeError { row: operation, kind: row.kind, message: format!("status {:?}", row.status) })
    })
}

/// An operation as its rows show it now.
#[derive(Clone, Debug)]
pub struct OperationView {
    /// The operation's id.
    pub id: RowId,
    /// Its status.
    pub status: OperationStatus,
    /// Its data (spec, incarnation, failed job count, result).
    pub data: OperationData,
    /// Every job, in creation order.
    pub jobs: Vec<Job>,
    /// Its events, in order.
    pub events: Vec<Event>,
}

impl OperationView {
    /// The jobs of the current incarnation.
    pub fn current_jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.iter().filter(|job| job.data.incarnation == self.data.incarnation)
    }

    /// Its `incarnation_started` events.
    pub fn incarnation_events(&self) -> Vec<&Event> {
        self.events.iter().filter(|e| e.kind == EVENT_INCARNATION_STARTED).collect()
    }
}

/// Reads `operation`, its jobs and events. Errors: no such operation, a row that does not decode.
pub async fn status<S: Store>(store: &S, operation: RowId) -> Result<OperationView, GangError> {
    let status = operation_status(store, operation).await?;
    let row = store.get(operation).await?.ok_or(GangError::NotFound(operation))?;
    let data = OperationData::from_row(&row)?;
    let jobs = store.list(KIND_JOB, Some(operation)).await?.iter().map(Job::from_row).collect::<Result<_, _>>()?;
    let events = store.events(operation).await?;
    Ok(OperationView { id: operation, status, data, jobs, events })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{
        ApplyOutcome, ApplyParams, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Hint, KeyedInsert,
        Lease, LockOutcome, LockRelatedParams, ManualClock, MemStore, Row, RowUpdate, Timestamp, WriteOutcome,
    };
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::sync::broadcast;

    /// MemStore whose first `lost_replies` keyed inserts commit and then lose their reply, and whose first
    /// `failed_hints` hints fail: the faults after which a user saw exit 1 and submitted again.
    struct Flaky {
        inner: MemStore,
        lost_replies: AtomicU32,
        failed_hints: AtomicU32,
    }

    /// Takes one from `count` if it is not zero; whether it did.
    fn take(count: &AtomicU32) -> bool {
        count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    impl Store for Flaky {
        async fn fetch(&self, p: FetchParams) -> Result<Vec<Row>, StoreError> {
            self.inner.fetch(p).await
        }
        async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
            self.inner.refetch(lease).await
        }
        async fn heartbeat(&self, p: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
            self.inner.heartbeat(p).await
        }
        async fn lock_related(&self, p: LockRelatedParams) -> Result<LockOutcome, StoreError> {
            self.inner.lock_related(p).await
        }
        async fn apply(&self, p: ApplyParams) -> Result<ApplyOutcome, StoreError> {
            self.inner.apply(p).await
        }
        async fn record_failure(&self, p: FailureParams) -> Result<FailureOutcome, StoreError> {
            self.inner.record_failure(p).await
        }
        async fn reset_for_retry(&self, lease: Lease, delay: std::time::Duration) -> Result<bool, StoreError> {
            self.inner.reset_for_retry(lease, delay).await
        }
        async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
            self.inner.release(leases).await
        }
        async fn insert(&self, row: NewRow) -> Result<Row, StoreError> {
            self.inner.insert(row).await
        }
        async fn insert_keyed(&self, p: InsertKeyedParams) -> Result<KeyedInsert, StoreError> {
            let done = self.inner.insert_keyed(p).await?;
            if take(&self.lost_replies) {
                return Err(StoreError::Unavailable("the reply was lost".into()));
            }
            Ok(done)
        }
        async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
            self.inner.get(id).await
        }
        async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
            self.inner.list(kind, parent).await
        }
        async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
            self.inner.events(row).await
        }
        async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
            self.inner.update_unleased(id, update).await
        }
        async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
            if take(&self.failed_hints) {
                return Err(StoreError::Timeout(Duration::from_secs(1)));
            }
            self.inner.hint(kind, row).await
        }
        fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
            self.inner.subscribe_hints()
        }
        async fn now(&self) -> Result<Timestamp, StoreError> {
            Store::now(&self.inner).await
        }
    }

    fn flaky(lost_replies: u32, failed_hints: u32) -> Flaky {
        let inner = MemStore::new(ManualClock::new(Timestamp(1_700_000_000_000_000)));
        Flaky { inner, lost_replies: AtomicU32::new(lost_replies), failed_hints: AtomicU32::new(failed_hints) }
    }

    fn spec() -> OperationSpec {
        OperationSpec::parse(r#"{"tasks": {"t": {"job_count": 1, "command": "true"}}}"#, SpecFormat::Json).unwrap()
    }

    const RETRY: SubmitRetry =
        SubmitRetry { attempts_max: 4, backoff_min: Duration::from_millis(1), backoff_max: Duration::from_millis(2) };

    async fn operations(store: &Flaky) -> Vec<Row> {
        store.inner.list(KIND_OPERATION, None).await.unwrap()
    }

    #[tokio::test]
    async fn a_submit_whose_reply_was_lost_or_whose_hint_failed_is_retried_and_creates_one_operation() {
        let store = flaky(1, 1);
        let submitted = submit_keyed(&store, spec(), "k", RETRY).await.unwrap();
        assert_eq!(submitted.attempts, 3, "a lost reply, then a failed hint, then through: {submitted:?}");
        assert!(!submitted.created, "the first attempt created it: {submitted:?}");
        let rows = operations(&store).await;
        assert_eq!(rows.iter().map(|row| row.id).collect::<Vec<_>>(), vec![submitted.operation], "one operation");
        assert!(rows[0].hinted, "the operation is hinted once a hint got through");
    }

    #[tokio::test]
    async fn a_second_submit_with_the_same_key_returns_the_first_operation() {
        let store = flaky(0, 0);
        let first = submit_keyed(&store, spec(), "k", RETRY).await.unwrap();
        assert_eq!((first.created, first.attempts), (true, 1), "{first:?}");
        let again = submit_keyed(&store, spec(), "k", RETRY).await.unwrap();
        assert_eq!((again.operation, again.created), (first.operation, false), "{again:?}");
        assert_eq!(operations(&store).await.len(), 1);
    }

    #[tokio::test]
    async fn a_submit_that_fails_every_attempt_returns_the_store_error_and_a_bad_key_is_refused_first() {
        let store = flaky(0, 10);
        let error = submit_keyed(&store, spec(), "k", RETRY).await.unwrap_err();
        assert!(matches!(error, GangError::Store(StoreError::Timeout(_))), "{error}");
        assert_eq!(store.failed_hints.load(Ordering::SeqCst), 10 - RETRY.attempts_max, "one hint per attempt");
        assert_eq!(operations(&store).await.len(), 1, "every attempt named the one operation");
        for key in ["", "a\nb"] {
            let error = submit_keyed(&store, spec(), key, RETRY).await.unwrap_err();
            assert!(matches!(error, GangError::Key { .. }), "{key:?}: {error}");
        }
        let long = "k".repeat(SUBMIT_KEY_BYTES_MAX + 1);
        assert!(matches!(check_submit_key(&long), Err(GangError::Key { .. })));
        for reason in ["", "  ", "a\tb", "a\u{1}b"] {
            assert!(matches!(check_abort_reason(reason), Err(GangError::Reason { .. })), "{reason:?}");
        }
        let long = "x".repeat(ABORT_REASON_BYTES_MAX + 1);
        let error = check_abort_reason(&long).unwrap_err().to_string();
        assert!(error.contains("more than 1024"), "{error}");
        check_abort_reason("maintenance window").unwrap();
    }
}
