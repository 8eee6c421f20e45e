//! Running a store call again after a serialization failure or deadlock (DESIGN §2, "One lock order").
//!
//! Each store call is one transaction (or one statement), and PostgreSQL reports 40001 and 40P01 only after it
//! rolled that transaction back: nothing was written, and the call may simply run again, whole. The engine never
//! sees the conflict then; before this, it took the `Conflict` as an unknown outcome and dropped the item, so an
//! operation waited a whole lease ttl for a deadlock that cost PostgreSQL one second to break.
//!
//! With every multi-row statement locking in id order, PgStore's own calls cannot deadlock each other; what is
//! left is a session outside lockstep (a person's SQL, a migration) that locks rows in another order.

use super::error;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many times a call that failed with a conflict is run again, at once, before it returns
/// [`StoreError::Conflict`](crate::store::StoreError::Conflict): a conflict that comes back three times in a row
/// is no longer a race lost by chance, and the engine's own handling (lease expiry, guarded applies) takes over.
pub(super) const CONFLICT_RETRIES_MAX: u32 = 3;

/// Runs `call` until it succeeds, fails with anything but a conflict, or has been run again
/// [`CONFLICT_RETRIES_MAX`] times; counts each run again in `retried`. `call` must be a whole transaction (or a
/// single statement), so that a conflict left nothing behind.
pub(super) async fn conflicts<T, F, Fut>(retried: &AtomicU64, what: &str, mut call: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut retries = 0;
    loop {
        match call().await {
            Err(err) if error::is_conflict(&err) && retries < CONFLICT_RETRIES_MAX => {
                retries += 1;
                retried.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(call = what, retries, error = %error::scrub(&err.to_string()), "conflict: run again");
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::error::{DatabaseError, ErrorKind};
    use std::borrow::Cow;
    use std::fmt;

    /// A database error with a SQLSTATE of our choosing.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl fmt::Display for Coded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "raised {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl DatabaseError for Coded {
        fn message(&self) -> &str {
            "raised"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    /// Runs [`conflicts`] over a call that fails with `codes` in turn, then succeeds; returns the outcome, how
    /// often the call ran and the retry count.
    fn run(codes: &[&'static str]) -> (Result<u32, sqlx::Error>, usize, u64) {
        let retried = AtomicU64::new(0);
        let mut runs = 0;
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let outcome = runtime.block_on(conflicts(&retried, "test", || {
            runs += 1;
            let result = match codes.get(runs - 1) {
                Some(code) => Err(sqlx::Error::Database(Box::new(Coded(code)))),
                None => Ok(7),
            };
            async move { result }
        }));
        (outcome, runs, retried.load(Ordering::Relaxed))
    }

    #[test]
    fn deadlocks_and_serialization_failures_are_run_again_until_the_call_goes_through() {
        let (outcome, runs, retried) = run(&["40P01", "40001", "40P01"]);
        assert_eq!(outcome.expect("the fourth run succeeds"), 7);
        assert_eq!((runs, retried), (4, 3));
    }

    #[test]
    fn a_conflict_past_the_bound_is_returned() {
        let (outcome, runs, retried) = run(&["40P01"; 5]);
        let err = outcome.expect_err("four conflicts in a row");
        assert!(error::is_conflict(&err), "{err}");
        assert_eq!((runs, retried), (1 + CONFLICT_RETRIES_MAX as usize, u64::from(CONFLICT_RETRIES_MAX)));
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        for code in ["55P03", "57014", "23505", "08006"] {
            let (outcome, runs, retried) = run(&[code]);
            assert!(outcome.is_err(), "{code}");
            assert_eq!((runs, retried), (1, 0), "{code}");
        }
    }
}
