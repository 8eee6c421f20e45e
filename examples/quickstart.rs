//! A user pipeline on the embedded store: thumbnails rows go from "uploaded" to "ready".
//! Run it for real with `cargo run --example quickstart`, or under the simulator with
//! `cargo sim-run --example quickstart` (simulated time: the same run, deterministic, in milliseconds).
use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineConfig, PipelineManager, WorkError};
use lockstep::store::{MemStore, NewRow, Row, Store, Timestamp, TokioClock};
use serde_json::json;
use std::{sync::Arc, time::Duration};

/// Load → process → guarded apply for one leased row.
struct Thumbnailer;

impl<S: Store> Handler<S> for Thumbnailer {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(()) // read or lock related rows here (cx.lock_related)
    }

    async fn process(&self, row: Row, _: ()) -> Result<Changes, WorkError> {
        tokio::time::sleep(Duration::from_millis(50)).await; // the heavy work, outside the store
        let size = row.data["bytes"].as_u64().unwrap_or(0) / 10;
        let mut changes = Changes::status("ready");
        changes.update.data = Some(json!({ "thumbnail_bytes": size }));
        Ok(changes)
    }
}

#[tokio::main]
async fn main() {
    let store = Arc::new(MemStore::new(TokioClock::new(Timestamp::EPOCH)));
    let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: 42 });
    let config = PipelineConfig { workers: 20, ..PipelineConfig::new("thumbnails", "image", &["uploaded"]) };
    manager.register(config, Thumbnailer).expect("valid config");
    manager.start();

    for i in 0..200u64 {
        store.insert(NewRow::new("image", "uploaded", json!({ "bytes": 1000 + i }))).await.unwrap();
    }
    manager.hint_fetch("image", None).await.unwrap(); // wake the fetcher now, not after its backoff

    let started = tokio::time::Instant::now();
    while store.list("image", None).await.unwrap().iter().any(|row| row.status != "ready") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    manager.shutdown().await; // the workers finish counting what they applied
    let metrics = manager.metrics("thumbnails").unwrap();
    println!(
        "processed {} images in {:.2} s with 20 workers (mean process {:.1} ms, {} stale, {} retried)",
        metrics.applied,
        started.elapsed().as_secs_f64(),
        metrics.process_latency.mean().as_secs_f64() * 1e3,
        metrics.stale,
        metrics.retries
    );
}
