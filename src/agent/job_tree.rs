//! A job's process tree, found and ended as a whole (DESIGN §4: a job's whole process tree ends with it, on exit,
//! abort, fence and agent death), and the records by which a later agent ends the trees an earlier one left. Linux
//! (`/proc`); not in simulator builds.
//!
//! A job's processes are every process that is
//! - in the job's **session**: the job's shell is a session leader (`setsid`), so its session id is the shell's pid
//!   and every process it starts stays in that session unless it calls `setsid` itself; or
//! - carrying the job's **marker**, `LOCKSTEP_JOB=<marker>` in the environment it was started with
//!   (`/proc/PID/environ`), which every process inherits unless it is started with a cleared environment.
//!
//! Only a process that does both (leaves the session *and* drops the marker, as a deliberate daemon does) escapes;
//! a cgroup or a PID namespace per job would catch it too, but needs privileges or delegation an agent cannot count
//! on (docs/real-mode.md). Each rule is guarded against pid reuse: a process counts only if it started no earlier
//! than the job's shell (start times in clock ticks since boot, `/proc/PID/stat` field 22), and the session rule
//! only while the pid of the shell is not held by a different process (a pid stays allocated while any process
//! uses it as its session id, so a shell pid taken by another process means the job's session has ended).
//!
//! Ending a tree: SIGKILL every process found, look again, until a look finds none (zombies are dead: their parent
//! or init reaps them), at most [`END_ROUNDS_MAX`] rounds.
//!
//! **A record is a claim, checked before it is acted on** ([`JobTree::verified`]). A tree read from a job record
//! (an earlier agent's, or one planted in the work dir, or one from before a reboot, when pids and start times
//! begin again) is trusted only as far as the marker bears it out: every process it kills carries the job's marker,
//! and its leader's session and process group count only when the leader itself still carries the marker, or, once
//! it has died, when a process of its session does. The marker is the check rather than the recorded start time
//! because anyone can read any process's pid and start time (`/proc/PID/stat` is world-readable, and after a reboot
//! an unrelated process may get the same pid at the same tick), while the marker is in the environment the agent
//! gave the job's shell at exec, unique to the agent's run and the job, inherited only by the job's own processes,
//! and readable (`/proc/PID/environ`) only by the process's own user.

use super::work_dir::DirHandle;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use tokio::time::Duration;

/// The environment variable that marks a job's processes (docs/real-mode.md, "What a job sees").
pub const JOB_MARKER_VAR: &str = "LOCKSTEP_JOB";

/// Most kill-and-look rounds of [`JobTree::end`]; a tree still alive after them is reported as an error. A round
/// normally finds nothing left after the first kill: processes die within microseconds of SIGKILL unless they are
/// in an uninterruptible wait (a hung disk or NFS).
pub const END_ROUNDS_MAX: u32 = 500;
/// Pause between rounds, local clock: with [`END_ROUNDS_MAX`], a tree gets 5 s to die.
pub const END_ROUND_PAUSE: Duration = Duration::from_millis(10);

/// The shell a job's tree hangs from: its pid (also the job's session and process group id) and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leader {
    /// Its pid.
    pub pid: i32,
    /// When it started, in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
}

impl Leader {
    /// The leader `pid`, if it is alive (or an unreaped zombie), with its start time read from `/proc`.
    pub fn read(pid: i32) -> Option<Leader> {
        ProcStat::read(pid).map(|stat| Leader { pid, start_ticks: stat.start_ticks })
    }
}

/// What identifies a job's processes (module docs).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobTree {
    /// The value of [`JOB_MARKER_VAR`] in the job's environment.
    pub marker: String,
    /// The job's shell, once spawned and read.
    pub leader: Option<Leader>,
}

/// A tree that outlived [`END_ROUNDS_MAX`] rounds of SIGKILL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("job {marker}: processes {alive:?} still alive after {rounds} rounds of SIGKILL")]
pub struct TreeAlive {
    /// The job's marker.
    pub marker: String,
    /// Pids found in the last round.
    pub alive: Vec<i32>,
    /// Rounds tried.
    pub rounds: u32,
}

