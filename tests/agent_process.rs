//! The OS executor: `sh -c COMMAND` in a private sandbox, a cleared environment with the job's variables, stdout
//! and stderr captured, exit codes, files from `file_paths`; a job's whole process tree ends with it (exit, kill,
//! and the next agent on the work dir after an agent died); an agent whose job copies a large file keeps its node
//! lease. Real processes, real time (each test is short). The agent killed with SIGKILL for real is in
//! tests/real_e2e.rs.
#![cfg(not(madsim))]

use crate::support;

use support::command::clean_command;

use lockstep::agent::job_tree::{JOB_MARKER_VAR, JobRecords, JobTree, Leader};
use lockstep::agent::process::{ENV_ALLOWED, OsExecutor};
use lockstep::agent::{Agent, AgentConfig, AgentPass, Executor, ExitStatus, ProcessHandle, StartRequest};
use lockstep::gang::model::{AllocationRef, JobId, JobLaunch, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::{FilePath, SpecFormat, api};
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, RowId, Timestamp, TokioClock};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::procs::{Reaper, alive_with};

/// A fresh directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lockstep-agent-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Writable by its owner only, whatever the umask: the agent refuses a work dir others can write.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn request(command: &str, environment: &[(&str, &str)], file_paths: Vec<FilePath>) -> StartRequest {
    let job = JobId { operation: RowId(5), index: 3 };
    StartRequest {
        node: "node-0".into(),
        allocation: AllocationRef { row: RowId(9), generation: 1 },
        launch: JobLaunch {
            job,
            incarnation: "5-i0".into(),
            task: "t".into(),
            job_cookie: 0,
            gang_rank: None,
            command: command.into(),
            environment: environment.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            file_paths,
        },
    }
}

async fn wait(handle: &ProcessHandle) -> ExitStatus {
    for _ in 0..500 {
        if let Some(status) = handle.exit_status() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process did not exit in 5 s");
}

#[tokio::test]
async fn a_job_runs_in_its_sandbox_with_its_environment_and_captured_output() {
    let dir = TempDir::new("output");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let env = [("YT_JOB_ID", "5-3"), ("GREETING", "hello world; $(not expanded) \"quoted\"")];
    let command = r#"echo "$YT_JOB_ID"; printf '%s\n' "$GREETING"; echo oops >&2; pwd; exit 3"#;
    let handle = executor.start(request(command, &env, Vec::new())).await.unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(3));
    let sandbox = executor.sandbox("5-3");
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "5-3");
    assert_eq!(lines[1], "hello world; $(not expanded) \"quoted\"", "a value is set as is, never through a shell");
    assert_eq!(PathBuf::from(lines[2]).canonicalize().unwrap(), sandbox.canonicalize().unwrap());
    assert_eq!(std::fs::read_to_string(sandbox.join("stderr")).unwrap(), "oops\n");
}

