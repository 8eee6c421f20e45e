//! The MemStore side, in process: lockstep replicas (managers) over one MemStore on the runtime's clock, and the
//! store's own limit, clients calling `fetch` and `apply_batch` directly.

use crate::measure::{ProcessProbe, Sample, measure, per_call};
use crate::pg::KIND;
use crate::settings::Settings;
use lockstep::pipeline::{Handler, ManagerOptions, PipelineConfig, PipelineManager};
use lockstep::store::{ApplyParams, FetchParams, Lease, MemStore, NewRow, RowUpdate, Store, Timestamp, TokioClock};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A MemStore holding `rows` ready rows of kind [`KIND`].
async fn store_with_rows(rows: usize) -> MemStore {
    let store = MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000)));
    for _ in 0..rows {
        store.insert(NewRow::new(KIND, "ready", json!({}))).await.expect("MemStore insert");
    }
    store
}

/// The store's limit: `clients` tasks, each leasing up to `batch` rows per `fetch` and applying them in one
/// `apply_batch`, until the window ends.
pub async fn raw_clients(settings: &Settings, clients: usize, batch: usize) -> Sample {
    let store = Arc::new(store_with_rows(settings.mem_rows).await);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (store, done, stop) = (store.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let params = FetchParams {
                pipeline: format!("raw{client}"),
                kind: KIND.into(),
                statuses: vec!["ready".into()],
                limit: batch,
                lease_ttl: Duration::from_secs(30),
                min_processing_interval: Duration::from_secs(5),
                retry_delay: Duration::from_millis(500),
            };
            while !stop.load(Ordering::Relaxed) {
                let rows = store.fetch(params.clone()).await.expect("fetch");
                if rows.is_empty() {
                    break;
                }
                let batch = rows
                    .iter()
                    .map(|row| {
                        let lease = Lease { id: row.id, token: row.lock_token.expect("leased") };
                        ApplyParams::new(lease, RowUpdate::status("done"))
                    })
                    .collect();
                let outcomes = store.apply_batch(batch).await.expect("apply_batch");
                done.fetch_add(outcomes.len() as u64, Ordering::Relaxed);
                // MemStore's calls never wait: give the other clients (and the measuring task) their turn.
                tokio::task::yield_now().await;
            }
        }));
    }
    let total = settings.mem_rows as u64;
    let mut probe = ProcessProbe;
    let sample = measure(|| done.load(Ordering::Relaxed), total, &mut probe, settings.warmup, settings.window).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("raw client");
    }
    sample
}

/// Lockstep on MemStore: `replicas` managers over one store of `rows` rows running `config` with `handler`.
pub async fn lockstep<H: Handler<MemStore> + Clone>(
    settings: &Settings,
    rows: usize,
    replicas: usize,
    config: PipelineConfig,
    handler: H,
) -> Sample {
    let store = Arc::new(store_with_rows(rows).await);
    let name = config.name.clone();
    let mut managers = Vec::new();
    for replica in 0..replicas {
        let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: replica as u64 });
        manager.register(config.clone(), handler.clone()).expect("bench pipeline config");
        managers.push(manager);
    }
    for manager in &mut managers {
        manager.start();
    }
    let applied = || managers.iter().map(|m| m.metrics(&name).expect("registered").applied).sum::<u64>();
    let sample = measure(applied, rows as u64, &mut ProcessProbe, settings.warmup, settings.window).await;
    let snapshots: Vec<_> = managers.iter().map(|m| m.metrics(&name).expect("registered")).collect();
    let sample = Sample { per_call: Some(per_call(&snapshots)), ..sample };
    for manager in &mut managers {
        manager.abort();
    }
    sample
}
