-- Failures a row records (DESIGN §3, failures; issue 13): how many attempts failed since the last successful
-- apply, the last few errors, and the store time before which no fetch takes the row again (a failure's backoff,
-- which a fetch hint does not bypass). Constant defaults, so PostgreSQL adds the columns without rewriting the
-- table.
ALTER TABLE resources
    ADD COLUMN attempts   integer     NOT NULL DEFAULT 0,
    ADD COLUMN errors     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN not_before timestamptz;