#[tokio::test]
async fn a_kill_ends_the_shell_and_everything_it_started() {
    let dir = TempDir::new("kill");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let handle =
        executor.start(request("sleep 300 & sleep 300 & echo $$ > pgid; wait", &[], Vec::new())).await.unwrap();
    let pgid_file = executor.sandbox("5-3").join("pgid");
    let mut pgid = None;
    for _ in 0..500 {
        if let Some(id) = std::fs::read_to_string(&pgid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
            pgid = Some(id);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pgid = pgid.expect("the shell wrote its pid");
    assert_eq!(handle.kill().await, ExitStatus::Killed);
    // The group is gone: the two sleeps died with the shell (give the kernel a moment to reap them).
    for _ in 0..500 {
        // SAFETY: signal 0 only checks whether the group exists.
        if unsafe { libc::killpg(pgid, 0) } != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process group {pgid} still alive after the kill");
}

#[tokio::test]
async fn file_paths_are_copied_into_the_sandbox_under_their_file_names() {
    let dir = TempDir::new("files");
    let root = dir.0.join("cypress");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::write(root.join("tmp/duties_180124.dat"), "duty\n").unwrap();
    std::fs::write(root.join("tmp/run_master.py"), "print()\n").unwrap();
    let executor = OsExecutor::open(dir.0.join("sandboxes"), Some(root)).await.unwrap();
    let files = vec![
        FilePath { path: "//tmp/run_master.py".into(), file_name: None },
        FilePath { path: "//tmp/duties_180124.dat".into(), file_name: Some("duties.dat".into()) },
    ];
    let handle = executor.start(request("cat duties.dat && test -f run_master.py", &[], files)).await.unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(0));
    assert_eq!(std::fs::read_to_string(executor.sandbox("5-3").join("stdout")).unwrap(), "duty\n");
}

#[tokio::test]
async fn a_missing_file_is_a_start_failure() {
    let dir = TempDir::new("missing");
    let executor = OsExecutor::open(&dir.0, Some(dir.0.join("cypress"))).await.unwrap();
    let files = vec![FilePath { path: "//tmp/absent".into(), file_name: None }];
    let error = executor.start(request("true", &[], files)).await.unwrap_err();
    assert!(error.to_string().contains("cannot copy"), "{error}");
}

/// A number no other live test process uses, for `sleep` arguments the tests find processes by: `1000.{pid}{n}`.
fn marker(n: u32) -> String {
    format!("1000.{}{n:02}", std::process::id())
}

/// Waits up to `limit` for `done`.
async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "not {what} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The shell commands of a job whose tree has every shape a job may leave behind, each `sleep` with a marker of
/// its own: a background child, a pipeline, an orphaned grandchild (its parent subshell exits), a process that
/// left the job's session and process group (`setsid`), and one started with a cleared environment (no marker
/// variable, still in the session). The [`Reaper`] kills what a failing test leaves.
fn tree_shapes(first: u32) -> (String, Vec<String>, Reaper) {
    let m: Vec<String> = (first..first + 6).map(marker).collect();
    let command = format!(
        "sleep {} & sleep {} | sleep {} & (sleep {} &) ; setsid sleep {} & env -i /bin/sleep {} &",
        m[0], m[1], m[2], m[3], m[4], m[5]
    );
    (command, m.clone(), Reaper(m))
}

#[tokio::test]
async fn a_job_sees_only_the_allowed_variables_its_own_and_its_marker() {
    let dir = TempDir::new("env");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let withheld: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|n| !ENV_ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(!withheld.is_empty(), "the test process has variables a job must not see");
    let env = [("YT_JOB_ID", "5-3"), ("GREETING", "hi")];
    let handle = executor.start(request("env", &env, Vec::new())).await.unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(0));
    let stdout = std::fs::read_to_string(executor.sandbox("5-3").join("stdout")).unwrap();
    let seen: BTreeMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('=')).collect();
    // `sh` itself sets PWD (dash; bash adds SHLVL and _).
    let allowed: BTreeSet<&str> =
        ENV_ALLOWED.iter().copied().chain(["YT_JOB_ID", "GREETING", JOB_MARKER_VAR, "PWD", "SHLVL", "_"]).collect();
    for name in seen.keys() {
        assert!(allowed.contains(name), "the job saw {name}: {stdout}");
    }
    for name in ENV_ALLOWED {
        assert_eq!(seen.get(name).copied(), std::env::var(name).ok().as_deref(), "{name} is the agent's");
    }
    assert_eq!((seen["YT_JOB_ID"], seen["GREETING"]), ("5-3", "hi"));
    assert!(seen[JOB_MARKER_VAR].starts_with("5-3:"), "{stdout}");
}

#[tokio::test]
async fn a_sandbox_and_its_output_files_are_private_to_the_jobs_user() {
    let dir = TempDir::new("modes");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let handle = executor.start(request("echo out; echo err >&2", &[], Vec::new())).await.unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(0));
    let mode = |path: PathBuf| std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    let sandbox = executor.sandbox("5-3");
    assert_eq!(mode(sandbox.clone()), 0o700);
    assert_eq!(mode(sandbox.join("stdout")), 0o600);
    assert_eq!(mode(sandbox.join("stderr")), 0o600);
}

