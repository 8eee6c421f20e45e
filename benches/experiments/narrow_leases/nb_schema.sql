-- Candidate "nb" (seventh round, measurement only): a narrow lease table of one row per fetch (a lease
-- batch), so that a lease enters no index but the primary key.
--
-- A lease is still an update of the resource row (its token, owner and exact expiry stay on the row, where the
-- guarded apply and the stale check read them), but the row leaves `resources_fetch_idx` by a column, `lease_batch`,
-- that no other index holds: the new version enters the primary key alone (base: the primary key and
-- `resources_lease_expiry_idx`). `lock_expires_at` is then in no index and no index predicate, so a heartbeat is a
-- HOT update. What the expiry index gave (takeover of expired leases, the next expiry) comes from `lease_batches`:
-- one narrow row per fetch, `(id, kind, expires_at, ids)`, whose `expires_at` is a lower bound of the expiries of
-- the rows that still carry `lease_batch = id` (every lease of a fetch starts with the same expiry; a heartbeat
-- raises the bound to the least expiry of the batch's rows still leased; an apply or release only ends leases, so
-- the bound stays a lower bound). Invariant: `lock_expires_at IS NOT NULL` <=> `lease_batch IS NOT NULL`, and a row
-- with `lease_batch = b` is in `b.ids`.
--
-- Migration from 0006 (the backfill): every row with an expiry (leases and marks) gets a batch of its own kind, 100
-- rows per batch in id order, the batch's bound the least expiry of its rows.
ALTER TABLE resources ADD COLUMN lease_batch bigint;
CREATE TABLE lease_batches (
    id         bigint      PRIMARY KEY, -- the least token of the fetch that made it (tokens are unique)
    kind       text        NOT NULL,
    expires_at timestamptz NOT NULL,    -- a lower bound of the expiries of its rows still leased
    ids        int8[]      NOT NULL     -- the rows leased (or marked) under it
);
CREATE INDEX lease_batches_expiry_idx ON lease_batches (kind, expires_at);
WITH numbered AS (
    SELECT id, kind, lock_expires_at, (row_number() OVER (PARTITION BY kind ORDER BY id) - 1) / 100 AS n
    FROM resources WHERE lock_expires_at IS NOT NULL
), batches AS (
    INSERT INTO lease_batches (id, kind, expires_at, ids)
    SELECT -nextval('lock_tokens'), kind, min(lock_expires_at), array_agg(id ORDER BY id)
    FROM numbered GROUP BY kind, n
    RETURNING id, kind, ids
)
UPDATE resources AS r SET lease_batch = b.id FROM batches AS b, unnest(b.ids) AS u(id) WHERE r.id = u.id;
DROP INDEX resources_fetch_idx;
DROP INDEX resources_lease_expiry_idx;
CREATE INDEX resources_fetch_idx ON resources (kind, status, last_processed_at NULLS FIRST, id)
    WHERE lease_batch IS NULL;
