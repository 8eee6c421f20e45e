-- The lean queue table of the pgbench "lean" line (docs/benchmarks-history.md, "Peers in the same run"): the least
-- a queue table
-- needs, with a partial index on pending rows only, so a claimed row leaves the claim's index range at once.
CREATE TABLE lean_jobs (
    id           bigserial   PRIMARY KEY,
    state        smallint    NOT NULL DEFAULT 0, -- 0 pending, 1 claimed, 2 done
    payload      jsonb       NOT NULL DEFAULT '{}',
    locked_by    integer,
    locked_until timestamptz
);
CREATE INDEX lean_jobs_pending_idx ON lean_jobs (id) WHERE state = 0;
