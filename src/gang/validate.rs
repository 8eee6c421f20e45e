//! The rules a spec must keep (DESIGN §4 "Invalid"; YTsaurus "Gang-операции", "Ограничения и особенности"). Each
//! broken rule is one [`Violation`] naming its field, its value and the rule, so a user fixes them all at once.

use super::spec::{OperationSpec, Violation, field};

/// Most tasks in one operation (DESIGN §4).
pub const TASK_COUNT_MAX: usize = 100;
/// Most jobs over all tasks of one operation (DESIGN §4).
pub const JOB_COUNT_MAX: u64 = 100_000;

/// Every rule `spec` breaks, in a stable order (operation fields, then tasks by name).
pub fn violations(spec: &OperationSpec) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut fail = |field: String, rule: String| out.push(Violation { field, rule });
    if spec.tasks.is_empty() {
        fail("tasks".into(), "must name at least one task".into());
    }
    if spec.tasks.len() > TASK_COUNT_MAX {
        fail("tasks".into(), format!("{} tasks exceed the limit of {TASK_COUNT_MAX}", spec.tasks.len()));
    }
    let jobs = spec.job_count();
    if jobs > JOB_COUNT_MAX {
        fail("tasks".into(), format!("{jobs} jobs in all tasks exceed the limit of {JOB_COUNT_MAX}"));
    }
    let gang_task = spec.tasks.iter().find(|(_, t)| t.is_gang()).map(|(name, _)| name.clone());
    let in_gang = |what: &str| match &gang_task {
        Some(name) => format!("{what} in a gang operation (task {name:?} has gang_options)"),
        None => unreachable!("only called for a gang operation"),
    };
    if gang_task.is_some() && spec.fail_on_job_restart {
        fail("fail_on_job_restart".into(), in_gang("%true is not allowed"));
    }
    if gang_task.is_some() && spec.restart_completed_jobs {
        fail("restart_completed_jobs".into(), in_gang("%true is not allowed"));
    }
    if let (None, Some(placement)) = (&gang_task, spec.gang_placement) {
        fail(
            "gang_placement".into(),
            format!("{placement} needs a gang operation: no task has gang_options, so no job has a gang rank"),
        );
    }
    if let (None, Some(max)) = (&gang_task, spec.max_node_loss_restart_count) {
        fail(
            "max_node_loss_restart_count".into(),
            format!("{max} needs a gang operation: no task has gang_options, so nothing restarts a gang"),
        );
    }
    for (name, task) in &spec.tasks {
        let path = field("tasks", name);
        let at = |key: &str| field(&path, key);
        if name.is_empty() {
            fail(path.clone(), "task name must not be empty".into());
        }
        if name.chars().any(char::is_control) {
            // `status` prints task names as they are: a newline or a terminal escape would forge its lines.
            fail(path.clone(), "task name must not hold control characters (newlines, escapes)".into());
        }
        if task.job_count < 1 {
            fail(at("job_count"), format!("{} is less than 1", task.job_count));
        }
        if task.command.is_empty() {
            fail(at("command"), "must not be empty".into());
        }
        if let Some(size) = task.gang_options.as_ref().and_then(|g| g.size) {
            let size_field = field(&at("gang_options"), "size");
            if size < 1 {
                fail(size_field.clone(), format!("{size} is less than 1"));
            }
            if size > task.job_count {
                fail(size_field, format!("{size} exceeds job_count {}", task.job_count));
            }
        }
        if gang_task.is_some() {
            if task.fail_on_job_restart {
                fail(at("fail_on_job_restart"), in_gang("%true is not allowed"));
            }
            if task.restart_completed_jobs {
                fail(at("restart_completed_jobs"), in_gang("%true is not allowed"));
            }
            if !task.output_table_paths.is_empty() {
                fail(at("output_table_paths"), in_gang("output tables are not supported"));
            }
        }
    }
    out
}

/// The rules a spec update of a running operation must keep: every rule of a new spec, plus no change of
/// `job_count` in a gang operation (YTsaurus: "Изменение `job_count` во время выполнения Gang-операции
/// запрещено"). Tasks may not be added or removed while running either, and `gang_placement` may not change (the
/// operation's placement is fixed at its first pass).
pub fn update_violations(running: &OperationSpec, updated: &OperationSpec) -> Vec<Violation> {
    let mut out = violations(updated);
    for name in running.tasks.keys().filter(|name| !updated.tasks.contains_key(*name)) {
        out.push(Violation { field: field("tasks", name), rule: "cannot remove a task of a running operation".into() });
    }
    for name in updated.tasks.keys().filter(|name| !running.tasks.contains_key(*name)) {
        out.push(Violation { field: field("tasks", name), rule: "cannot add a task to a running operation".into() });
    }
    if running.gang_placement != updated.gang_placement {
        let show =
            |p: Option<super::spec::GangPlacement>| p.map_or("(the replica's default)".to_string(), |p| p.to_string());
        out.push(Violation {
            field: "gang_placement".into(),
            rule: format!(
                "cannot change from {} to {} in a running operation: its placement was fixed when it started",
                show(running.gang_placement),
                show(updated.gang_placement)
            ),
        });
    }
    if running.is_gang() || updated.is_gang() {
        for (name, old) in &running.tasks {
            let Some(new) = updated.tasks.get(name) else { continue };
            if old.job_count != new.job_count {
                out.push(Violation {
                    field: field(&field("tasks", name), "job_count"),
                    rule: format!(
                        "cannot change from {} to {} in a running gang operation",
                        old.job_count, new.job_count
                    ),
                });
            }
        }
    }
    out
}
