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
use crate::store::{Event, NewRow, RowId, Store, StoreError};

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
    Ended { operation: RowId, status: OperationStatus },
    /// A row did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Submits an operation running `spec`, after checking its rules again (a spec may be built in code). Returns
/// the operation's id (its row). The operation starts `starting`; a controller pass creates its jobs.
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

/// Parses `text` as a spec in `format` and submits it (see [`submit`]).
pub async fn submit_text<S: Store>(store: &S, text: &str, format: SpecFormat) -> Result<RowId, GangError> {
    submit(store, OperationSpec::parse(text, format)?).await
}

/// Asks to abort `operation` with `reason`: the next pass aborts its jobs, releases its allocations and ends it
/// `aborted`. Errors: no such operation, or it already ended.
pub async fn abort<S: Store>(store: &S, operation: RowId, reason: &str) -> Result<(), GangError> {
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
