//! The store's one error type.

/// A failure of the store itself, as opposed to an expected protocol outcome such as a stale token.
///
/// Each backend converts its driver's errors into this type in one function, so the engine never matches on
/// driver types. None of the variants carries credentials.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or the connection broke. A write's outcome is unknown: the engine
    /// retries reads and leaves writes to lease expiry and guarded applies.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A transaction conflicted with another (PostgreSQL serialization failure or deadlock); safe to retry.
    #[error("transaction conflict: {0}")]
    Conflict(String),
    /// The call did not finish in time; its outcome is unknown.
    #[error("store call timed out after {}", crate::duration::format(*.0))]
    Timeout(std::time::Duration),
    /// The call's arguments break a rule of the store (names the rule).
    #[error("invalid store call: {0}")]
    Invalid(String),
    /// Anything else the backend reported.
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether the call may be repeated as it is: true for unavailability, conflicts and time-outs.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Conflict(_) | StoreError::Timeout(_))
    }
}
