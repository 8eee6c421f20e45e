//! This project's own simulator binary: lockstep's `run | sweep | swarm | merge | replay | explain | shrink` for scenario files
//! that name this project's pipeline sets (`pipelines = "orders"`). Build and run it in the simulator build:
//! `env -u RUSTFLAGS cargo sim run scenarios/orders-mixed.toml` in a project of your own (with `cargo-config.toml`
//! copied to `.cargo/config.toml`), or inside lockstep's workspace, from anywhere in it:
//! `env -u RUSTFLAGS cargo sim-run --release -p user-pipelines --bin orders-sim -- run FILE`.

/// How a user runs this binary, in the commands it prints ("replay it with: …"). This example lives in lockstep's
/// workspace, where `cargo sim` is lockstep's alias for `lockstep sim`, so it prints the `sim-run` form, which
/// works there and in a copy of this project with `cargo-config.toml` (it defines `sim-run` too). A project of
/// your own prints its `sim` alias: `.with_invocation("env -u RUSTFLAGS cargo sim")`.
const INVOCATION: &str = "env -u RUSTFLAGS cargo sim-run --release -p user-pipelines --bin orders-sim --";

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    use lockstep::sim::cli::Registry;
    use user_pipelines::Idempotency;
    use user_pipelines::sim::orders;
    // The build id follows this crate's sources (its build.rs hashes them), so a replay file written before an
    // edit of a handler is refused with the command that runs its scenario again, not replayed by other handlers.
    let registry = Registry::new("orders-sim")
        .with_build_id(env!("USER_PIPELINES_BUILD_ID"))
        .with(orders(Idempotency::On))
        .with(orders(Idempotency::Off))
        .with_invocation(INVOCATION);
    lockstep::sim::cli::main(registry)
}

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = if args.is_empty() {
        vec!["run".into(), "examples/user-pipelines/scenarios/orders-mixed.toml".into()]
    } else {
        args
    };
    eprintln!(
        "orders-sim runs under lockstep's simulator (its build with --cfg madsim), and this is the normal build; run:\n\n    {}",
        lockstep::sim::shell::command(INVOCATION, &args)
    );
    std::process::ExitCode::from(2)
}
