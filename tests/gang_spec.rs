//! Operation specs: the seed's examples parse as written, in YSON, JSON and YAML; every invalid case of DESIGN §4
//! is one violation naming its field; the job environment.

use lockstep::gang::model::{JobData, JobId};
use lockstep::gang::spec::MAX_FAILED_JOB_COUNT_DEFAULT;
use lockstep::gang::validate::update_violations;
use lockstep::gang::{FilePath, GangPlacement, OperationSpec, SpecError, SpecFormat, job_environment};
use lockstep::store::RowId;

/// The seed's first example ("Пример спецификации"), verbatim.
const MASTER_SLAVE: &str = r#"{
  tasks = {
    master = {
      job_count = 1;
      command = "python run_master.py < duties.dat";
      file_paths = ["//tmp/run_master.py"; "<file_name=duties.dat>//tmp/duties_180124.dat"];
    };
    slave = {
      job_count = 100;
      command = "python run_slave.py";
      file_paths = ["//tmp/run_slave.py"];
    };
  };
  max_failed_job_count = 1;
  stderr_table_path = "//tmp/stderrs";
}"#;

/// The seed's gang example ("Настройка Gang-операций"), verbatim.
const GANG_WORKER: &str = r#"{
  tasks = {
    worker = {
      job_count = 3;
      command = "python distributed_worker.py";
      gang_options = {};
    };
  };
}"#;

fn yson(text: &str) -> Result<OperationSpec, SpecError> {
    OperationSpec::parse(text, SpecFormat::Yson)
}

/// The violations of an invalid spec, as `field: rule` lines.
fn violations(text: &str) -> Vec<String> {
    match yson(text) {
        Ok(spec) => panic!("spec should be invalid: {spec:?}"),
        Err(error) => error.violations().iter().map(|v| v.to_string()).collect(),
    }
}

#[test]
fn the_seed_master_slave_example_parses_as_written() {
    let spec = yson(MASTER_SLAVE).unwrap();
    assert_eq!(spec.tasks.len(), 2);
    let master = &spec.tasks["master"];
    assert_eq!(master.job_count, 1);
    assert_eq!(master.command, "python run_master.py < duties.dat");
    assert_eq!(
        master.file_paths,
        vec![
            FilePath { path: "//tmp/run_master.py".into(), file_name: None },
            FilePath { path: "//tmp/duties_180124.dat".into(), file_name: Some("duties.dat".into()) },
        ]
    );
    assert_eq!(spec.tasks["slave"].job_count, 100);
    assert_eq!(spec.max_failed_job_count, 1);
    assert!(!spec.is_gang());
    assert_eq!(spec.unrecognized, vec!["stderr_table_path".to_string()]);
}

#[test]
fn the_seed_gang_example_parses_as_written() {
    let spec = yson(GANG_WORKER).unwrap();
    let worker = &spec.tasks["worker"];
    assert!(spec.is_gang());
    assert_eq!(worker.gang_size(), 3);
    assert_eq!(worker.reserved_count(), 0);
    assert_eq!(spec.max_failed_job_count, MAX_FAILED_JOB_COUNT_DEFAULT);
}

#[test]
fn json_and_yaml_give_the_same_spec_as_yson() {
    let json = r#"{
        "tasks": {
            "master": {
                "job_count": 1,
                "command": "python run_master.py < duties.dat",
                "file_paths": ["//tmp/run_master.py",
                               {"$attributes": {"file_name": "duties.dat"}, "$value": "//tmp/duties_180124.dat"}]
            },
            "slave": {"job_count": 100, "command": "python run_slave.py", "file_paths": ["//tmp/run_slave.py"]}
        },
        "max_failed_job_count": 1,
        "stderr_table_path": "//tmp/stderrs"
    }"#;
    let yaml = r#"
