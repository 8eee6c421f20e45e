//! Every SQL statement of the benchmarks, in one place (STYLE: SQL lives in `store/pg`; these are the bench's own,
//! kept apart so that the raw limit's exact work can be read at a glance).
//!
//! The raw SQL limit is the least a queue on PostgreSQL must do per item, on the very table, indexes and rows
//! lockstep uses (its own schema from `migrations/`): a claim that takes ready rows with `FOR NO KEY UPDATE SKIP
//! LOCKED` and marks them taken (owner and expiry, so a crashed client's rows come back), and a completion that
//! sets the status and clears the claim. No fencing token, no heartbeat, no refetch, no guard on the completion:
//! lockstep's protocol adds those, and the ratio of the two throughputs is what they cost.

/// The claim: up to `$1` ready rows, oldest first (the order and index of lockstep's fetch), marked taken.
/// Returns their ids.
pub const CLAIM: &str = "UPDATE resources AS r
SET lock_owner = 'raw', lock_expires_at = now() + interval '30 seconds'
FROM (
    SELECT id
    FROM resources
    WHERE kind = 'job' AND status = 'ready' AND lock_expires_at IS NULL
    ORDER BY last_processed_at NULLS FIRST, id
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
) AS picked
WHERE r.id = picked.id
RETURNING r.id";

/// The completion of claimed rows `$1` (`int8[]`): done, processed now, claim cleared.
pub const COMPLETE: &str = "UPDATE resources
SET status = 'done', updated_at = now(), last_processed_at = now(), lock_owner = NULL, lock_expires_at = NULL
WHERE id = ANY($1)";

/// The benchmark's rows: `$1` ready rows of kind `job`, unleased and never processed, as `Store::insert` makes
/// them, in one statement on the server (filling 300 000 rows through `Store::insert_many` took most of a
/// point's time on a loaded machine).
pub const FILL: &str = "INSERT INTO resources (kind, status, data, created_at, updated_at)
SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $1)";

/// After the bulk insert of a benchmark's rows: visibility map and planner statistics, so every run starts from
/// the same state rather than from whenever autovacuum gets to the table. Simple query protocol (not in a
/// transaction block).
pub const VACUUM_ANALYZE: &str = "VACUUM ANALYZE resources";

/// WAL written so far, in bytes since the start of the WAL: the difference over a run is the WAL it wrote.
pub const WAL_BYTES: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8";

/// Updates and HOT updates of the resource table so far (`pg_stat_user_tables`; a backend reports its counters
/// when it goes idle or ends). `$1` schema.
pub const TABLE_UPDATES: &str = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'resources'";

/// Scans, index entries read and heap rows fetched of every index of the resource table. `$1` schema.
pub const INDEX_READS: &str =
    "SELECT indexrelname::text, idx_scan, idx_tup_read, idx_tup_fetch FROM pg_stat_user_indexes
WHERE schemaname = $1 AND relname = 'resources' ORDER BY indexrelname";

/// The server's version, for the results' machine line.
pub const SERVER_VERSION: &str = "SELECT current_setting('server_version')";

/// Settings that decide the cost of a commit, for the results' machine line.
pub const COMMIT_SETTINGS: &str =
    "SELECT current_setting('synchronous_commit') || ' synchronous_commit, fsync ' || current_setting('fsync')";
