//! Every integration test of lockstep, in one test binary per build.
//!
//! Each file beside this one (`tests/NAME.rs`) is a module of this crate rather than a test binary of its own
//! (`autotests = false` in Cargo.toml): one binary links once instead of once per file, and libtest runs the tests
//! of every file side by side on its threads, so one file's long test no longer holds up the others. Run one file's
//! tests with `cargo test --test all NAME::` (the simulator's: `cargo sim-test --test all NAME::`).
//!
//! A file that holds tests of one build only says so with `#![cfg(madsim)]` or `#![cfg(not(madsim))]` on its
//! first lines. Shared helpers are the `support` and `gang_support` modules; a file names them with
//! `use crate::support;`. A new file must be listed here: `every_test_file_is_a_module_of_the_one_binary` (in
//! `arrows`) fails for a file that is not.

mod gang_support;
mod support;

mod agent_fencing;
mod agent_lingering;
mod agent_prepare;
mod agent_process;
mod agent_stop;
mod arrows;
mod batching;
mod chaos;
mod chaos_proxy;
mod cli;
mod conformance_mem;
mod conformance_pg;
mod conformance_pg_history;
mod engine;
mod failures;
mod gang_audit;
mod gang_controller;
mod gang_lingering;
mod gang_pg;
mod gang_pipeline;
mod gang_placement;
mod gang_properties;
mod gang_queue;
mod gang_reads;
mod gang_revival;
mod gang_rules;
mod gang_spec;
mod gang_status;
mod lease_properties;
mod pg_enqueue;
mod pg_explain;
mod pg_faults;
mod pg_lock_order;
mod pg_replicas;
mod pg_store;
mod readme;
mod real_cli;
mod real_e2e;
mod sim_cli;
mod sim_faults;
mod sim_gang;
mod sim_scenarios;
mod sim_shrink;
mod sim_swarm;
mod sim_sweep;
mod sim_throughput;
mod sim_timeline;
mod sim_user;
mod sim_world;
mod timeline_browser;