#[tokio::test]
async fn a_job_that_exits_leaves_no_process_behind() {
    let dir = TempDir::new("exit-tree");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let (shapes, markers, _reaper) = tree_shapes(0);
    let command = format!("{shapes} while [ ! -e go ]; do sleep 0.01; done; exit 0");
    let handle = executor.start(request(&command, &[], Vec::new())).await.unwrap();
    until(Duration::from_secs(5), "every process of the job running", || {
        markers.iter().all(|m| !alive_with(m).is_empty())
    })
    .await;
    std::fs::write(executor.sandbox("5-3").join("go"), "").unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(0));
    // The exit is reported only once the tree is dead: no waiting here.
    for m in &markers {
        assert_eq!(alive_with(m), Vec::<i32>::new(), "sleep {m} outlived its job's exit");
    }
}

#[tokio::test]
async fn a_kill_ends_every_process_of_the_job_even_one_that_left_its_session() {
    let dir = TempDir::new("kill-tree");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let (shapes, markers, _reaper) = tree_shapes(10);
    let handle = executor.start(request(&format!("{shapes} wait"), &[], Vec::new())).await.unwrap();
    until(Duration::from_secs(5), "every process of the job running", || {
        markers.iter().all(|m| !alive_with(m).is_empty())
    })
    .await;
    // The agent's kill (abort, incarnation change, fence, graceful stop: all take this path).
    assert_eq!(handle.kill().await, ExitStatus::Killed);
    for m in &markers {
        assert_eq!(alive_with(m), Vec::<i32>::new(), "sleep {m} outlived the kill of its job");
    }
}

/// A tree an agent killed with SIGKILL left (its shell gone, its children running, its record in the work dir)
/// ends when the next executor opens the work dir. The processes are started here as the agent would have started
/// them: a session of their own, the marker in their environment.
#[tokio::test]
async fn opening_a_work_dir_ends_the_trees_an_earlier_agent_left() {
    let dir = TempDir::new("leftovers");
    let (shapes, markers, _reaper) = tree_shapes(20);
    let marker_value = format!("5-3:{}", std::process::id());
    let mut shell = clean_command("setsid");
    shell.args(["sh", "-c", &format!("{shapes} wait")]).env_clear().env(JOB_MARKER_VAR, &marker_value);
    // Not the test's own output: a survivor would hold it open.
    shell.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut shell = shell.spawn().unwrap();
    let pid = i32::try_from(shell.id()).unwrap();
    until(Duration::from_secs(5), "every process of the job running", || {
        markers.iter().all(|m| !alive_with(m).is_empty())
    })
    .await;
    {
        // The record an agent writes, then the work dir as that agent left it (its lock gone with it).
        let first = OsExecutor::open(&dir.0, None).await.unwrap();
        let records = JobRecords::open(&dir.0.join(".lockstep/jobs")).unwrap();
        records.write("5-3", &JobTree { marker: marker_value, leader: Leader::read(pid) }).unwrap();
        let second = OsExecutor::open(&dir.0, None).await.unwrap_err();
        assert!(second.to_string().contains("in use by another agent"), "{second}");
        drop(first);
    }
    // The shell dies as the agent's death would have killed it; its children run on.
    shell.kill().unwrap();
    shell.wait().unwrap();
    assert!(markers.iter().all(|m| !alive_with(m).is_empty()), "the children outlive their shell");
    // What the next agent's start does first (and logs): every leftover process counted, whether the group kill
    // or a scan ended it (it said `processes=0` when the group kill ended them all).
    let records = JobRecords::open(&dir.0.join(".lockstep/jobs")).unwrap();
    let (jobs, processes) = records.end_leftovers().await.unwrap();
    assert_eq!(jobs, 1);
    assert!(processes >= markers.len(), "{processes} processes counted for {} sleeps", markers.len());
    let _executor = OsExecutor::open(&dir.0, None).await.unwrap();
    for m in &markers {
        assert_eq!(alive_with(m), Vec::<i32>::new(), "sleep {m} outlived the next agent's start");
    }
    assert_eq!(std::fs::read_dir(dir.0.join(".lockstep/jobs")).unwrap().count(), 0, "the record is gone");
}

