//! The commands of real mode against bad input and a database in odd states: the client commands (`submit`,
//! `status`, `abort`) on a schema that is not migrated run no DDL (a typo in `--schema` must not create a schema),
//! exit 2 and name the `migrate` command; `migrate` creates it, also several at once. A bad flag value (a lease ttl
//! past its bound, a URL that is not PostgreSQL's or points at a server that is not, a URL file that cannot be
//! read) exits 2 naming the flag; a database error is printed as PostgreSQL says it; "cannot connect" is said only
//! of a server that cannot be reached. Needs PostgreSQL (DATABASE_URL); never skips.
#![cfg(not(madsim))]

use crate::support;

use support::command::clean_command;
use support::scratch::Scratch;

use lockstep::gang::{SpecFormat, api};
use lockstep::store::{PgStore, RowId};
use sqlx::Connection;
use std::process::Output;
use support::pg::{database_url, unique_schema};

/// Processes of `lockstep migrate` started at once on one new schema (a replica and agents started together).
const CONCURRENT_MIGRATES: usize = 4;

fn lockstep(args: &[&str], schema: &str) -> Output {
    clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .args(["--database-url", &database_url(), "--schema", schema])
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// Runs the binary with exactly `args` and no `DATABASE_URL` in its environment.
fn lockstep_bare(args: &[&str]) -> Output {
    clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// Asserts that `output` is a usage error (exit 2) whose message contains each of `parts`; returns stderr.
fn usage_error(output: &Output, parts: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for part in parts {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    stderr
}

/// Runs `sql` on a connection of its own.
async fn execute(sql: String) {
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.expect("PostgreSQL is reachable");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await.expect("the statement runs");
    let _ = conn.close().await;
}

/// Whether `schema` exists, asked on a connection of its own.
async fn schema_exists(schema: &str) -> bool {
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

/// A schema a newer lockstep migrated (it holds a migration this build does not have) is named as such by every
/// command, exit 1 (the schema cannot be opened), with no advice to run `migrate`, which cannot help (a new
/// user's trial was told to, and it failed with sqlx's "previously applied but is missing").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_a_newer_lockstep_is_named_so_by_every_command() {
    let schema = unique_schema();
    let output = lockstep(&["migrate"], &schema);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let newer = 99_999_999_999_999_i64;
    execute(format!(
        "INSERT INTO {schema}._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ({newer}, 'from a newer lockstep', true, '\\x00', 0)"
    ))
    .await;
    for args in [&["status", "70"][..], &["migrate"]] {
        let output = lockstep(args, &schema);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        let said = format!("cannot open schema {schema} on PostgreSQL: ");
        assert!(stderr.contains(&said), "{args:?}: {stderr}");
        let said = format!("holds migration {newer}, which this build of lockstep does not have");
        assert!(stderr.contains(&said), "{args:?}: {stderr}");
        assert!(!stderr.contains("run `lockstep migrate"), "{args:?}: {stderr}");
    }
    PgStore::drop_schema(&database_url(), &schema).await.expect("drop the test schema");
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

/// A submit is keyed (a retried submit runs once): run again with the key of an earlier submit, it
/// creates nothing and prints that submit's operation, exit 0; without `--key` it makes a key and prints it on
/// stderr, and that key does the same; a bad key is a usage error naming `--key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_run_again_with_its_key_prints_the_first_operation_and_creates_nothing() {
    use lockstep::store::Store as _;
    let harness = support::pg::PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness).clone();
    let schema = store.schema().to_string();
    let dir = std::env::temp_dir().join(format!("lockstep-real-cli-{schema}"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("one.json");
    std::fs::write(&spec, r#"{"tasks": {"t": {"job_count": 1, "command": "true"}}}"#).unwrap();
    let spec = spec.to_str().unwrap();
    let submit = |extra: &[&str]| {
        let output = lockstep(&[&["submit", spec][..], extra].concat(), &schema);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let id: i64 = String::from_utf8_lossy(&output.stdout).trim().parse().expect("submit prints the id");
        (id, stderr)
    };
    let (first, stderr) = submit(&["--key", "nightly-42"]);
    assert!(!stderr.contains("submit key:"), "a key given is not printed: {stderr}");
    let (again, stderr) = submit(&["--key", "nightly-42"]);
    assert_eq!(again, first, "the second submit with key nightly-42");
    assert!(stderr.contains(&format!("key nightly-42 names operation {first}, submitted before")), "{stderr}");
    let (made, stderr) = submit(&[]);
    assert_ne!(made, first);
    let line = stderr.lines().find(|line| line.starts_with("submit key: ")).unwrap_or_else(|| panic!("{stderr}"));
    let key = line["submit key: ".len()..].split_whitespace().next().expect("the key");
    assert_eq!(key.len(), 32, "a made key is 128 bits in hex: {line}");
    assert_eq!(submit(&["--key", key]).0, made, "the made key names the operation it made");
    let operations = store.list("operation", None).await.expect("list");
    assert_eq!(operations.len(), 2, "one operation per key: {operations:?}");
    usage_error(&lockstep(&["submit", spec, "--key", ""], &schema), &["--key", "must not be empty"]);
    // An abort's reason is one line of `status` and `list`: an empty one or one with a control character is refused
    // before anything is written.
    let first = first.to_string();
    usage_error(&lockstep(&["abort", &first, "--reason", " "], &schema), &["--reason", "must not be empty"]);
    usage_error(&lockstep(&["abort", &first, "--reason", "a\tb"], &schema), &["--reason", "control character"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary with `args` on `schema`, `input` written to its standard input.
fn lockstep_with_input(args: &[&str], schema: &str, input: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .args(["--database-url", &database_url(), "--schema", schema])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child.stdin.take().expect("its stdin").write_all(input).expect("the input is written");
    child.wait_with_output().expect("the command ends")
}

/// `submit -` reads the spec from standard input, as Unix commands take `-` (a new user's trial: it looked for a
/// file named `-`); its format is YSON unless `--format` says otherwise (a spec file's comes from its extension).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_dash_reads_the_spec_from_standard_input() {
    let harness = support::pg::PgHarness::new().await;
    let schema = lockstep::store::conformance::Harness::store(&harness).schema().to_string();
    let json = br#"{"tasks": {"t": {"job_count": 1, "command": "true"}}}"#;
    let yson = br#"{tasks={t={job_count=1; command="true"}}}"#;
    for (args, spec) in [(&["submit", "-", "--format", "json"][..], &json[..]), (&["submit", "-"], &yson[..])] {
        let output = lockstep_with_input(args, &schema, spec);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        let id: i64 = String::from_utf8_lossy(&output.stdout).trim().parse().expect("submit prints the id");
        let status = lockstep(&["status", &id.to_string()], &schema);
        assert_eq!(status.status.code(), Some(0), "{}", String::from_utf8_lossy(&status.stderr));
    }
    // JSON on standard input without --format is read as YSON, and the error says where it stopped.
    let output = lockstep_with_input(&["submit", "-"], &schema, json);
    usage_error(&output, &["spec - is invalid"]);
}

/// Submits a one-task operation (task `task`, 2 jobs) through the library and returns its id.
async fn submit_task(store: &PgStore, task: &str) -> RowId {
    let spec = format!("{{tasks={{{task}={{job_count=2; command=\"true\"}}}}}}");
    api::submit_text(store, &spec, SpecFormat::Yson).await.expect("the spec is submitted")
}

/// Puts operation `operation` of `schema` in state `state`, submitted `age` before the database's `now` (no
/// replica runs in these tests to move it).
async fn place(schema: &str, operation: RowId, state: &str, age: &str) {
    execute(format!(
        "UPDATE {schema}.resources SET status = '{state}', created_at = now() - interval '{age}' WHERE id = {operation}"
    ))
    .await;
}

/// The ids in the first column of `list`'s table (after its header), in order.
fn listed(output: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let mut lines = stdout.lines();
    assert!(lines.next().is_some_and(|header| header.starts_with("operation  state")), "{stdout}");
    lines
        .filter(|line| !line.starts_with('('))
        .map(|line| line.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// `list` lists operations newest first with state, submission time, age, incarnation, tasks and result; filters
/// by state (the flag repeated, or a comma list) and by age on the database's clock (`--since`, `--older-than`,
/// both for a window); `--limit` keeps the newest and counts the rest; `--json` gives the same in JSON. A window
/// that selects nothing and an unknown state are usage errors (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_operations_newest_first_filtered_by_state_and_age() {
    let harness = support::pg::PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness);
    let schema = store.schema().to_string();
    let empty = lockstep(&["list"], &schema);
    assert_eq!(String::from_utf8_lossy(&empty.stdout), "no operations\n");
    let (old, running, new) =
        (submit_task(store, "old").await, submit_task(store, "mid").await, submit_task(store, "new").await);
    place(&schema, old, "completed", "2 hours").await;
    place(&schema, running, "running", "10 minutes").await;
    let ids = |list: &[RowId]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(listed(&lockstep(&["list"], &schema)), ids(&[new, running, old]));
    let table = String::from_utf8_lossy(&lockstep(&["list"], &schema).stdout).into_owned();
    let line = table.lines().find(|line| line.starts_with(&format!("{running} "))).expect("the running one");
    for cell in ["running", &format!("{running}-i0"), "mid:2", "10m"] {
        assert!(line.contains(cell), "{cell:?} missing from: {line}");
    }
    assert_eq!(listed(&lockstep(&["list", "--state", "starting,running"], &schema)), ids(&[new, running]));
    assert_eq!(
        listed(&lockstep(&["list", "--state", "completed", "--state", "running"], &schema)),
        ids(&[running, old])
    );
    assert_eq!(listed(&lockstep(&["list", "--since", "1h"], &schema)), ids(&[new, running]));
    assert_eq!(listed(&lockstep(&["list", "--older-than", "1h"], &schema)), ids(&[old]));
    assert_eq!(listed(&lockstep(&["list", "--since", "1h", "--older-than", "5m"], &schema)), ids(&[running]));
    let limited = lockstep(&["list", "--limit", "1"], &schema);
    assert_eq!(listed(&limited), ids(&[new]));
    assert!(String::from_utf8_lossy(&limited.stdout).ends_with("(2 older operations left out by --limit)\n"));
    let output = lockstep(&["list", "--json", "--state", "completed"], &schema);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("list --json prints JSON");
    let operations = json["operations"].as_array().expect("an operations array");
    assert_eq!(operations.len(), 1, "{json}");
    assert_eq!(operations[0]["operation"], serde_json::json!(old.0), "{json}");
    assert_eq!(operations[0]["state"], "completed", "{json}");
    assert_eq!(operations[0]["tasks"], serde_json::json!([{"name": "old", "job_count": 2, "gang": false}]));
    assert!(operations[0]["age_ms"].as_u64().is_some_and(|age| age >= 7_200_000), "{json}");
    assert_eq!(json["left_out"], 0, "{json}");
    usage_error(
        &lockstep(&["list", "--since", "1h", "--older-than", "2h"], &schema),
        &["--since 1h with --older-than 2h selects nothing"],
    );
    usage_error(&lockstep(&["list", "--state", "runing"], &schema), &["invalid value 'runing' for '--state"]);
}

/// `abort` exits 0 for a state already reached: an operation already aborted (saying so), and one that completed
/// or failed before the abort (saying it ended so, and that nothing was aborted); it exits 1 only when it cannot
/// ask, as for an operation that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_of_an_operation_that_already_ended_exits_0_naming_its_state() {
    let harness = support::pg::PgHarness::new().await;
    let store = lockstep::store::conformance::Harness::store(&harness);
    let schema = store.schema().to_string();
    let live = submit_task(store, "live").await;
    let output = lockstep(&["abort", &live.to_string()], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        (output.status.code(), stderr.trim()),
        (Some(0), format!("abort of operation {live} requested").as_str())
    );
    for (state, said) in [
        ("aborted", "already aborted".to_string()),
        ("completed", "already completed: it ended before the abort, so nothing was aborted".to_string()),
        ("failed", "already failed: it ended before the abort, so nothing was aborted".to_string()),
    ] {
        let operation = submit_task(store, state).await;
        place(&schema, operation, state, "1 second").await;
        let output = lockstep(&["abort", &operation.to_string()], &schema);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{state}: {stderr}");
        assert_eq!(stderr.trim(), format!("operation {operation} {said}"), "{state}");
    }
    let output = lockstep(&["abort", "999999"], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("operation 999999 not found"), "{stderr}");
}

#[test]
fn a_lease_ttl_past_an_hour_is_refused_naming_the_flag() {
    for command in [&["serve"][..], &["agent", "--node", "n", "--slots", "1", "--work-dir", "/tmp/lockstep-unused"]] {
        let mut args = command.to_vec();
        args.extend(["--database-url", "postgres://nobody@127.0.0.1:1/x", "--lease-ttl", "99999999999h"]);
        usage_error(&lockstep_bare(&args), &["--lease-ttl", "99999999999h exceeds the longest lease ttl, 1h"]);
    }
}

/// `agent` refuses a work dir that group or others can write (exit 2, before it connects), naming the flag, the
/// directory, its mode and the rule; nothing is made in it.
#[test]
fn an_agent_refuses_a_work_dir_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new("cli-work-dir-mode");
    let work_dir = scratch.join("node");
    std::fs::create_dir(&work_dir).unwrap();
    std::fs::set_permissions(&work_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let work = work_dir.to_str().unwrap();
    let args = [
        "agent",
        "--node",
        "n",
        "--slots",
        "1",
        "--work-dir",
        work,
        "--database-url",
        "postgres://nobody@127.0.0.1:1/x",
    ];
    let expected = format!("--work-dir: work dir {work}: mode 0777 lets group and others write it");
    usage_error(&lockstep_bare(&args), &[&expected, "chmod go-w"]);
    assert_eq!(std::fs::read_dir(&work_dir).unwrap().count(), 0, "nothing is made in a refused work dir");
}

#[test]
fn a_negative_duration_after_a_space_gets_the_duration_rule_not_an_unknown_argument() {
    let url = "postgres://nobody@127.0.0.1:1/x";
    let output = lockstep_bare(&["serve", "--database-url", url, "--lease-ttl", "-5s"]);
    usage_error(&output, &["--lease-ttl", "a duration cannot be negative"]);
    let output = lockstep_bare(&["serve", "--database-url", url, "--heartbeat-interval", "-1s"]);
    usage_error(&output, &["--heartbeat-interval", "a duration cannot be negative"]);
}

#[test]
fn a_url_that_is_not_postgres_is_refused_naming_its_source_and_never_showing_it() {
    let output = lockstep_bare(&["status", "1", "--database-url", "mysql://root:hunter2@127.0.0.1:3306/db"]);
    let stderr = usage_error(&output, &["--database-url: a mysql:// URL is not PostgreSQL's"]);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["status", "1"])
        .env("DATABASE_URL", "root:hunter2@127.0.0.1/db")
        .output()
        .expect("the binary runs");
    let stderr = usage_error(&output, &["DATABASE_URL: not a URL"]);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    usage_error(&lockstep_bare(&["status", "1"]), &["no database URL", "--database-url-file PATH", "DATABASE_URL"]);
    let missing = "/nonexistent/lockstep-database-url";
    usage_error(
        &lockstep_bare(&["status", "1", "--database-url-file", missing]),
        &[&format!("--database-url-file {missing}: cannot read it")],
    );
}

/// A spec or URL file that never ends (`/dev/zero`) is refused at its cap (exit 2), naming the flag or file and the
/// limit, instead of read until memory runs out (a new user's trial: `submit /dev/zero --format yson` grew to
/// gigabytes).
#[test]
fn a_spec_or_url_file_past_its_cap_is_refused_not_read_until_memory_runs_out() {
    usage_error(
        &lockstep_bare(&["submit", "/dev/zero", "--format", "yson"]),
        &["cannot read spec /dev/zero: it holds more than 16 MiB (16777216 bytes), the most a spec file may hold"],
    );
    usage_error(
        &lockstep_bare(&["status", "1", "--database-url-file", "/dev/zero"]),
        &["--database-url-file /dev/zero: cannot read it: it holds more than 65536 bytes"],
    );
}

/// A URL whose port is another server's (Redis answers PostgreSQL's startup message with an error line of its
/// own) is refused (exit 2) naming the flag and the server's address, not with sqlx's "unknown message type".
#[test]
fn a_url_pointing_at_a_server_that_is_not_postgres_is_refused_naming_its_address() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.read(&mut [0; 1024]);
            let _ = stream.write_all(b"-ERR unknown command\r\n");
        }
    });
    for command in [&["status", "1"][..], &["migrate"]] {
        let url = format!("postgres://nobody@127.0.0.1:{port}/x");
        let output = lockstep_bare(&[command, &["--database-url", &url]].concat());
        let address = format!("--database-url: the server at 127.0.0.1:{port} did not answer as PostgreSQL does");
        let stderr = usage_error(&output, &[&address, "PostgreSQL listens on 5432 by default"]);
        assert!(!stderr.contains("sqlx"), "{stderr}");
    }
}

#[test]
fn help_says_the_url_flag_is_visible_in_the_process_list_and_names_the_other_ways() {
    for command in ["serve", "agent", "submit", "status", "abort", "migrate"] {
        let output = lockstep_bare(&[command, "--help"]);
        let help = String::from_utf8_lossy(&output.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains("Every local user can read it in the process list"), "{command}: {help}");
        assert!(help.contains("--database-url-file <PATH>"), "{command}: {help}");
        assert!(help.contains("DATABASE_URL environment variable"), "{command}: {help}");
    }
}

/// The default `--help` gives for `serve --max-connections` is the rule the flag is checked against: one session
/// fewer is refused (before any connection is tried).
#[test]
fn serve_help_states_the_max_connections_rule_that_serve_checks() {
    let output = lockstep_bare(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&output.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = "Default, and the least accepted: workers + 5 (the workers, two fetch loops, the heartbeater, two \
                  apply batches in flight)";
    assert!(help.contains(stated), "{help}");
    let workers = 5;
    let needed = workers + 5;
    let args = ["serve", "--database-url", "postgres://nobody@127.0.0.1:1/x", "--workers", &workers.to_string()];
    let fewer = (needed - 1).to_string();
    usage_error(
        &lockstep_bare(&[&args[..], &["--max-connections", &fewer]].concat()),
        &[&format!("--max-connections: {fewer} is fewer than the {needed} sessions --workers {workers} needs")],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_may_come_from_a_file_and_migrates_started_at_once_all_succeed() {
    let schema = unique_schema();
    let file = std::env::temp_dir().join(format!("lockstep-real-cli-url-{schema}"));
    std::fs::write(&file, format!("{}\n", database_url())).unwrap();
    let children: Vec<_> = (0..CONCURRENT_MIGRATES)
        .map(|_| {
            clean_command(env!("CARGO_BIN_EXE_lockstep"))
                .args(["migrate", "--schema", &schema, "--database-url-file", file.to_str().unwrap()])
                .env_remove("DATABASE_URL")
                .env("RUST_LOG", "warn")
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("the binary runs")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().expect("migrate ends");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "one of {CONCURRENT_MIGRATES} migrates at once: {stderr}");
    }
    assert!(schema_exists(&schema).await);
    PgStore::drop_schema(&database_url(), &schema).await.expect("drop the test schema");
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_server_that_cannot_be_reached_is_cannot_connect_and_database_errors_are_postgres_own_words() {
    // Nothing listens on port 1: that is a connection failure.
    let output = lockstep_bare(&["status", "1", "--database-url", "postgres://nobody@127.0.0.1:1/x"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect to PostgreSQL (URL from --database-url)"), "{stderr}");
    // `chaos run` names the source it used too (a trial: "--database-url or DATABASE_URL").
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/rows-quiet.toml");
    let output = lockstep_bare(&["chaos", "run", scenario, "--database-url", "postgres://nobody@127.0.0.1:1/x"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect to PostgreSQL (URL from --database-url)"), "{stderr}");
    assert!(!stderr.contains("DATABASE_URL"), "{stderr}");

    // A database the server does not have: the URL is wrong (exit 2, naming the flag).
    let mut missing_db = database_url();
    let slash = missing_db.rfind('/').expect("the URL names a database");
    missing_db.replace_range(slash + 1.., "lockstep_no_such_database");
    let output = lockstep_bare(&["status", "1", "--database-url", &missing_db]);
    let stderr = usage_error(&output, &["--database-url: ", "lockstep_no_such_database", "(SQLSTATE 3D000)"]);
    assert!(!stderr.contains("cannot connect"), "{stderr}");

    // A schema migrated by a newer build: reached, but it cannot be opened.
    let harness = support::pg::PgHarness::new().await;
    let schema = lockstep::store::conformance::Harness::store(&harness).schema().to_string();
    execute(format!(
        "INSERT INTO \"{schema}\"._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99999, 'from a newer build', true, '\\x00', 0)"
    ))
    .await;
    let output = lockstep(&["migrate"], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("cannot open schema {schema} on PostgreSQL: ")), "{stderr}");
    assert!(stderr.contains("99999"), "{stderr}");
    assert!(!stderr.contains("cannot connect"), "{stderr}");

    // A database error during a command: PostgreSQL's message and SQLSTATE, no sqlx wrapping.
    execute(format!(
        "DELETE FROM \"{schema}\"._sqlx_migrations WHERE version = 99999; DROP TABLE \"{schema}\".resources CASCADE"
    ))
    .await;
    let output = lockstep(&["status", "1"], &schema);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("relation \"resources\" does not exist (SQLSTATE 42P01)"), "{stderr}");
    assert!(!stderr.contains(" at line "), "{stderr}");
    assert!(!stderr.contains("error returned from database"), "{stderr}");
}

/// `submit --wait` with no replica running says so once the operation has stayed `starting` a while, naming the
/// `serve` command, instead of waiting in silence (the hint's delay is shortened here: 15 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_without_a_replica_says_no_replica_has_taken_the_operation() {
    use std::io::{BufRead, BufReader};
    let schema = unique_schema();
    assert_eq!(lockstep(&["migrate"], &schema).status.code(), Some(0), "migrate");
    let dir = std::env::temp_dir().join(format!("lockstep-real-cli-{schema}"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("plain.yson");
    std::fs::write(&spec, "{tasks={t={job_count=1;command=\"true\"}}}").unwrap();
    let mut child = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["submit", spec.to_str().unwrap(), "--wait", "--no-replica-hint-after", "1s"])
        .args(["--database-url", &database_url(), "--schema", &schema])
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the binary runs");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    // A watchdog ends the command if the note never comes (its stderr then closes and the loop below ends).
    let pid = child.id() as libc::pid_t;
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watched = finished.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        if !watched.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: kill only sends a signal, to the child, which is not waited for until `finished` is set.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    });
    for line in stderr.lines().map_while(Result::ok) {
        let note = line.contains("no controller replica has taken it")
            && line.contains(&format!("lockstep serve --schema {schema}"));
        seen.push(line);
        if note || seen.len() > 20 {
            break;
        }
    }
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = child.kill();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    PgStore::drop_schema(&database_url(), &schema).await.unwrap();
    assert!(seen.iter().any(|line| line.contains("no controller replica has taken it")), "{seen:#?}");
}