tasks:
  master:
    job_count: 1
    command: python run_master.py < duties.dat
    file_paths:
      - //tmp/run_master.py
      - <file_name=duties.dat>//tmp/duties_180124.dat
  slave:
    job_count: 100
    command: python run_slave.py
    file_paths: [//tmp/run_slave.py]
max_failed_job_count: 1
stderr_table_path: //tmp/stderrs
"#;
    let from_yson = yson(MASTER_SLAVE).unwrap();
    assert_eq!(OperationSpec::parse(json, SpecFormat::Json).unwrap(), from_yson);
    assert_eq!(OperationSpec::parse(yaml, SpecFormat::Yaml).unwrap(), from_yson);
}

#[test]
fn yson_attributes_on_a_path_node_are_file_names_too() {
    let spec = yson(r#"{tasks={t={job_count=1;command=c;file_paths=[<file_name="d.dat">"//tmp/x"]}}}"#).unwrap();
    assert_eq!(spec.tasks["t"].file_paths[0].sandbox_name(), "d.dat");
}

#[test]
fn gang_size_above_job_count_names_the_field_and_both_values() {
    let text = r#"{tasks={trainer={job_count=8;command="python train.py";gang_options={size=9}}}}"#;
    assert_eq!(violations(text), vec!["tasks.trainer.gang_options.size: 9 exceeds job_count 8"]);
}

#[test]
fn each_invalid_case_is_one_violation_naming_its_field() {
    let gang = r#"gang_options={}"#;
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{{tasks={{t={{job_count=2;command=c;{gang}}}}};fail_on_job_restart=%true}}"),
            "fail_on_job_restart: %true is not allowed in a gang operation (task \"t\" has gang_options)",
        ),
        (
            format!("{{tasks={{t={{job_count=2;command=c;{gang};fail_on_job_restart=%true}}}}}}"),
            "tasks.t.fail_on_job_restart: %true is not allowed in a gang operation (task \"t\" has gang_options)",
        ),
        (
            format!(
                "{{tasks={{t={{job_count=2;command=c;{gang}}};p={{job_count=1;command=c;fail_on_job_restart=%true}}}}}}"
            ),
            "tasks.p.fail_on_job_restart: %true is not allowed in a gang operation (task \"t\" has gang_options)",
        ),
        (
            format!("{{tasks={{t={{job_count=2;command=c;{gang}}}}};restart_completed_jobs=%true}}"),
            "restart_completed_jobs: %true is not allowed in a gang operation (task \"t\" has gang_options)",
        ),
        (
            format!("{{tasks={{t={{job_count=2;command=c;{gang};restart_completed_jobs=%true}}}}}}"),
            "tasks.t.restart_completed_jobs: %true is not allowed in a gang operation (task \"t\" has gang_options)",
        ),
        (
            format!("{{tasks={{t={{job_count=2;command=c;{gang};output_table_paths=[\"//tmp/out\"]}}}}}}"),
            "tasks.t.output_table_paths: output tables are not supported in a gang operation (task \"t\" has gang_options)",
        ),
        ("{tasks={t={job_count=0;command=c}}}".into(), "tasks.t.job_count: 0 is less than 1"),
        ("{tasks={t={job_count=-3;command=c}}}".into(), "tasks.t.job_count: -3 is less than 1"),
        (
            "{tasks={t={job_count=2;command=c;gang_options={size=0}}}}".into(),
            "tasks.t.gang_options.size: 0 is less than 1",
        ),
        ("{tasks={\"\"={job_count=1;command=c}}}".into(), "tasks.\"\": task name must not be empty"),
        (
            "{tasks={t={job_count=100001;command=c}}}".into(),
            "tasks: 100001 jobs in all tasks exceed the limit of 100000",
        ),
        ("{tasks={}}".into(), "tasks: must name at least one task"),
        ("{tasks={t={command=c}}}".into(), "tasks.t.job_count: required"),
        ("{tasks={t={job_count=1}}}".into(), "tasks.t.command: required"),
        (
            "{tasks={t={job_count=\"3\";command=c}}}".into(),
            "tasks.t.job_count: expected an integer, found string \"3\"",
        ),
        (
            "{tasks={t={job_count=1;command=c;gang_options=%true}}}".into(),
            "tasks.t.gang_options: expected a map, found boolean true",
        ),
        (
            "{tasks={t={job_count=1;command=c}};fail_on_job_restart=yes}".into(),
            "fail_on_job_restart: expected a boolean (%true or %false), found string \"yes\"",
        ),
        (
            "{tasks={t={job_count=1;command=c}};max_failed_job_count=-1}".into(),
            "max_failed_job_count: -1 is less than 0",
        ),
        (
            "{tasks={t={job_count=1;command=c;environment={A=1}}}}".into(),
            "tasks.t.environment.A: expected a string, found number 1",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(violations(&text), vec![expected.to_string()], "{text}");
    }
}

