-- The statements of candidate "nb" besides the fetch and the batched apply (round_nb.pgbench), as psql text with
-- variables: :off clock offset, :ids and :toks int8[] literals, :ttl. Loaded by check_nb.sql and side.sh.

-- Next expiry (exact, as NEXT_EXPIRY): the batches of the kind in bound order; each one's rows still leased give
-- its exact least future expiry; stop when the next bound is not less than the best so far. Reads one batch's
-- rows (100 primary-key probes) in the common case, whatever the number of live leases.
CREATE FUNCTION nb_next_expiry(clock interval, k text, statuses text[]) RETURNS int8
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    b record;
    best timestamptz;
    m timestamptz;
    now_ timestamptz := lockstep_now(clock);
BEGIN
    FOR b IN SELECT id, expires_at, ids FROM lease_batches WHERE kind = k ORDER BY expires_at LOOP
        EXIT WHEN best IS NOT NULL AND b.expires_at >= best;
        SELECT min(r.lock_expires_at) INTO m FROM resources AS r
        WHERE r.id = ANY(b.ids) AND r.lease_batch = b.id AND r.status = ANY(statuses)
          AND r.lock_expires_at > now_ AND isfinite(r.lock_expires_at);
        IF m IS NOT NULL AND (best IS NULL OR m < best) THEN best := m; END IF;
    END LOOP;
    RETURN (extract(epoch FROM best - now_) * 1000000)::int8;
END $$;
