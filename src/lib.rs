//! lockstep: leased row pipelines in the manner of dstack's server, a YTsaurus-style gang controller built from
//! them, and a deterministic simulator (madsim) that proves them under faults.
//!
//! Architecture (DESIGN §1): [`store`] holds all shared state behind one trait; [`pipeline`] is the engine that
//! leases rows from it and processes them. Dependency direction: `pipeline` → `store`.

pub mod pipeline;
pub mod store;
