//! Processes of the tests that start real jobs: finding a job's `sleep`s by their argument, telling a dead process
//! from a live one, and killing what a failing test leaves behind. Read from `/proc` (Linux).

/// Whether `pid` is gone: no such process, or a zombie waiting to be reaped.
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Live (not zombie) `sleep` processes whose one argument is `marker`: the sleeps themselves, not the shells (or
/// their forked subshells) whose `-c` text names every marker of the job, which would count a sleep as started
/// before its shell forked it.
pub fn alive_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline);
        let args: Vec<&str> = cmdline.split('\0').filter(|arg| !arg.is_empty()).collect();
        let is_sleep =
            matches!(args.as_slice(), [program, argument] if program.ends_with("sleep") && *argument == marker);
        if is_sleep && !process_gone(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Kills (SIGKILL) every live process of the given markers when dropped, so a failing test leaves none behind.
pub struct Reaper(pub Vec<String>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.0.iter().flat_map(|m| alive_with(m)) {
            // SAFETY: kill only sends a signal, to a `sleep` this test's job started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}