#[test]
fn more_than_a_hundred_tasks_is_one_violation() {
    let tasks: Vec<String> = (0..101).map(|i| format!("t{i}={{job_count=1;command=c}}")).collect();
    let text = format!("{{tasks={{{}}}}}", tasks.join(";"));
    assert_eq!(violations(&text), vec!["tasks: 101 tasks exceed the limit of 100"]);
    let tasks: Vec<String> = (0..100).map(|i| format!("t{i}={{job_count=1000;command=c}}")).collect();
    yson(&format!("{{tasks={{{}}}}}", tasks.join(";"))).unwrap();
}

#[test]
fn every_broken_rule_is_reported_at_once() {
    let text = r#"{
        tasks = {
            trainer = {job_count = 8; command = "t"; gang_options = {size = 9}; output_table_paths = ["//o"]};
            "" = {job_count = 0; command = "x"};
        };
        fail_on_job_restart = %true;
    }"#;
    let found = violations(text);
    assert_eq!(found.len(), 5, "{found:#?}");
    for field in [
        "fail_on_job_restart:",
        "tasks.\"\": task name",
        "tasks.\"\".job_count: 0",
        "tasks.trainer.gang_options.size: 9 exceeds job_count 8",
        "tasks.trainer.output_table_paths:",
    ] {
        assert!(found.iter().any(|v| v.starts_with(field)), "{field} missing from {found:#?}");
    }
}

#[test]
fn changing_job_count_of_a_running_gang_operation_is_refused() {
    let running = yson(GANG_WORKER).unwrap();
    let mut updated = running.clone();
    updated.tasks.get_mut("worker").unwrap().job_count = 4;
    let found: Vec<String> = update_violations(&running, &updated).iter().map(|v| v.to_string()).collect();
    assert_eq!(found, vec!["tasks.worker.job_count: cannot change from 3 to 4 in a running gang operation"]);
    let plain = yson(MASTER_SLAVE).unwrap();
    let mut more = plain.clone();
    more.tasks.get_mut("slave").unwrap().job_count = 120;
    assert!(update_violations(&plain, &more).is_empty());
}

#[test]
fn syntax_errors_give_the_format_line_and_column() {
    let error = OperationSpec::parse("{\n  tasks = {\n    t = {job_count = 1 command = c};\n  };\n}", SpecFormat::Yson);
    assert_eq!(
        error.unwrap_err().to_string(),
        "YSON syntax error at line 3, column 24: expected ';' or '}', found 'c'"
    );
    let error = OperationSpec::parse("{\"tasks\": {]}", SpecFormat::Json).unwrap_err();
    assert!(matches!(error, SpecError::Syntax { format: SpecFormat::Json, line: 1, column: 12, .. }), "{error}");
    let error = OperationSpec::parse("tasks:\n  t: [1\n", SpecFormat::Yaml).unwrap_err();
    assert!(matches!(error, SpecError::Syntax { format: SpecFormat::Yaml, .. }), "{error}");
}

fn job(task: &str, cookie: u32, rank: Option<u32>) -> JobData {
    JobData {
        id: JobId { operation: RowId(7), index: 12 },
        task: task.into(),
        job_cookie: cookie,
        gang_rank: rank,
        reserved: rank.is_none(),
        incarnation: 2,
        allocation: None,
        monitoring_descriptor: None,
        exit_code: None,
        reason: None,
    }
}

