//! This project's own simulator binary: lockstep's `run | sweep | merge | replay | explain | shrink` for scenario files
//! that name this project's pipeline sets (`pipelines = "orders"`). Build and run it in the simulator build:
//! `env -u RUSTFLAGS cargo sim run scenarios/orders-mixed.toml` in a project of your own (with `cargo-config.toml`
//! copied to `.cargo/config.toml`), or inside lockstep's workspace, from its root:
//! `env -u RUSTFLAGS cargo sim-run --release -p user-pipelines --bin orders-sim -- run FILE`.

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    use lockstep::sim::cli::Registry;
    use user_pipelines::Idempotency;
    use user_pipelines::sim::orders;
    // The build id changes with this crate's version; a real project would hash its sources (as lockstep's
    // build.rs does) so that a replay file is never replayed by other handlers.
    let registry = Registry::new("orders-sim")
        .with_build_id(concat!("user-pipelines-", env!("CARGO_PKG_VERSION")))
        .with(orders(Idempotency::On))
        .with(orders(Idempotency::Off))
        .with_invocation("env -u RUSTFLAGS cargo sim");
    lockstep::sim::cli::main(registry)
}

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    eprintln!("orders-sim runs under lockstep's simulator: env -u RUSTFLAGS cargo sim run SCENARIO.toml");
    std::process::ExitCode::from(2)
}