impl JobTree {
    /// SIGKILLs every process of the tree until none is left (module docs). Returns how many distinct processes it
    /// found alive and signalled (by the group kill or one by one). Errors: the tree is still alive after [`END_ROUNDS_MAX`] rounds. The `/proc` scans run on the
    /// blocking pool, the pauses on the runtime's clock.
    pub async fn end(&self) -> Result<usize, TreeAlive> {
        let mut signalled = BTreeSet::new();
        let mut alive = Vec::new();
        // Counted before the group kill, which ends most of them: the count says how many processes the tree had.
        let tree = self.clone();
        if let Ok(members) = tokio::task::spawn_blocking(move || tree.members()).await {
            signalled.extend(members);
        }
        // The job's process group first: its shell's group holds what `/proc` would find in most trees, and is the
        // only handle where there is no `/proc` to scan.
        if let Some(leader) = self.session_leader() {
            // SAFETY: killpg only sends a signal; a group that is gone fails with ESRCH, harmlessly.
            unsafe {
                libc::killpg(leader.pid, libc::SIGKILL);
            }
        }
        for _ in 0..END_ROUNDS_MAX {
            let tree = self.clone();
            match tokio::task::spawn_blocking(move || tree.members()).await {
                Ok(members) if members.is_empty() => return Ok(signalled.len()),
                Ok(members) => alive = members,
                // The scan cannot panic short of a bug; a runtime shutting down cancels it. Look again next round.
                Err(error) => {
                    tracing::warn!(marker = %self.marker, %error, "process scan failed");
                    alive.clear();
                }
            }
            for pid in &alive {
                // SAFETY: kill only sends a signal; a pid that died since the scan fails with ESRCH, harmlessly.
                unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                }
                signalled.insert(*pid);
            }
            tokio::time::sleep(END_ROUND_PAUSE).await;
        }
        Err(TreeAlive { marker: self.marker.clone(), alive, rounds: END_ROUNDS_MAX })
    }

    /// The live (not zombie) processes of the tree now, in pid order, never the calling process.
    pub fn members(&self) -> Vec<i32> {
        let session = self.session_leader();
        let me = i32::try_from(std::process::id()).unwrap_or(-1);
        let mut members: Vec<i32> = proc_pids()
            .into_iter()
            .filter(|pid| *pid != me)
            .filter(|pid| {
                let Some(stat) = ProcStat::read(*pid) else { return false };
                if stat.is_dead() || self.leader.is_some_and(|leader| stat.start_ticks < leader.start_ticks) {
                    return false;
                }
                session.is_some_and(|leader| stat.session == leader.pid) || self.marked(*pid)
            })
            .collect();
        members.sort_unstable();
        members
    }

    /// The tree a record describes, as far as `/proc` bears it out (module docs): the leader is kept only while it
    /// runs with its recorded start time and carries the marker, or, once its pid is held by no live process, while a
    /// process of its session that started no earlier carries the marker; otherwise only marked processes are the
    /// tree's. A record with an empty marker names no process.
    pub fn verified(&self) -> JobTree {
        let leader = self.leader.filter(|leader| !self.marker.is_empty() && self.leader_is_the_jobs(*leader));
        JobTree { marker: self.marker.clone(), leader }
    }

    /// Whether `leader` (from a record) still stands for the job (see [`JobTree::verified`]). Blocking.
    fn leader_is_the_jobs(&self, leader: Leader) -> bool {
        match ProcStat::read(leader.pid) {
            Some(stat) if !stat.is_dead() => stat.start_ticks == leader.start_ticks && self.marked(leader.pid),
            // Gone or a zombie: its session (kept while any member lives) is the job's only if a member is marked.
            _ => proc_pids().into_iter().any(|pid| {
                ProcStat::read(pid).is_some_and(|stat| {
                    !stat.is_dead() && stat.session == leader.pid && stat.start_ticks >= leader.start_ticks
                }) && self.marked(pid)
            }),
        }
    }

    /// The leader, while its pid (the job's session and process group id) still stands for the job: not held by a
    /// different process (then the job's session has ended and the id may be reused).
    fn session_leader(&self) -> Option<Leader> {
        self.leader
            .filter(|leader| ProcStat::read(leader.pid).is_none_or(|stat| stat.start_ticks == leader.start_ticks))
    }

    /// Whether process `pid` was started with this tree's marker in its environment (false if unreadable: another
    /// user's process, or gone; false for an empty marker, which no job has).
    fn marked(&self, pid: i32) -> bool {
        if self.marker.is_empty() {
            return false;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
        let wanted = marker_entry(&self.marker);
        environ.split(|byte| *byte == 0).any(|entry| entry == wanted.as_bytes())
    }
}

/// The pids in `/proc` now (none, with a warning, if it cannot be listed: then only a process group kill ends a
/// tree).
fn proc_pids() -> Vec<i32> {
    match std::fs::read_dir("/proc") {
        Ok(entries) => entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok()).collect(),
        Err(error) => {
            tracing::warn!(%error, "cannot list /proc");
            Vec::new()
        }
    }
}

/// `LOCKSTEP_JOB=<marker>`, as it appears in an environment block.
fn marker_entry(marker: &str) -> String {
    format!("{JOB_MARKER_VAR}={marker}")
}

/// The fields of `/proc/PID/stat` the tree needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcStat {
    state: u8,
    session: i32,
    start_ticks: u64,
}

