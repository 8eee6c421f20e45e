//! Helpers shared by integration tests. Each test file that needs one declares `mod support;`.

#![allow(dead_code)]

pub mod command;
pub mod scratch;

#[cfg(not(madsim))]
pub mod pg;
#[cfg(not(madsim))]
pub mod procs;

#[cfg(not(madsim))]
pub mod chaos;
