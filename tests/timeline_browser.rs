//! The timeline page in a real browser: Debian's Chromium, headless, driven over WebDriver by
//! chromedriver. It opens `tests/fixtures/timeline-planted.html`, the page the simulator writes for the planted
//! failure `tests/fixtures/timeline-planted.toml` (seed 1; `tests/sim_timeline.rs` checks that the file is what
//! the simulator makes today, and rewrites it on request), and checks that it loads with no console error and
//! no request, that its lanes and the violation's marker are there, that hovering an item shows its trace line,
//! that a violation's button moves the view to its moment, and that filtering by an operation hides the
//! others' lanes. It writes a screenshot to `target/timeline-browser/timeline.png` (and, with
//! `LOCKSTEP_UPDATE_SCREENSHOT=1`, to `docs/timeline.png`, which the README and docs/simulator.md show).
//!
//! Needs `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`; `scripts/test`
//! installs them when it runs as root). `LOCKSTEP_CHROMIUM` and `LOCKSTEP_CHROMEDRIVER` name other binaries.
//! Chromium runs with its background networking, component updates and sync off and a fresh profile: on a
//! closed network it would otherwise hang at start.
#![cfg(not(madsim))]

use crate::support;

use support::command::clean_command;

use fantoccini::actions::{InputSource, MouseActions, PointerAction};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// How long chromedriver may take to say it listens, and the page to say it is ready.
const START_BOUND: Duration = Duration::from_secs(30);

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn binary(variable: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.is_file(),
        "{} not found ({variable} to name another): install Debian's chromium and chromium-driver \
         (`apt-get install -y chromium chromium-driver`; scripts/test does it when run as root)",
        path.display()
    );
    path
}

/// chromedriver on a free loopback port, killed when dropped. Its temporary files, and those of the Chromium it
/// starts (Chromium leaves an `org.chromium.Chromium.scoped_dir.*` behind in the temp dir), go to `tmp`, which the
/// test removes: a run leaves nothing in `/tmp`.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(tmp: &Path) -> Driver {
        let path = binary("LOCKSTEP_CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut child = clean_command(path)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .env("TMPDIR", tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        // chromedriver says on stdout when it listens; read until then (bounded by the reader thread's deadline).
        let stdout = child.stdout.take().expect("piped stdout");
        let (said, heard) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("started successfully") {
                    let _ = said.send(());
                }
            }
        });
        heard.recv_timeout(START_BOUND).expect("chromedriver says it started within the bound");
        Driver { child, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `POST /session/{id}/se/log {"type": "browser"}`: chromedriver's console log of the page (what
/// `goog:loggingPrefs` asked it to keep). Not in W3C WebDriver, so a command of our own.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({"type": "browser"}).to_string()))
    }
}

async fn connect(driver: &Driver, profile: &Path) -> Client {
    let chromium = binary("LOCKSTEP_CHROMIUM", "/usr/bin/chromium");
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        &format!("--user-data-dir={}", profile.display()),
    ];
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": chromium, "args": args },
        "goog:loggingPrefs": { "browser": "ALL" },
    });
    let Value::Object(capabilities) = capabilities else { unreachable!("an object") };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(capabilities).connect(&driver.url).await.expect("a WebDriver session")
}

async fn script(client: &Client, body: &str) -> Value {
    client.execute(body, vec![]).await.unwrap_or_else(|error| panic!("{body}: {error}"))
}

/// The lane labels on the page: `(group, key, ops)` of each `.lane-label`.
async fn lane_labels(client: &Client) -> Vec<(String, String, String)> {
    let labels = script(
        client,
        "return Array.from(document.querySelectorAll('.lane-label'))
            .map(l => [l.dataset.group, l.dataset.key, l.dataset.ops]);",
    )
    .await;
    serde_json::from_value(labels).expect("label triples")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_of_a_planted_failure_loads_shows_its_lanes_and_violation_and_filters_by_operation() {
    let page = manifest().join("tests/fixtures/timeline-planted.html");
    assert!(page.is_file(), "{} is missing: run tests/sim_timeline.rs to write it", page.display());
    let out = manifest().join("target/timeline-browser");
    let profile = out.join(format!("profile-{}", std::process::id()));
    let tmp = out.join(format!("tmp-{}", std::process::id()));
    for dir in [&profile, &tmp] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("a profile and a temp directory");
    }
    let driver = Driver::start(&tmp);
    let client = connect(&driver, &profile).await;
    // While it runs, Chromium keeps a scoped dir in its temp dir; one killed mid-way leaves it behind.
    let used_tmp = std::fs::read_dir(&tmp).map(|entries| entries.count()).unwrap_or(0);
    // A failed check must still end the session: chromedriver's Chromium outlives a killed chromedriver.
    let checked = std::panic::AssertUnwindSafe(check_page(&client, &page, &out)).catch_unwind().await;
    let closed = client.close().await;
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
    let _ = std::fs::remove_dir_all(&tmp);
    match checked {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(checked) => checked.unwrap_or_else(|error| panic!("{error}")),
    }
    closed.expect("the session closes");
    // Chromium honoured TMPDIR: its scoped dir was made in the test's own temp dir (removed above), not in /tmp.
    assert!(used_tmp > 0, "Chromium made nothing in {}: its temporary files went elsewhere", tmp.display());
}

