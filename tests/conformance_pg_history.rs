//! The store conformance suite against PgStore in chaos mode (`PgOptions::history`: every lease write also
//! appends its record to the history table in its own transaction): the same results as without it, so a chaos
//! run exercises the store the replicas use in production. Needs PostgreSQL (see `support::pg`); never skips.

#![cfg(not(madsim))]

use crate::support;

lockstep::conformance_tests!(support::pg::PgHarness::with(|options| options.history = true));