/// Log lines written while a subscriber of `captured` is the thread's default, without colours.
fn capture_logs(captured: &Arc<Mutex<Vec<u8>>>) -> tracing::subscriber::DefaultGuard {
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Arc::clone(captured);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || Lines(Arc::clone(&captured)))
        .finish();
    tracing::subscriber::set_default(subscriber)
}

/// An agent that restarts on a work dir whose earlier jobs all ended (a machine that rebooted, an agent killed
/// after its jobs exited) ends no process: their records go with an info line, not a warning that it ended
/// processes left running.
#[tokio::test]
async fn opening_a_work_dir_whose_earlier_jobs_all_ended_removes_their_records_without_a_warning() {
    let dir = TempDir::new("ended-leftovers");
    drop(OsExecutor::open(&dir.0, None).await.unwrap());
    let records = JobRecords::open(&dir.0.join(".lockstep/jobs")).unwrap();
    let marker = format!("5-4:{}:no process has this marker", std::process::id());
    records.write("5-4", &JobTree { marker, leader: None }).unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let guard = capture_logs(&logs);
    let _executor = OsExecutor::open(&dir.0, None).await.unwrap();
    drop(guard);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(!logs.contains("WARN"), "{logs}");
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        logs.contains("removed the records of jobs an earlier agent left; none of their processes was still running"),
        "{logs}"
    );
    assert!(logs.contains("jobs=1"), "{logs}");
    assert_eq!(std::fs::read_dir(dir.0.join(".lockstep/jobs")).unwrap().count(), 0, "the record is gone");
}

const START: Timestamp = Timestamp(1_700_000_000_000_000);

