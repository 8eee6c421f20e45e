//! The deterministic simulator (DESIGN §5): the whole system under madsim's simulated clock, network and
//! database, with faults and checkers. The world, its nodes and the runner exist only in the simulator build
//! (`--cfg madsim`, DESIGN §6); the scenario files, faults' plans, checkers, run reports and summaries compile in
//! the normal build too, for `lockstep chaos run` (`crate::chaos`), which judges real runs with the same checkers.
//! The modules named below without a link (`world`, `db`, `rpc`, `replica`, `agents`) are the simulator build's
//! alone. So are [`cli`] (the `lockstep sim` command line, with which a user's own binary runs its scenario files),
//! [`timeline`], [`shrink`] and [`sweep`], but the plain build's `cargo doc` shows them, as it shows the user API
//! ([`user`], and [`net_store`] as a stand-in).
//!
//! - `world`: the nodes (a database node serving MemStore over simulated RPC, N replica nodes running a
//!   `PipelineManager`, in gang scenarios M agent nodes, a workload client) and the handles faults act through;
//! - `db`, [`net_store`], `rpc`, [`wire`]: the database node, the `Store` that crosses the network to it,
//!   their protocol, and the simulated links both cross;
//! - `replica`, [`workload`]: what replicas run and what the client inserts;
//! - [`user`], [`service`]: users' own pipelines in the world ([`PipelineSet`]: their handlers, workload, final
//!   statuses, checkers) and the simulated external services their handlers call;
//! - [`gang`], `agents`: gang scenarios (agents, operations to submit, job behaviour, control actions,
//!   expectations), the client that submits them, the agent nodes, the `op=` trace lines and the per-operation
//!   report;
//! - [`faults`]: every fault as a fixed event and as a random process with a rate;
//! - [`checkers`]: lease exclusivity, liveness, no row locked forever, no starved parent, exactly-once effects;
//!   with a gang part, allocation exclusivity, no process outliving its operation, `gang::audit` on every
//!   operation and the scenario's expectations ([`checkers::gang`]);
//! - [`trace`], [`coverage`]: the byte-identical trace of a run, and how often it reached each fault path;
//! - [`scenario`], [`mod@run`]: what a run is made of, and running it under a seed (replay with
//!   `MADSIM_TEST_SEED`, sweep with `MADSIM_TEST_NUM`);
//! - [`scenario_file`], [`summary`], [`replay`], [`explain`], [`timeline`]: what `lockstep sim` is made of:
//!   scenarios in TOML, a run's readable summary, replay files, one operation's or row's timeline from a trace,
//!   and a run as an HTML page;
//! - [`shrink`]: a failing scenario cut down to a smaller one that fails the same checker;
//! - [`shell`]: the commands the simulator prints for a user to paste, quoted for the shell;
//! - [`files`]: the commands' input files read under a size cap, and output paths checked against them;
//! - [`sweep`]: sweeps of many seeds in flat memory, their result files, shards and their merge;
//! - [`swarm`]: every seed draws its own world within documented ranges, as a scenario file.
//!
//! A run is a function of (scenario, seed, build): every random choice comes from a ChaCha stream per purpose
//! ([`rng`]) or from madsim's RNG, both seeded by the run's seed.

#[cfg(madsim)]
pub mod agent_calls;
#[cfg(madsim)]
pub mod agents;
pub mod checkers;
// The command line a user's own simulator binary is written against (`cli::Registry`, `cli::main`), and the
// modules its items name, are documented by the plain build's `cargo doc` too: rustdoc does not type-check bodies,
// so their calls into the world (simulator build only) need not resolve there; their imports must.
#[cfg(any(madsim, doc))]
pub mod cli;
#[cfg(madsim)]
pub mod clock;
pub mod coverage;
#[cfg(madsim)]
pub mod db;
pub mod explain;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod faults;
pub mod files;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod gang;
#[cfg(madsim)]
pub mod net_store;
// `cargo doc` of the plain build documents the simulator's user API (`user`: `ReplicaCx::register` names the
// network store in its signature), so the network store has a stand-in there with its `Store` impl.
#[cfg(all(doc, not(madsim)))]
#[path = "net_store_doc.rs"]
pub mod net_store;
pub mod replay;
#[cfg(madsim)]
pub mod replica;
pub mod rng;
#[cfg(madsim)]
pub mod rpc;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod run;
pub mod scenario;
pub mod scenario_file;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod service;
pub mod shell;
#[cfg(any(madsim, doc))]
pub mod shrink;
pub mod summary;
pub mod swarm;
#[cfg(any(madsim, doc))]
pub mod sweep;
#[cfg(any(madsim, doc))]
pub mod timeline;
pub mod trace;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod user;
#[cfg_attr(not(madsim), allow(dead_code))]
pub mod wire;
#[cfg_attr(not(madsim), allow(unused_imports, dead_code))]
pub mod workload;
#[cfg(madsim)]
pub mod world;

pub use faults::Target;
pub use faults::{Fault, FaultEvent, FaultKind, FaultPlan, RandomFault};
pub use gang::{
    AgentTunables, Control, ControlAction, ControllerTunables, Expectations, GangWorkload, IncarnationReport,
    OperationExpectation, OperationReport, Submission, SubmitOutcome,
};
pub use run::{Replay, RunReport, seeds};
#[cfg(madsim)]
pub use run::{Script, for_each, for_each_seed, run_seeds_with, run_with, script, share_one_malloc_arena};
#[cfg(any(madsim, doc))]
pub use run::{check_seeds, run, run_seeds};
pub use scenario::{Mutation, Scenario};
pub use scenario_file::{ScenarioError, ScenarioFile};
pub use user::PipelineSet;
#[cfg(any(madsim, doc))]
pub use user::{ReplicaCx, WorkloadClient};
#[cfg(madsim)]
pub use world::World;
