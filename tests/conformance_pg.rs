//! The store conformance suite (`lockstep::store::conformance`) against PgStore: one fresh schema per case,
//! dropped when the case passes and kept when it fails. The clock moves through `PgStore::advance_clock`.
//! Needs PostgreSQL (see `support::pg`: `DATABASE_URL` or the local default; never skips).

#![cfg(not(madsim))]

use crate::support;

lockstep::conformance_tests!(support::pg::harness());
