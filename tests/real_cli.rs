//! The client commands of real mode (`submit`, `status`, `abort`) on a schema that is not migrated: they run no
//! DDL (a typo in `--schema` must not create a schema), exit 2 and name the `migrate` command; `migrate` creates
//! it. Needs PostgreSQL (DATABASE_URL); never skips.
#![cfg(not(madsim))]

mod support;

use lockstep::store::PgStore;
use std::process::{Command, Output};
use support::pg::{database_url, unique_schema};

fn lockstep(args: &[&str], schema: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .args(["--database-url", &database_url(), "--schema", schema])
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// Whether `schema` exists, asked on a connection of its own.
async fn schema_exists(schema: &str) -> bool {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.expect("PostgreSQL is reachable");
    let exists = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(&mut conn)
        .await
        .expect("pg_namespace is readable");
    let _ = conn.close().await;
    exists
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_commands_refuse_a_schema_that_is_not_migrated_and_create_nothing() {
    let schema = unique_schema();
    let dir = std::env::temp_dir().join(format!("lockstep-real-cli-{schema}"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("spec.json");
    std::fs::write(&spec, r#"{"tasks": {"t": {"job_count": 1, "command": "true"}}}"#).unwrap();
    let spec = spec.to_str().unwrap();
    let expected = format!("schema {schema} is not migrated");
    for args in [&["status", "70"][..], &["abort", "70"], &["submit", spec]] {
        let output = lockstep(args, &schema);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("lockstep migrate --schema {schema}")), "{args:?}: {stderr}");
        assert!(!schema_exists(&schema).await, "{args:?} created schema {schema}");
    }
    let output = lockstep(&["migrate"], &schema);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(schema_exists(&schema).await, "migrate creates the schema");
    let output = lockstep(&["status", "70"], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("operation 70 not found"), "{stderr}");
    PgStore::drop_schema(&database_url(), &schema).await.expect("drop the test schema");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `submit` keeps a spec's unknown keys (as YTsaurus does) but warns on stderr about each, naming its path and the
/// known key it is closest to; a YTsaurus key lockstep knowingly ignores (`stderr_table_path`) is not warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_warns_about_each_unknown_spec_key_with_the_closest_known_one() {
    let harness = support::pg::PgHarness::new().await;
    let schema = lockstep::store::conformance::Harness::store(&harness).schema().to_string();
    let dir = std::env::temp_dir().join(format!("lockstep-real-cli-{schema}"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("typo.yson");
    std::fs::write(
        &spec,
        "{tasks={t={job_count=2; command=\"true\"; gang_option={size=1}; foo=bar}}; pool=x; stderr_table_path=\"//s\"}",
    )
    .unwrap();
    let output = lockstep(&["submit", spec.to_str().unwrap()], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|line| line.starts_with("warning: spec key ")).collect();
    assert_eq!(warnings.len(), 3, "{stderr}");
    assert!(
        stderr.contains(
            "warning: spec key tasks.t.gang_option is not one lockstep knows; it is kept but has no effect (did you \
             mean gang_options?)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("warning: spec key tasks.t.foo is not one lockstep knows"), "{stderr}");
    assert!(stderr.contains("warning: spec key pool is not one lockstep knows"), "{stderr}");
    assert!(!stderr.contains("stderr_table_path"), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).trim().parse::<u64>().is_ok(), "submit prints the id");
    let _ = std::fs::remove_dir_all(&dir);
}