impl ProcStat {
    fn read(pid: i32) -> Option<ProcStat> {
        ProcStat::parse(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Parses a stat line: `pid (comm) state ppid pgrp session ... starttime ...`. The command name may hold spaces
    /// and parentheses, so fields are counted after its last `)`.
    fn parse(line: &[u8]) -> Option<ProcStat> {
        let close = line.iter().rposition(|byte| *byte == b')')?;
        let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields 3.. of the man page (proc_pid_stat(5)) are fields[0..]: state 3, session 6, starttime 22.
        Some(ProcStat {
            state: *fields.first()?.as_bytes().first()?,
            session: fields.get(3)?.parse().ok()?,
            start_ticks: fields.get(19)?.parse().ok()?,
        })
    }

    /// A zombie (`Z`) or dead (`X`) process: it runs nothing any more.
    fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X')
    }
}

/// What [`JobRecords::read_all`] found: the records by job, and the unreadable ones by path with the reason.
type RecordsRead = (Vec<(String, JobTree)>, Vec<(String, String)>);

/// The job records of a work dir (`WORK_DIR/.lockstep/jobs/{job id}`, JSON [`JobTree`]s): one per job whose tree
/// may be alive, written before the job is spawned and removed once its tree is confirmed dead, so that a later
/// agent on the same work dir can end what an agent killed with SIGKILL left ([`JobRecords::end_leftovers`]). The
/// directory is held by descriptor and no record is read or written through a symbolic link
/// ([`super::work_dir`]).
#[derive(Clone, Debug)]
pub struct JobRecords {
    dir: Arc<DirHandle>,
}

impl JobRecords {
    /// The records in the directory `dir`, held open.
    pub fn new(dir: DirHandle) -> JobRecords {
        JobRecords { dir: Arc::new(dir) }
    }

    /// The records in the existing directory at `path`, which must not be a symbolic link. Blocking.
    pub fn open(path: &Path) -> std::io::Result<JobRecords> {
        DirHandle::open(path).map(JobRecords::new)
    }

    /// Writes (or replaces, atomically) the record of `job`. Blocking.
    pub fn write(&self, job: &str, tree: &JobTree) -> std::io::Result<()> {
        use std::io::Write;
        let text = serde_json::to_vec(tree).expect("a job tree serializes");
        let temporary = format!(".{job}.tmp");
        self.dir.create_file(&temporary, 0o600)?.write_all(&text)?;
        self.dir.rename(&temporary, job)
    }

    /// Removes the record of `job` (absent is fine). Blocking.
    pub fn remove(&self, job: &str) -> std::io::Result<()> {
        match self.dir.remove_file(job) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// Every record, by job, and the unreadable ones (a symbolic link among them), by path with the reason, which
    /// stay in place. Blocking.
    fn read_all(&self) -> std::io::Result<RecordsRead> {
        let (mut records, mut unreadable) = (Vec::new(), Vec::new());
        for job in self.dir.names()? {
            if job.starts_with('.') {
                continue;
            }
            match self.dir.read_file(&job).map(|text| serde_json::from_slice::<JobTree>(&text)) {
                Ok(Ok(tree)) => records.push((job, tree)),
                Ok(Err(error)) => {
                    unreadable.push((self.dir.path().join(&job).display().to_string(), error.to_string()))
                }
                Err(error) => unreadable.push((self.dir.path().join(&job).display().to_string(), error.to_string())),
            }
        }
        records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((records, unreadable))
    }

    /// Ends the tree of every recorded job, as far as `/proc` bears the record out ([`JobTree::verified`]), and
    /// removes its record (unreadable records are logged and left in place): what an earlier agent on this work dir left when it died without ending its jobs
    /// (SIGKILL, OOM kill, a crash). Returns (jobs, processes signalled).
    /// Errors: the directory cannot be read, or a tree outlived [`JobTree::end`] (its record stays).
    pub async fn end_leftovers(&self) -> Result<(usize, usize), String> {
        let records = self.clone();
        let (records, unreadable) = tokio::task::spawn_blocking(move || {
            let (read, unreadable) = records.read_all()?;
            let verified: Vec<_> = read.into_iter().map(|(job, tree)| (job, tree.verified())).collect();
            Ok::<_, std::io::Error>((verified, unreadable))
        })
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| format!("cannot read {}: {error}", self.dir().display()))?;
        for (record, error) in unreadable {
            tracing::warn!(%record, %error, "job record unreadable; skipped");
        }
        let mut signalled = 0;
        for (job, tree) in &records {
            signalled += tree.end().await.map_err(|error| error.to_string())?;
            let (records, job) = (self.clone(), job.clone());
            tokio::task::spawn_blocking(move || records.remove(&job))
                .await
                .map_err(|error| error.to_string())?
                .map_err(|error| format!("cannot remove a job record in {}: {error}", self.dir().display()))?;
        }
        Ok((records.len(), signalled))
    }

    /// The directory's path.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_parsed_after_the_last_parenthesis_of_the_command_name() {
        let line = b"4242 (a (weird) name) S 1 4240 4239 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let stat = ProcStat::parse(line).unwrap();
        assert_eq!(stat, ProcStat { state: b'S', session: 4239, start_ticks: 987654 });
        assert!(!stat.is_dead());
        assert!(ProcStat::parse(b"4242 (x) Z 1 2 3").is_none(), "too short: no start time");
    }

    #[test]
    fn a_tree_without_a_leader_is_the_processes_with_its_marker() {
        let tree = JobTree { marker: "no such marker".into(), leader: None };
        assert!(tree.members().is_empty());
    }
}