async fn check_page(client: &Client, page: &Path, out: &Path) -> Result<(), String> {
    let url = url::Url::from_file_path(page).expect("an absolute path");
    client.goto(url.as_str()).await.map_err(|e| format!("goto: {e}"))?;
    let ready = client.wait().at_most(START_BOUND).for_element(Locator::Css("body[data-ready=\"true\"]")).await;
    ready.map_err(|error| format!("the page never said it was ready: {error}"))?;

    // Loaded with nothing else: no request (every script and style inline) and no console error.
    let requests = script(client, "return performance.getEntriesByType('resource').map(r => r.name);").await;
    assert_eq!(requests, json!([]), "the page requested something");
    let log = client.issue_cmd(BrowserLog).await.map_err(|e| format!("the browser log: {e}"))?;
    let errors: Vec<&Value> = log.as_array().into_iter().flatten().filter(|entry| entry["level"] == "SEVERE").collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    assert_eq!(script(client, "return document.getElementById('page-error').hidden;").await, json!(true));

    // The lanes: every node, both operations, their allocations and the rows.
    let labels = lane_labels(client).await;
    let keys = |group: &str| -> Vec<String> {
        labels.iter().filter(|(g, _, _)| g == group).map(|(_, key, _)| key.clone()).collect()
    };
    for node in ["world", "db", "client", "replica-0", "replica-1", "agent-0", "agent-1", "agent-2"] {
        assert!(keys("node").contains(&node.to_string()), "no lane for {node}: {labels:?}");
    }
    let operations = keys("operation");
    assert_eq!(operations.len(), 2, "{labels:?}");
    assert!(!keys("allocation").is_empty(), "{labels:?}");
    assert!(!keys("row").is_empty(), "{labels:?}");

    // The violation: its checker failed, its marker sits on the time axis.
    let verdict = client.find(Locator::Css("#verdict")).await.map_err(|e| format!("#verdict: {e}"))?;
    assert_eq!(verdict.text().await.map_err(|e| e.to_string())?, "FAILED");
    let marker = client
        .find(Locator::Css(".violation-marker[data-checker=\"gang_ranks_together\"]"))
        .await
        .map_err(|error| format!("no violation marker: {error}"))?;
    assert!(marker.is_displayed().await.map_err(|e| e.to_string())?, "the marker is hidden");
    let png = client.screenshot().await.map_err(|e| format!("screenshot: {e}"))?;
    write_screenshot(&png, out);

    // Hover: the pointer on an incarnation shows the trace line it starts at.
    let at = script(client, "return window.lockstepTimeline.locate('incarnation');").await;
    let (x, y) = (at["x"].as_f64().expect("an item in view"), at["y"].as_f64().expect("its y"));
    let mouse = MouseActions::new("mouse".into()).then(PointerAction::MoveTo { duration: None, x, y });
    client.perform_actions(mouse).await.map_err(|e| format!("hover: {e}"))?;
    let tooltip =
        script(client, "const t = document.getElementById('tooltip'); return [t.hidden, t.textContent];").await;
    assert_eq!(tooltip[0], json!(false), "no tooltip: {tooltip}");
    let text = tooltip[1].as_str().unwrap_or_default();
    assert!(text.contains(" incarnation ") && text.contains("reason=operation_started"), "{text}");

    // The violation's button: the view moves to its moment.
    let show = client
        .find(Locator::Css("li[data-checker=\"gang_ranks_together\"] .show-violation"))
        .await
        .map_err(|error| format!("no show button: {error}"))?;
    show.click().await.map_err(|e| format!("show: {e}"))?;
    let view = script(client, "return [window.lockstepTimeline.view(), window.lockstepTimeline.moment(0)];").await;
    let (t0, t1, moment) = (view[0]["t0"].as_f64(), view[0]["t1"].as_f64(), view[1].as_f64());
    let (t0, t1, moment) = (t0.unwrap_or(f64::NAN), t1.unwrap_or(f64::NAN), moment.expect("the violation's moment"));
    assert!(t0 < moment && moment < t1, "the view {t0}..{t1} misses the moment {moment}");

    // Filtering by an operation: the other operation's lanes and allocations go.
    let failing = script(client, "return String(window.lockstepTimeline.failingOperation());").await;
    let failing = failing.as_str().expect("an operation id").to_string();
    let select = client.find(Locator::Css("#op-filter")).await.map_err(|e| format!("#op-filter: {e}"))?;
    select.select_by_value(&failing).await.map_err(|e| format!("select {failing}: {e}"))?;
    let filtered = lane_labels(client).await;
    let shown_ops: Vec<&str> =
        filtered.iter().filter(|(g, _, _)| g == "operation").map(|(_, key, _)| key.as_str()).collect();
    assert_eq!(shown_ops, [failing.as_str()], "{filtered:?}");
    for (group, key, ops) in &filtered {
        if group != "node" {
            assert!(ops.split(' ').any(|op| op == failing), "{group} {key} (ops {ops}) is not about op={failing}");
        }
    }
    assert!(filtered.iter().any(|(g, _, _)| g == "allocation"), "the operation's allocations went too");
    let other = operations.iter().find(|op| **op != failing).expect("another operation");
    assert!(!filtered.iter().any(|(g, key, _)| g == "operation" && key == other), "op={other} still shown");
    Ok(())
}

fn write_screenshot(png: &[u8], out: &Path) {
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    std::fs::write(out.join("timeline.png"), png).expect("write the screenshot");
    if std::env::var_os("LOCKSTEP_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(manifest().join("docs")).expect("docs/");
        std::fs::write(manifest().join("docs/timeline.png"), png).expect("write docs/timeline.png");
    }
}
