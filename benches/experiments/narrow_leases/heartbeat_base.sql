-- HEARTBEAT of src/store/pg/sql.rs with psql variables.
WITH locked AS (
    SELECT id, lock_token, lock_expires_at FROM resources
    WHERE (id = ANY(:'ids'::int8[]) AND lock_token = ANY(:'toks'::int8[])) OR related_token = ANY(:'toks'::int8[])
    ORDER BY id FOR NO KEY UPDATE
), held AS (
    SELECT locked.lock_token FROM locked
    JOIN unnest(:'ids'::int8[], :'toks'::int8[]) AS lease(id, token) ON locked.id = lease.id AND locked.lock_token = lease.token
    WHERE locked.lock_expires_at > lockstep_now(:'off'::interval)
)
UPDATE resources AS r
SET lock_expires_at = GREATEST(r.lock_expires_at, lockstep_ts_plus(lockstep_now(:'off'::interval), :'ttl'::interval))
FROM locked
WHERE r.id = locked.id AND locked.lock_token IN (SELECT lock_token FROM held)
RETURNING r.id, r.lock_token;
