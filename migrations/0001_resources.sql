-- lockstep's schema (DESIGN §2): one generic resource table, a fencing-token sequence and an event log.
--
-- Every timestamp is written from the database's clock through `lockstep_now`, never from a replica's, and is a
-- `timestamptz` (microseconds, the precision of the store's `Timestamp`).

-- The store's clock: `now()` plus an offset that only tests set (to cross lease expiry without sleeping). Within
-- a transaction `now()` is constant, so every call of one store operation sees one `now`.
CREATE FUNCTION lockstep_now(clock_offset interval) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() + clock_offset $$;

-- `t + span`, saturating at 'infinity' past the end of `timestamptz` (the store's `Timestamp::plus` saturates
-- too, and 'infinity' reads back as its largest value). Spans are microseconds only (no days or months).
-- 9224318016000 s is PostgreSQL's first invalid instant, 294277-01-01 00:00 UTC, in Unix seconds.
CREATE FUNCTION lockstep_ts_plus(t timestamptz, span interval) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT CASE
            WHEN extract(epoch FROM t) + extract(epoch FROM span) >= 9224318016000 THEN 'infinity'::timestamptz
            ELSE t + span
        END
    $$;

-- `t - span`, saturating at '-infinity' before the start of `timestamptz` (4714-11-24 00:00 BC UTC,
-- -210866803200 s since the Unix epoch), as `Timestamp::minus` saturates.
CREATE FUNCTION lockstep_ts_minus(t timestamptz, span interval) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT CASE
            WHEN extract(epoch FROM t) - extract(epoch FROM span) < -210866803200 THEN '-infinity'::timestamptz
            ELSE t - span
        END
    $$;

-- Every kind of row (operation, job, allocation, node) lives here; the lease columns are dstack's.
CREATE TABLE resources (
    id                bigserial   PRIMARY KEY,
    kind              text        NOT NULL,
    parent_id         bigint,
    status            text        NOT NULL,
    data              jsonb       NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    last_processed_at timestamptz,
    lock_expires_at   timestamptz,
    lock_token        bigint,
    lock_owner        text,
    hinted            boolean     NOT NULL DEFAULT false
);

-- Fencing tokens: one store-wide sequence, so a later lease on a row always carries a larger token.
CREATE SEQUENCE lock_tokens AS bigint START WITH 1 NO CYCLE;

-- The fetch: `kind = $ AND status = ANY($) ORDER BY last_processed_at NULLS FIRST, id LIMIT $`. For one status
-- the index yields rows in fetch order and the scan stops at the limit; finished rows of other statuses are
-- never read.
CREATE INDEX resources_fetch_idx ON resources (kind, status, last_processed_at NULLS FIRST, id);

-- Heartbeat, apply, reset and release find a lease's related rows by its token. Only leased rows carry one, so
-- the index stays as small as the set of live leases.
CREATE INDEX resources_lock_token_idx ON resources (lock_token) WHERE lock_token IS NOT NULL;

-- `list(kind, Some(parent))`: a parent's children of one kind.
CREATE INDEX resources_parent_idx ON resources (parent_id, kind, id) WHERE parent_id IS NOT NULL;

-- Events written by applies, in one store-wide sequence.
CREATE TABLE events (
    seq    bigserial   PRIMARY KEY,
    row_id bigint      NOT NULL,
    kind   text        NOT NULL,
    data   jsonb       NOT NULL,
    at     timestamptz NOT NULL
);

CREATE INDEX events_row_idx ON events (row_id, seq);