#[test]
fn the_job_environment_carries_the_yt_variables() {
    let spec = yson(
        r#"{tasks={
            trainer={job_count=3;command=c;gang_options={size=2};environment={MODE=train;YT_JOB_ID=mine}};
            eval={job_count=1;command=c};
        }}"#,
    )
    .unwrap();
    let env = job_environment(&spec, &job("trainer", 1, Some(1)));
    let expected = [
        ("MODE", "train"),
        ("YT_OPERATION_ID", "7"),
        ("YT_JOB_ID", "7-12"),
        ("YT_TASK_NAME", "trainer"),
        ("YT_JOB_COOKIE", "1"),
        ("YT_OPERATION_INCARNATION", "7-i2"),
        ("YT_GANG_RANK", "1"),
        ("YT_TASK_GANG_SIZE", "2"),
        ("YT_GANG_SIZE", "3"),
        ("YT_TASK_JOB_COUNT", "3"),
        ("YT_JOB_COUNT", "4"),
    ];
    let expected: std::collections::BTreeMap<String, String> =
        expected.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert_eq!(env, expected);

    let reserved = job_environment(&spec, &job("trainer", 2, None));
    assert!(!reserved.contains_key("YT_GANG_RANK"), "a reserved job has no rank");
    // A task without gang_options of a gang operation is a gang task for ranks and sizes (DESIGN §4): its rank
    // pool is its job_count, and YT_GANG_SIZE counts it.
    let eval = job_environment(&spec, &job("eval", 0, Some(0)));
    assert_eq!(eval["YT_TASK_GANG_SIZE"], "1");
    assert_eq!(eval["YT_GANG_RANK"], "0");
    assert_eq!(eval["YT_GANG_SIZE"], "3");
    assert_eq!(eval["YT_TASK_JOB_COUNT"], "1");
    assert_eq!(env_of(&spec, "trainer")["YT_GANG_SIZE"], "3");
}

fn env_of(spec: &lockstep::gang::OperationSpec, task: &str) -> std::collections::BTreeMap<String, String> {
    job_environment(spec, &job(task, 0, Some(0)))
}

#[test]
fn the_issue_example_a_size_two_task_and_a_task_without_gang_options_sum_to_gang_size_four() {
    // Issue 14: a (job_count 3, size 2) and b (job_count 2, no gang_options).
    let spec = yson("{tasks={a={job_count=3;command=c;gang_options={size=2}};b={job_count=2;command=c}}}").unwrap();
    for (task, rank) in [("a", Some(0)), ("a", Some(1)), ("a", None), ("b", Some(0)), ("b", Some(1))] {
        let env = job_environment(&spec, &job(task, rank.unwrap_or(2), rank));
        assert_eq!(env["YT_GANG_SIZE"], "4", "{task} {rank:?}");
        assert_eq!(env.get("YT_GANG_RANK"), rank.map(|r| r.to_string()).as_ref(), "{task} {rank:?}");
    }
    assert_eq!(env_of(&spec, "a")["YT_TASK_GANG_SIZE"], "2");
    assert_eq!(env_of(&spec, "b")["YT_TASK_GANG_SIZE"], "2");
    let plain = yson("{tasks={b={job_count=2;command=c}}}").unwrap();
    let env = job_environment(&plain, &job("b", 0, None));
    assert!(["YT_GANG_SIZE", "YT_TASK_GANG_SIZE", "YT_GANG_RANK"].iter().all(|k| !env.contains_key(*k)), "{env:?}");
}

