//! The job environment (DESIGN §4; YTsaurus "Переменные окружения" of gang operations).

use super::model::{JobData, incarnation_id};
use super::spec::OperationSpec;
use std::collections::BTreeMap;

/// The environment of `job` of `spec`: the task's `environment`, then the `YT_*` variables, which win over a
/// task variable of the same name.
///
/// - every job: `YT_OPERATION_ID`, `YT_JOB_ID`, `YT_TASK_NAME`, `YT_JOB_COOKIE`, `YT_OPERATION_INCARNATION`,
///   `YT_TASK_JOB_COUNT` (this task's job_count), `YT_JOB_COUNT` (all tasks);
/// - jobs of a gang operation: `YT_GANG_SIZE` (gang sizes of all tasks) and `YT_TASK_GANG_SIZE` (this task's
///   gang size). In a gang operation every task is a gang task for ranks and sizes (DESIGN §4; YTsaurus
///   `TGangTask`, tests `test_gang_size_is_set*`): a task without `gang_options` has its `job_count` as gang size
///   ([`OperationSpec::task_gang_size`]);
/// - ranked jobs: `YT_GANG_RANK`. A reserved job has none, which is how its code knows it is reserved.
///
/// Panics if `job.task` is not a task of `spec` (a controller bug).
pub fn job_environment(spec: &OperationSpec, job: &JobData) -> BTreeMap<String, String> {
    job_environment_of(spec, job, incarnation_id(job.id.operation, job.incarnation))
}

/// [`job_environment`] with the id of the job's incarnation given (a controller pass formats it once for the
/// jobs it places). Numbers are written with `itoa`, not the formatting machinery.
pub(crate) fn job_environment_of(spec: &OperationSpec, job: &JobData, incarnation: String) -> BTreeMap<String, String> {
    let task = spec.tasks.get(&job.task).unwrap_or_else(|| panic!("job {} of unknown task {:?}", job.id, job.task));
    let mut env = task.environment.clone();
    let mut set = |name: &str, value: String| {
        env.insert(name.to_string(), value);
    };
    let number = |n: u64| itoa::Buffer::new().format(n).to_string();
    set("YT_OPERATION_ID", itoa::Buffer::new().format(job.id.operation.0).to_string());
    set("YT_JOB_ID", job.id.to_text());
    set("YT_TASK_NAME", job.task.clone());
    set("YT_JOB_COOKIE", number(job.job_cookie.into()));
    set("YT_OPERATION_INCARNATION", incarnation);
    set("YT_TASK_JOB_COUNT", number(task.job_count.into()));
    set("YT_JOB_COUNT", number(spec.job_count()));
    if spec.is_gang() {
        set("YT_GANG_SIZE", number(spec.gang_size()));
        set("YT_TASK_GANG_SIZE", number(spec.task_gang_size(task).into()));
    }
    if let Some(rank) = job.gang_rank {
        set("YT_GANG_RANK", number(rank.into()));
    }
    env
}
