WITH locked AS (
    SELECT id, lock_token FROM resources
    WHERE (id = ANY((:ids)::int8[]) AND lock_token = ANY((:toks)::int8[])) OR related_token = ANY((:toks)::int8[])
    ORDER BY id
    FOR NO KEY UPDATE
), main AS (
    UPDATE resources AS r
    SET status = COALESCE(u.status, r.status),
        data = COALESCE(u.data, r.data),
        updated_at = lockstep_now('0 microseconds'::interval),
        last_processed_at = lockstep_now('0 microseconds'::interval),
        attempts = 0,
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM unnest((:ids)::int8[], (:toks)::int8[], array_fill('done'::text, ARRAY[cardinality((:ids)::int8[])]),
                array_fill(NULL::jsonb, ARRAY[cardinality((:ids)::int8[])])) AS u(id, token, status, data)
    WHERE r.id = u.id AND r.lock_token = u.token AND r.id = ANY(ARRAY(SELECT id FROM locked))
    RETURNING r.id, u.token
), unlocked AS (
    UPDATE resources AS r
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM locked
    WHERE r.id = locked.id
      AND locked.id NOT IN (SELECT id FROM main)
      AND locked.lock_token IN (SELECT token FROM main)
)
SELECT id, token, lockstep_now('0 microseconds'::interval) AS now FROM main