#[test]
fn file_paths_that_leave_the_files_root_or_shadow_the_output_are_refused() {
    let spec = |files: &str| format!("{{tasks={{t={{job_count=1;command=c;file_paths=[{files}]}}}}}}");
    assert_eq!(
        violations(&spec(r#""//../../etc/passwd""#)),
        vec![r#"tasks.t.file_paths[0]: "//../../etc/passwd": must not have an empty, . or .. part"#]
    );
    assert_eq!(violations(&spec(r#""/tmp/x""#)), vec![r#"tasks.t.file_paths[0]: "/tmp/x": must start with //"#]);
    let named = |name: &str| spec(&format!(r#"<file_name={name}>"//tmp/x""#));
    for name in ["\"..\"", "stdout", "\"a/b\"", "\"\""] {
        let found = violations(&named(name));
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert!(found[0].contains("file_name"), "{name}: {found:?}");
    }
    yson(&named("duties.dat")).expect("a plain file name is fine");
}

#[test]
fn a_misspelt_gang_option_is_an_error_naming_it() {
    let text = r#"{tasks={t={job_count=3;command=c;gang_options={sise=2}}}}"#;
    assert_eq!(violations(text), vec!["tasks.t.gang_options.sise: is not a gang option (the only one is size)"]);
}

#[test]
fn gang_placement_is_lockstep_s_own_key_for_gang_operations_only() {
    let gang = |placement: &str| {
        format!("{{tasks={{t={{job_count=2;command=c;gang_options={{}}}}}};gang_placement={placement}}}")
    };
    assert_eq!(yson(&gang("all_or_nothing")).unwrap().gang_placement, Some(GangPlacement::AllOrNothing));
    assert_eq!(yson(&gang("incremental")).unwrap().gang_placement, Some(GangPlacement::Incremental));
    let spec = yson("{tasks={t={job_count=2;command=c;gang_options={}}}}").unwrap();
    assert_eq!(spec.gang_placement, None, "left out: the replica's default");
    assert!(spec.unknown_keys().is_empty());
    assert_eq!(
        violations(&gang("all-at-once")),
        vec![r#"gang_placement: "all-at-once" is not a gang placement: expected incremental or all_or_nothing"#]
    );
    assert_eq!(
        violations(&gang("%true")),
        vec!["gang_placement: expected a string (incremental or all_or_nothing), found boolean true"]
    );
    assert_eq!(
        violations("{tasks={t={job_count=2;command=c}};gang_placement=all_or_nothing}"),
        vec![
            "gang_placement: all_or_nothing needs a gang operation: no task has gang_options, so no job has a gang rank"
        ]
    );
    let json =
        r#"{"tasks": {"t": {"job_count": 2, "command": "c", "gang_options": {}}}, "gang_placement": "all_or_nothing"}"#;
    let spec = OperationSpec::parse(json, SpecFormat::Json).unwrap();
    assert_eq!(spec.gang_placement, Some(GangPlacement::AllOrNothing));
}

#[test]
fn a_spec_update_may_not_change_gang_placement() {
    let running = yson("{tasks={t={job_count=2;command=c;gang_options={}}}}").unwrap();
    let updated = yson("{tasks={t={job_count=2;command=c;gang_options={}}};gang_placement=all_or_nothing}").unwrap();
    let found: Vec<String> = update_violations(&running, &updated).iter().map(|v| v.to_string()).collect();
    assert_eq!(
        found,
        vec![
            "gang_placement: cannot change from (the replica's default) to all_or_nothing in a running operation: \
             its placement was fixed when it started"
        ]
    );
}

#[test]
fn max_node_loss_restart_count_is_lockstep_s_own_key_for_gang_operations_only() {
    let gang = |max: &str| {
        format!("{{tasks={{t={{job_count=2;command=c;gang_options={{}}}}}};max_node_loss_restart_count={max}}}")
    };
    let spec = yson(&gang("3")).unwrap();
    assert_eq!((spec.max_node_loss_restart_count, spec.node_loss_restarts_max()), (Some(3), 3));
    assert!(spec.unknown_keys().is_empty());
    let spec = yson("{tasks={t={job_count=2;command=c;gang_options={}}}}").unwrap();
    let default = lockstep::gang::spec::MAX_NODE_LOSS_RESTART_COUNT_DEFAULT;
    assert_eq!((spec.max_node_loss_restart_count, spec.node_loss_restarts_max()), (None, default));
    assert_eq!(violations(&gang("0")), vec!["max_node_loss_restart_count: 0 is less than 1"]);
    assert_eq!(
        violations("{tasks={t={job_count=2;command=c}};max_node_loss_restart_count=5}"),
        vec![
            "max_node_loss_restart_count: 5 needs a gang operation: no task has gang_options, so nothing restarts a gang"
        ]
    );
}