/// An agent whose job copies a file for longer than its node lease lasts keeps heartbeating meanwhile (the copy
/// runs off its loop), and starts the job once the copy ends, in the same session. The file is a FIFO, so the test
/// decides when the copy ends: its open for writing returns once the copy has opened it for reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_file_copy_does_not_stop_the_agents_heartbeats() {
    let dir = TempDir::new("slow-copy");
    let root = dir.0.join("cypress");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let fifo = root.join("tmp/slow");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo only creates a file at a path we own.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let store = MemStore::new(TokioClock::new(START));
    let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
    let controller_pass = || async {
        replica.fetcher(1).run_once().await.unwrap();
        while replica.work_one(&OperationHandler::default()).await.is_some() {}
    };
    let executor = OsExecutor::open(dir.0.join("node"), Some(root)).await.unwrap();
    let config = AgentConfig {
        lease_ttl: Duration::from_secs(2),
        lease_margin: Duration::from_millis(500),
        heartbeat_trigger: Duration::from_secs(1),
        poll_interval: Duration::from_millis(100),
        ..AgentConfig::new("node-0", 1)
    };
    config.validate().unwrap();
    let passes: Arc<Mutex<Vec<(Instant, AgentPass)>>> = Arc::default();
    let seen = passes.clone();
    let agent = Agent::new(Arc::new(store.clone()), executor, config.clone())
        .with_observer(Arc::new(move |pass: &AgentPass| seen.lock().unwrap().push((Instant::now(), pass.clone()))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(agent.run_until(async move {
        let _ = stopped.await;
    }));
    let spec = r#"{tasks={t={job_count=1;command="cat slow";file_paths=["//tmp/slow"]}}}"#;
    let op = api::submit_text(&store, spec, SpecFormat::Yson).await.unwrap();
    let writer = tokio::task::spawn_blocking(move || std::fs::OpenOptions::new().write(true).open(fifo).unwrap());
    let started = Instant::now();
    while !writer.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(20), "the agent never began copying the file");
        controller_pass().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut writer = writer.await.unwrap();
    let copying = Instant::now();
    let session = || passes.lock().unwrap().iter().rev().find_map(|(_, pass)| pass.session);
    let copy_session = session().expect("the agent holds its node lease");
    // Passes go on through a lease and a half while the copy is blocked, all in the one session: it heartbeated.
    let bound = copying + config.lease_ttl * 3 / 2;
    until(config.lease_ttl * 4, "a pass a lease and a half into the copy", || {
        passes.lock().unwrap().iter().any(|(at, _)| *at > bound)
    })
    .await;
    {
        let passes = passes.lock().unwrap();
        assert!(passes.iter().all(|(_, pass)| pass.fenced.is_none()), "the agent fenced itself");
        assert!(passes.iter().all(|(_, pass)| pass.started.is_empty()), "the job started before its file was there");
        let during: BTreeSet<_> = passes.iter().filter(|(at, _)| *at > copying).map(|(_, pass)| pass.session).collect();
        assert_eq!(during, BTreeSet::from([Some(copy_session)]), "one session throughout the copy");
    }
    writer.write_all(b"the payload\n").unwrap();
    drop(writer);
    let started = Instant::now();
    loop {
        controller_pass().await;
        if api::status(&store, op).await.unwrap().status == OperationStatus::Completed {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the job did not complete after its copy ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let view = api::status(&store, op).await.unwrap();
    let job = view.jobs[0].data.id.to_string();
    let stdout = std::fs::read_to_string(dir.0.join("node").join(job).join("stdout")).unwrap();
    assert_eq!(stdout, "the payload\n");
    let passes = passes.lock().unwrap().clone();
    assert!(passes.iter().all(|(_, pass)| pass.fenced.is_none()), "the agent fenced itself");
    assert!(passes.iter().any(|(_, pass)| pass.started.len() == 1 && pass.session == Some(copy_session)));
    stop.send(()).unwrap();
    agent.await.unwrap();
}

/// The job's own `PATH` does not decide where its shell is (a new user's trial: `PATH = "/nonexistent"` made
/// every start fail with "cannot spawn sh"); the command itself still sees that `PATH`.
#[tokio::test]
async fn a_jobs_path_does_not_hide_its_shell() {
    let dir = TempDir::new("path");
    let executor = OsExecutor::open(&dir.0, None).await.unwrap();
    let env = [("YT_JOB_ID", "5-3"), ("PATH", "/nonexistent")];
    let handle = executor.start(request(r#"echo "$PATH"; exit 4"#, &env, Vec::new())).await.unwrap();
    assert_eq!(wait(&handle).await, ExitStatus::Exited(4));
    let stdout = std::fs::read_to_string(executor.sandbox("5-3").join("stdout")).unwrap();
    assert_eq!(stdout, "/nonexistent\n");
}

/// A work dir that group or others can write is refused at open, naming the mode and the rule: whoever can write
/// it could plant job records (processes to kill) or links (files to write through). The agent's command exits 2
/// with the message (tests/real_cli.rs).
#[tokio::test]
async fn a_work_dir_others_can_write_is_refused() {
    let dir = TempDir::new("open-mode");
    for (mode, who) in [(0o777, "group and others"), (0o770, "its group"), (0o703, "others")] {
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(mode)).unwrap();
        let error = OsExecutor::open(&dir.0, None).await.unwrap_err().to_string();
        let expected = format!("work dir {}: mode {mode:04o} lets {who} write it", dir.0.display());
        assert!(error.starts_with(&expected), "{error}");
        assert!(error.contains("chmod go-w"), "{error}");
        assert!(!dir.0.join(".lockstep").exists(), "nothing is made in a refused work dir");
    }
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    OsExecutor::open(&dir.0, None).await.unwrap();
}

/// A symbolic link planted where a job's sandbox goes (or where its output file goes, inside a real sandbox) is not
/// followed: the start fails naming the link, and the directory it points to is neither written nor changed mode.
#[tokio::test]
async fn a_symlink_planted_in_the_sandbox_path_is_not_followed() {
    let dir = TempDir::new("sandbox-link");
    let outside = dir.0.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.0.join("work");
    let executor = OsExecutor::open(&work, None).await.unwrap();
    let sandbox = executor.sandbox("5-3");
    std::os::unix::fs::symlink(&outside, &sandbox).unwrap();
    let error = executor.start(request("echo escaped > escaped", &[], Vec::new())).await.unwrap_err().to_string();
    assert!(error.contains(&format!("{} is a symbolic link", sandbox.display())), "{error}");
    let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "the link's target was changed mode");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "something was written through the link");
    assert_eq!(std::fs::read_dir(work.join(".lockstep/jobs")).unwrap().count(), 0, "the failed start's record");
    // A link at an output file in a real sandbox: the file it points to is not truncated or changed mode.
    std::fs::remove_file(&sandbox).unwrap();
    std::fs::create_dir(&sandbox).unwrap();
    let target = outside.join("precious");
    std::fs::write(&target, "keep me").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, sandbox.join("stdout")).unwrap();
    let error = executor.start(request("echo escaped", &[], Vec::new())).await.unwrap_err().to_string();
    assert!(error.contains(&format!("{} is a symbolic link", sandbox.join("stdout").display())), "{error}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o644);
}

/// A job record whose leader is now an unrelated process (the pid and start time of a `sleep` this test started,
/// as a record from before a reboot or one planted in the work dir would name it) does not get that process, or
/// its session and process group, killed: it does not carry the job's marker. The record goes all the same.
#[tokio::test]
async fn a_stale_record_naming_an_unrelated_process_does_not_kill_it() {
    let dir = TempDir::new("stale-record");
    let sleep_marker = marker(40);
    let _reaper = Reaper(vec![sleep_marker.clone()]);
    // A session and process group of its own, as a job's shell leads: the record's killpg would reach it.
    let mut unrelated = clean_command("setsid");
    unrelated.args(["sleep", &sleep_marker]).env_remove(JOB_MARKER_VAR);
    unrelated.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut unrelated = unrelated.spawn().unwrap();
    let pid = i32::try_from(unrelated.id()).unwrap();
    until(Duration::from_secs(5), "the unrelated sleep running", || alive_with(&sleep_marker) == vec![pid]).await;
    drop(OsExecutor::open(&dir.0, None).await.unwrap());
    let records = JobRecords::open(&dir.0.join(".lockstep/jobs")).unwrap();
    let leader = Leader::read(pid).expect("the sleep is alive");
    records.write("5-3", &JobTree { marker: format!("5-3:{:016x}", 7), leader: Some(leader) }).unwrap();
    let stale = Leader { pid, start_ticks: leader.start_ticks.saturating_sub(100) };
    records.write("5-4", &JobTree { marker: format!("5-4:{:016x}", 7), leader: Some(stale) }).unwrap();
    let _executor = OsExecutor::open(&dir.0, None).await.unwrap();
    assert_eq!(alive_with(&sleep_marker), vec![pid], "the unrelated process was killed");
    assert_eq!(std::fs::read_dir(dir.0.join(".lockstep/jobs")).unwrap().count(), 0, "the records are gone");
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
}

/// A symbolic link among the job records is not read through (its target could hold any record): it is skipped
/// with a warning and left in place.
#[tokio::test]
async fn a_symlinked_job_record_is_not_read() {
    let dir = TempDir::new("record-link");
    drop(OsExecutor::open(&dir.0, None).await.unwrap());
    let elsewhere = dir.0.join("elsewhere");
    let tree = JobTree { marker: format!("5-5:{}:no process has this marker", std::process::id()), leader: None };
    std::fs::write(&elsewhere, serde_json::to_vec(&tree).unwrap()).unwrap();
    let link = dir.0.join(".lockstep/jobs/5-5");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let guard = capture_logs(&logs);
    let _executor = OsExecutor::open(&dir.0, None).await.unwrap();
    drop(guard);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("is a symbolic link") && logs.contains("job record unreadable; skipped"), "{logs}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
}
