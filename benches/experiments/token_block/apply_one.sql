UPDATE resources
SET status = COALESCE('done', status),
    data = COALESCE(NULL::jsonb, data),
    updated_at = lockstep_now('0 microseconds'::interval),
    last_processed_at = lockstep_now('0 microseconds'::interval),
    attempts = 0,
    lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
WHERE id = :id AND lock_token = :tok AND NOT EXISTS (SELECT 1 FROM resources WHERE related_token = :tok)
RETURNING lockstep_now('0 microseconds'::interval)
