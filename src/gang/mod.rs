//! The gang controller: YTsaurus Vanilla operations and their gang mode, built from pipelines (DESIGN §4).
//!
//! - [`spec`]: the operation spec, read from YSON text ([`yson`]), JSON or YAML; [`validate`]: its rules.
//! - [`model`]: operations, jobs, allocations, nodes and inbox messages as rows of the store.
//! - [`rules`]: the rules of DESIGN §4 as pure functions; [`controller`]: one pass over one operation, pure;
//!   [`placement`]: all-or-nothing placement of a gang's ranks and the gang queue that keeps waiting gangs fair.
//! - [`pipeline`]: the operation pipeline that runs passes over the store; [`api`]: submit, abort, spec update,
//!   status; [`replica`]: a controller replica (the operation pipeline on a manager); [`status`]: the status
//!   report `lockstep status` prints; [`listing`]: the operations `lockstep list` lists; [`node_watch`]: the
//!   replica's companion that wakes an operation when a node it runs on loses its session; [`retention`]: which
//!   rows a replica's retention may delete (`lockstep serve --retain`).
//! - [`env`](mod@env): the job environment (`YT_*` variables); [`audit`]: the rules as checks over recorded rows.

pub mod api;
pub mod audit;
pub mod controller;
pub(crate) mod decoded;
pub mod env;
mod last_pass;
mod lingering;
pub mod listing;
pub mod model;
pub mod node_watch;
pub mod pipeline;
pub mod placement;
pub mod replica;
pub mod retention;
pub mod rules;
pub mod spec;
pub mod status;
pub mod validate;
pub mod yson;

pub use env::job_environment;
pub use spec::{FilePath, GangOptions, GangPlacement, OperationSpec, SpecError, SpecFormat, TaskSpec, Violation};
