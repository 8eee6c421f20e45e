//! Helpers shared by integration tests. Declared once, in `tests/all.rs`; a test file names them with
//! `use crate::support;`.

#![allow(dead_code)]

pub mod command;
pub mod scratch;

#[cfg(not(madsim))]
pub mod pg;
#[cfg(not(madsim))]
pub mod procs;

#[cfg(not(madsim))]
pub mod chaos;
