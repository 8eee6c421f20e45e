use super::model::{Group, Item, Kind, LeaseTtls, Model};
use super::*;
use std::time::Duration;

const ROWS: &str = "\
    0.000000 world      build          scenario=t seed=1 replicas=2
    0.000000 db         start          incarnation=1
    0.300000 replica-0  start          incarnation=1 clock_ppm=1000000
    1.000000 client     commit         insert 12 task
    1.100000 replica-0  commit         fetch tasks [12#5]
    2.000000 replica-0  commit         heartbeat [12#5]
    3.000000 replica-0  pause          span=18s
   10.000000 replica-1  commit         fetch tasks [12#9]
   10.500000 replica-1  commit         apply 12#9 applied related=[] inserted=[]
   20.000000 world      partition      Replica(1)<->Db span=5s
   21.000000 replica-0  resume
   21.000100 replica-0  commit         apply 12#5 stale related=[] inserted=[]
   22.000000 client     commit         insert 13 task
   22.100000 replica-0  commit         fetch tasks [13#10]
   25.000000 world      partition-end  Replica(1)<->Db
   26.000000 db         kill           down=2s
   28.000000 db         start          incarnation=2
   30.000000 replica-1  commit         fetch tasks [13#11]
   30.500000 replica-0  commit         apply 13#10 applied related=[] inserted=[]
   31.000000 replica-1  pause          span=20s
   32.000000 world      heal
";

fn lane(model: &Model, group: Group, key: &str) -> usize {
    model.lanes.iter().position(|lane| lane.group == group && lane.key == key).unwrap_or_else(|| panic!("{key}"))
}

fn items(model: &Model, lane: usize, kind: Kind) -> Vec<&Item> {
    model.items.iter().filter(|item| item.lane == lane && item.kind == kind).collect()
}

#[test]
fn nodes_get_lanes_in_order_with_their_faults_as_spans() {
    let model = Model::of_trace(ROWS, &LeaseTtls::default());
    let nodes: Vec<&str> =
        model.lanes.iter().filter(|lane| lane.group == Group::Node).map(|lane| lane.key.as_str()).collect();
    assert_eq!(nodes, ["world", "db", "client", "replica-0", "replica-1"]);
    let pause = items(&model, lane(&model, Group::Node, "replica-0"), Kind::Pause);
    assert_eq!((pause.len(), pause[0].start, pause[0].end), (1, 3_000_000, 21_000_000));
    assert_eq!((pause[0].line, pause[0].end_line), (6, Some(10)));
    // A partition shades both ends; the database is down from its kill to its next start.
    for node in ["replica-1", "db"] {
        let cut = items(&model, lane(&model, Group::Node, node), Kind::Partition);
        assert_eq!((cut.len(), cut[0].start, cut[0].end), (1, 20_000_000, 25_000_000), "{node}");
    }
    let down = items(&model, lane(&model, Group::Node, "db"), Kind::Down);
    assert_eq!((down.len(), down[0].start, down[0].end), (1, 26_000_000, 28_000_000));
    // The heal ends every fault still open.
    let pause = items(&model, lane(&model, Group::Node, "replica-1"), Kind::Pause);
    assert_eq!((pause[0].start, pause[0].end, pause[0].state.as_str()), (31_000_000, 32_000_000, "healed"));
    assert_eq!(model.end, 32_000_000);
}

#[test]
fn leases_show_holder_token_end_takeovers_and_stale_applies() {
    let model = Model::of_trace(ROWS, &LeaseTtls::default());
    let row = lane(&model, Group::Row, "12");
    assert_eq!(model.lanes[row].note, "task");
    let leases = items(&model, row, Kind::Lease);
    assert_eq!(leases.len(), 2);
    // Without a known ttl, the first lease lasts until the takeover.
    assert_eq!((leases[0].start, leases[0].end, leases[0].state.as_str()), (1_100_000, 10_000_000, "taken over"));
    assert!(leases[0].label.starts_with("#5 replica-0 (tasks"), "{}", leases[0].label);
    assert_eq!(leases[0].holder, Some(lane(&model, Group::Node, "replica-0")));
    assert_eq!((leases[1].end, leases[1].state.as_str()), (10_500_000, "applied"));
    let takeovers = items(&model, row, Kind::Takeover);
    assert_eq!((takeovers.len(), takeovers[0].start), (1, 10_000_000));
    let stale = items(&model, row, Kind::StaleApply);
    assert_eq!((stale.len(), stale[0].start), (1, 21_000_100));
    assert!(stale[0].label.contains("token 5 turned away; the latest is 9"), "{}", stale[0].label);
    assert!(items(&model, row, Kind::StaleWrite).is_empty());
    // An apply under a superseded token that took effect (the guard off) is a stale write.
    let written = items(&model, lane(&model, Group::Row, "13"), Kind::StaleWrite);
    assert_eq!((written.len(), written[0].start), (1, 30_500_000));
}

#[test]
fn a_known_ttl_ends_a_lease_at_its_expiry_after_the_last_renewal() {
    let ttls = LeaseTtls { default: Some(Duration::from_secs(6)), ..LeaseTtls::default() };
    let model = Model::of_trace(ROWS, &ttls);
    let leases = items(&model, lane(&model, Group::Row, "12"), Kind::Lease);
    // Renewed at 2 s: it expired at 8 s, before the takeover at 10 s.
    assert_eq!((leases[0].end, leases[0].state.as_str()), (8_000_000, "expired, then taken over"));
    assert!(leases[0].label.ends_with("until 8.000 s)"), "{}", leases[0].label);
}

const GANG: &str = "\
    1.329405 client     submit         op=11 name=gang-a attempts=1
    1.518174 replica-0  op-state       op=11 from=starting to=running reason=-
    1.518174 replica-0  incarnation    op=11 index=0 inc=11-i0 reason=operation_started
    1.518174 replica-0  job            op=11 job=11-0 task=worker cookie=0 rank=0 reserved=false inc=11-i0 alloc=- node=- from=- to=pending reason=-
    1.518174 replica-0  job            op=11 job=11-0 task=worker cookie=0 rank=0 reserved=false inc=11-i0 alloc=7.1 node=agent-1 from=pending to=assigned reason=-
    1.563023 agent-1    proc-start     op=11 job=11-0 alloc=7.1 inc=11-i0
   20.300000 world      partition      Agent(1)<->Db span=12s
   28.717356 agent-1    proc-kill      op=11 job=11-0 alloc=7.1 inc=11-i0
   30.523534 replica-1  node-lost      op=11 job=11-0 task=worker cookie=0 rank=0 reserved=false inc=11-i0 alloc=7.1 node=agent-1 from=running to=aborted reason=\"node lost\"
   30.523534 replica-1  incarnation    op=11 index=1 inc=11-i1 reason=job_aborted trigger=11-0 trigger_task=worker
   30.523534 replica-1  gang-wait      op=11 inc=11-i1 need=3 position=0 reserved_ahead=0 free=2 cluster_slots=4
   31.000000 replica-1  gang-placed    op=11 inc=11-i1 need=3 reused=2 waited_ms=477
   40.000000 replica-1  op-state       op=11 from=running to=completed reason=-
   40.000000 client     submit         op=31 name=plain attempts=1
";

#[test]
fn operations_show_incarnations_and_allocations_show_jobs_and_processes() {
    let model = Model::of_trace(GANG, &LeaseTtls::default());
    let op = lane(&model, Group::Operation, "11");
    assert_eq!(model.lanes[op].note, "gang-a");
    let incarnations = items(&model, op, Kind::Incarnation);
    assert_eq!(incarnations.len(), 2);
    assert_eq!((incarnations[0].start, incarnations[0].end), (1_518_174, 30_523_534));
    assert_eq!(incarnations[1].label, "incarnation 1: job_aborted (trigger job 11-0)");
    assert_eq!((incarnations[1].end, incarnations[1].state.as_str()), (40_000_000, "completed"));
    let wait = items(&model, op, Kind::GangWait);
    assert_eq!((wait[0].start, wait[0].end, wait[0].label.as_str()), (30_523_534, 31_000_000, "waiting for 3 slots"));

    let alloc = lane(&model, Group::Allocation, "7.1");
    assert_eq!(model.lanes[alloc].note, "agent-1");
    assert!(model.lanes[alloc].ops.contains(&11));
    let jobs = items(&model, alloc, Kind::Job);
    assert_eq!((jobs.len(), jobs[0].start, jobs[0].end), (1, 1_518_174, 30_523_534));
    assert_eq!(jobs[0].state, "aborted: node lost");
    assert_eq!(jobs[0].label, "job 11-0 worker rank 0 (11-i0)");
    let processes = items(&model, alloc, Kind::Process);
    assert_eq!((processes[0].start, processes[0].end, processes[0].state.as_str()), (1_563_023, 28_717_356, "killed"));
    // The agent's lane shows its partition from the database.
    let cut = items(&model, lane(&model, Group::Node, "agent-1"), Kind::Partition);
    assert_eq!(cut[0].label, "cut from db");
    // Lanes: operations in id order, the second one with no incarnation yet.
    let ops: Vec<&str> =
        model.lanes.iter().filter(|lane| lane.group == Group::Operation).map(|lane| lane.key.as_str()).collect();
    assert_eq!(ops, ["11", "31"]);
}

#[test]
fn a_violation_names_its_rows_jobs_and_moment() {
    let message = "commit 767 `1700000035.602961 by replica-0: apply 67#111 applied related=[] inserted=[]`: row 67 \
                   written with token 111, but its latest token is 154 (current), handed out by commit 766 \
                   `1700000035.602486 by replica-0: fetch claims-1 [67#154]`";
    let named = Named::of(message);
    assert_eq!(named.rows, [67]);
    assert_eq!(named.moment(message, ""), Some(35_602_961));

    let message = "1 second live processes of one gang rank: operation 11 task worker rank 0: job 11-3 (incarnation \
                   11-i1) started on agent-4 in allocation 10.1 at 29s while job 11-0 (incarnation 11-i0) runs on \
                   agent-1 in allocation 7.1";
    let named = Named::of(message);
    assert_eq!((named.ops.as_slice(), named.jobs.as_slice()), (&[11][..], &["11-3".to_string(), "11-0".into()][..]));
    let trace = "   30.573430 agent-4    proc-start     op=11 job=11-3 alloc=10.1 inc=11-i1\n";
    assert_eq!(named.moment(message, trace), Some(30_573_430));
    // Without a process line, the operation's last line.
    assert_eq!(named.moment(message, GANG), Some(40_000_000));
    let named = Named::of("row 12: pipeline tasks took effect 2 times");
    assert_eq!(named.moment("row 12: pipeline tasks took effect 2 times", ROWS), Some(21_000_100));
    assert_eq!(Named::of("nothing named").moment("nothing named", ROWS), None);
}

#[test]
fn the_page_is_self_contained_and_carries_the_trace_safely() {
    let trace = format!("{ROWS}   31.000000 client     note           text=\"</script><script>alert(1)</script>\"\n");
    let verdicts = Verdicts {
        checkers: vec![
            ("lease_exclusivity".into(), vec!["row 12 written with token 5".into()]),
            ("liveness".into(), vec![]),
        ],
        panic: None,
    };
    let context = Context { title: "t <1>".into(), verdicts: Some(verdicts), ..Context::default() };
    let page = html(&trace, &context);
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("<title>t &lt;1&gt;</title>"));
    // One closing script tag per script element: the data's and the page's (none from the trace).
    assert_eq!(page.matches("</script>").count(), 2, "the trace's text closed a script element");
    for external in ["src=\"http", "href=\"http", "url(http", "@import", "<link rel=\"stylesheet"] {
        assert!(!page.contains(external), "the page loads {external}");
    }
    assert!(page.contains("default-src 'none'"), "the page must forbid every fetch");
    let start = page.find("type=\"application/json\">").unwrap() + "type=\"application/json\">".len();
    let json = &page[start..start + page[start..].find("</script>").unwrap()];
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(data["trace"].as_str(), Some(trace.as_str()));
    assert_eq!(data["verdict"], "failed");
    assert_eq!(data["checkers"][0]["rows"], serde_json::json!([12]));
    assert_eq!(data["checkers"][0]["at"], 21_000_100);
    assert_eq!(data["checkers"][1]["ok"], true);
    assert!(data["lanes"].as_array().unwrap().iter().any(|lane| lane["group"] == "row" && lane["key"] == "12"));
    // Same trace and context, same page (no wall time, no build id).
    assert_eq!(page, html(&trace, &context));
}
