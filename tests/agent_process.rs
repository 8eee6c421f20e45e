//! The OS executor: `sh -c COMMAND` in a sandbox, environment set per variable, stdout and stderr captured,
//! exit codes, process-group kills, files from `file_paths`. Real processes, real time (each test is short).
#![cfg(not(madsim))]

use lockstep::agent::process::OsExecutor;
use lockstep::agent::{Executor, ExitStatus, ProcessHandle, StartRequest};
use lockstep::gang::FilePath;
use lockstep::gang::model::{AllocationRef, JobId, JobLaunch};
use lockstep::store::RowId;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// A fresh directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lockstep-agent-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
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
    let executor = OsExecutor::new(&dir.0, None);
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
    let executor = OsExecutor::new(&dir.0, None);
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
    let executor = OsExecutor::new(dir.0.join("sandboxes"), Some(root));
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
    let executor = OsExecutor::new(&dir.0, Some(dir.0.join("cypress")));
    let files = vec![FilePath { path: "//tmp/absent".into(), file_name: None }];
    let error = executor.start(request("true", &[], files)).await.unwrap_err();
    assert!(error.to_string().contains("cannot copy"), "{error}");
}
