-- Heartbeat of candidate nb (HEARTBEAT's rules): lock every row of the leases in id order, extend those whose main
-- row still carries the token under a live lease (a HOT update: lock_expires_at is in no index), then raise each
-- touched batch's bound to the least expiry of its rows still leased (the extended rows' new expiry, the others'
-- as they are). Returns the extended (id, token).
WITH locked AS (
    SELECT id, lock_token, lock_expires_at FROM resources
    WHERE (id = ANY(:'ids'::int8[]) AND lock_token = ANY(:'toks'::int8[])) OR related_token = ANY(:'toks'::int8[])
    ORDER BY id FOR NO KEY UPDATE
), held AS (
    SELECT locked.lock_token FROM locked
    JOIN unnest(:'ids'::int8[], :'toks'::int8[]) AS lease(id, token) ON locked.id = lease.id AND locked.lock_token = lease.token
    WHERE locked.lock_expires_at > lockstep_now(:'off'::interval)
), extended AS (
    UPDATE resources AS r
    SET lock_expires_at = GREATEST(r.lock_expires_at, lockstep_ts_plus(lockstep_now(:'off'::interval), :'ttl'::interval))
    FROM locked
    WHERE r.id = locked.id AND locked.lock_token IN (SELECT lock_token FROM held)
    RETURNING r.id, r.lock_token, r.lease_batch, r.lock_expires_at
), bounds AS (
    UPDATE lease_batches AS b
    SET expires_at = GREATEST(b.expires_at, LEAST(
        (SELECT min(e.lock_expires_at) FROM extended AS e WHERE e.lease_batch = b.id),
        COALESCE((SELECT min(r.lock_expires_at) FROM resources AS r
                  WHERE r.id = ANY(b.ids) AND r.lease_batch = b.id AND r.id NOT IN (SELECT id FROM extended)),
                 'infinity')))
    WHERE b.id IN (SELECT lease_batch FROM extended)
)
SELECT id, lock_token FROM extended;
