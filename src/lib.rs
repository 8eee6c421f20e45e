//! lockstep: leased row pipelines in the manner of dstack's server, a YTsaurus-style gang controller built from
//! them, and a deterministic simulator (madsim) that proves them under faults.
//!
//! A pipeline leases rows of one kind and status from a [`Store`], runs your [`Handler`] on each outside any
//! transaction, and applies its [`Changes`] guarded by the lease's fencing token, so a replica that lost its lease
//! writes nothing. The names a user needs are re-exported here; this is the shape of `examples/quickstart.rs`:
//!
//! ```no_run
//! use lockstep::{Changes, Handler, LoadCx, ManagerOptions, MemStore, NewRow, PipelineConfig, PipelineManager};
//! use lockstep::{Row, Store, Timestamp, TokioClock, WorkError};
//! use std::sync::Arc;
//!
//! /// Marks each "uploaded" image "ready".
//! struct Thumbnailer;
//!
//! impl<S: Store> Handler<S> for Thumbnailer {
//!     type Context = ();
//!     async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
//!         Ok(()) // short reads and related locks (cx.lock_related)
//!     }
//!     async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
//!         Ok(Changes::status("ready")) // the heavy work runs here, outside the store
//!     }
//! }
//!
//! # async fn run() {
//! let store = Arc::new(MemStore::new(TokioClock::new(Timestamp::EPOCH)));
//! let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: 42 });
//! let config = PipelineConfig { workers: 20, ..PipelineConfig::new("thumbnails", "image", &["uploaded"]) };
//! manager.register(config, Thumbnailer).expect("valid config");
//! manager.start();
//! store.insert(NewRow::new("image", "uploaded", serde_json::json!({ "bytes": 1000 }))).await.unwrap();
//! manager.hint_fetch("image", None).await.unwrap(); // wake the fetcher now, not after its backoff
//! # manager.shutdown().await;
//! # }
//! ```
//!
//! In production the store is [`PgStore`] (PostgreSQL, normal build only); under the simulator build
//! (`--cfg madsim`) the same handlers run in simulated worlds with faults ([`sim::user`], docs/user-pipelines.md).
//!
//! Architecture (DESIGN §1, docs/design.md): [`store`] holds all shared state behind one trait; [`pipeline`] is the
//! engine that leases rows from it and processes them; [`gang`] is the controller built from pipelines and
//! [`agent`] the node agent that runs its jobs. The simulator harness (`sim/` at the repository root) runs only in
//! the simulator build (DESIGN §6); its scenario files, checkers and summaries compile in both, so that `chaos`
//! (normal build) runs the same files and checkers on real PostgreSQL and processes.

// Every public item carries a docstring (STYLE, Comments and docs: what it does, shapes, units, errors); clippy runs
// with `-D warnings` in both builds (scripts/test), so an undocumented public item fails the check.
#![warn(missing_docs)]
// A `pub` item outside the public API says `pub(crate)` or `pub(super)`, so that what users can name is what `pub`
// marks.
#![warn(unreachable_pub)]

pub mod agent;
pub mod alloc;
mod buggify;
#[cfg(not(madsim))]
pub mod chaos;
pub mod duration;
pub mod files;
pub mod gang;
mod hash;
pub mod interrupt;
pub mod pipeline;
pub mod store;
pub mod table;
pub mod text;

#[path = "../sim/mod.rs"]
pub mod sim;

pub use pipeline::{
    Changes, ConfigError, Handler, ItemOutcome, LoadCx, ManagerOptions, MetricsSnapshot, PipelineConfig,
    PipelineManager, RetryDecision, RetryPolicy, ShutdownReport, WorkError,
};
pub use store::{
    Clock, ManualClock, MemStore, NewHint, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store, StoreError, Timestamp,
    TokioClock,
};
#[cfg(not(madsim))]
pub use store::{PgOptions, PgStore};
