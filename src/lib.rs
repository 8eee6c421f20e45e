//! lockstep: leased row pipelines in the manner of dstack's server, a YTsaurus-style gang controller built from
//! them, and a deterministic simulator (madsim) that proves them under faults.
//!
//! Architecture (DESIGN §1): [`store`] holds all shared state behind one trait; [`pipeline`] is the engine that
//! leases rows from it and processes them. Dependency direction: `sim` → `pipeline` → `store`. The simulator
//! harness (`sim/` at the repository root) runs only in the simulator build (`--cfg madsim`, DESIGN §6); its
//! scenario files, checkers and summaries compile in both, so that [`chaos`] (normal build) runs the same files
//! and checkers on real PostgreSQL and processes.

pub mod agent;
pub mod alloc;
mod buggify;
#[cfg(not(madsim))]
pub mod chaos;
pub mod duration;
pub mod gang;
pub mod interrupt;
pub mod pipeline;
pub mod store;

#[path = "../sim/mod.rs"]
pub mod sim;
