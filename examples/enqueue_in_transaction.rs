//! Enqueue in your own transaction: a shop writes an order and the email confirming it in one PostgreSQL
//! transaction, so the email row exists if and only if the order does, and its fetch hint wakes the `emails`
//! pipeline at the commit (docs/real-mode.md, "Enqueue in your own transaction").
//!
//! Run it with `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example enqueue_in_transaction`. It
//! makes two schemas of its own (the shop's and lockstep's) and drops them at the end. Without `DATABASE_URL` it
//! says how to run it; the simulator build has no PostgreSQL, and there it says so.

#[cfg(madsim)]
fn main() {
    println!(
        "enqueue_in_transaction runs on PostgreSQL, in the normal build: cargo run --example enqueue_in_transaction"
    );
}

#[cfg(not(madsim))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        println!(
            "enqueue_in_transaction needs PostgreSQL: DATABASE_URL=postgres://USER@HOST:PORT/DATABASE cargo run \
             --example enqueue_in_transaction (a role that may create schemas)"
        );
        return Ok(());
    };
    let run_id = format!("{}_{}", std::process::id(), std::time::UNIX_EPOCH.elapsed()?.as_nanos());
    let (shop, queue) = (format!("shop_{run_id}"), format!("lockstep_{run_id}"));
    let outcome = real::run(&url, &shop, &queue).await;
    let cleanup = real::drop_schemas(&url, &[&shop, &queue]).await;
    outcome?;
    cleanup
}

#[cfg(not(madsim))]
mod real {
    use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineConfig, PipelineManager, WorkError};
    use lockstep::store::{NewRow, PgOptions, PgStore, Row, Store};
    use serde_json::json;
    use sqlx::{AssertSqlSafe, Connection, PgConnection};
    use std::sync::Arc;
    use std::time::Duration;

    type Error = Box<dyn std::error::Error>;

    /// Sends one email (here: marks its row sent).
    struct Mailer;

    impl<S: Store> Handler<S> for Mailer {
        type Context = ();

        async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
            Ok(())
        }

        async fn process(&self, row: Row, _: ()) -> Result<Changes, WorkError> {
            println!("sending the email of order {} to {}", row.data["order"], row.data["to"]);
            Ok(Changes::status("sent"))
        }
    }

    /// The shop's two transactions, one committed and one rolled back, and the `emails` pipeline that sends what
    /// committed.
    pub async fn run(url: &str, shop: &str, queue: &str) -> Result<(), Error> {
        let mut options = PgOptions::new(url);
        options.schema = queue.to_string();
        let store = PgStore::connect_with(options).await?;
        let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: 7 });
        let config = PipelineConfig { workers: 2, ..PipelineConfig::new("emails", "email", &["queued"]) };
        manager.register(config, Mailer)?;
        manager.start();

        // The shop's own connection (from its own pool, in an application), with its own search_path.
        let mut conn = PgConnection::connect(url).await?;
        let orders = format!("\"{shop}\".orders");
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{shop}\""))).execute(&mut conn).await?;
        let create = format!("CREATE TABLE {orders} (id bigint PRIMARY KEY, item text NOT NULL)");
        sqlx::query(AssertSqlSafe(create)).execute(&mut conn).await?;
        let place = format!("INSERT INTO {orders} (id, item) VALUES ($1, $2)");

        let mut tx = conn.begin().await?;
        sqlx::query(AssertSqlSafe(place.clone())).bind(1_i64).bind("book").execute(&mut *tx).await?;
        let email = NewRow::new("email", "queued", json!({ "order": 1, "to": "buyer@example.com" }));
        let ids = store.insert_in(&mut tx, vec![email]).await?; // no row, no hint until the commit
        tx.commit().await?; // the order, its email row and the hint that wakes `emails`, together

        let mut tx = conn.begin().await?;
        sqlx::query(AssertSqlSafe(place)).bind(2_i64).bind("pen").execute(&mut *tx).await?;
        let email = NewRow::new("email", "queued", json!({ "order": 2, "to": "buyer@example.com" }));
        let undone = store.insert_in(&mut tx, vec![email]).await?;
        tx.rollback().await?; // neither the order nor its email

        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.get(ids[0]).await?.is_none_or(|row| row.status != "sent") {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("email row {} was not sent within 10 s", ids[0]).into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        manager.shutdown().await;
        let count = format!("SELECT count(*) FROM {orders}");
        let placed: i64 = sqlx::query_scalar(AssertSqlSafe(count)).fetch_one(&mut conn).await?;
        let emails = store.list("email", None).await?;
        println!(
            "orders placed: {placed}; email rows: {} (row {} sent; row {} of the rolled-back order: {:?})",
            emails.len(),
            ids[0],
            undone[0],
            store.get(undone[0]).await?.map(|row| row.status)
        );
        conn.close().await?;
        store.close().await;
        Ok(())
    }

    /// Drops the example's schemas, whatever the run did.
    pub async fn drop_schemas(url: &str, schemas: &[&str]) -> Result<(), Error> {
        let mut conn = PgConnection::connect(url).await?;
        for schema in schemas {
            sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }
}
