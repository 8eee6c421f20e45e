-- Candidate "nl" (seventh round, measurement only): the narrow lease table as the earlier rounds named
-- it. A lease is an insert (or, for a takeover or the owner's own mark, an update) of a small row of `leases`; the
-- wide resource row is written only by the apply. The fetch still locks the resource row (`FOR NO KEY UPDATE SKIP
-- LOCKED`: a lock, no new version) so that two fetches never take one row, and leaves out rows with a lease row
-- (an anti join on the primary key of `leases`). Since a lease no longer writes the resource row, the row stays in
-- `resources_fetch_idx` (now a full index) while leased: the fetch walks the live leases ahead of the ready rows.
--
-- `leases`: one row per leased or marked resource row: `token` NULL for a mark, `expires_at` NULL for the owner's
-- reset mark; `related_token` the holder's token on a related row. `kind` and `status` are copies of the resource
-- row's (a leased row's status changes only by a write under its lease, which ends or rewrites the lease row).
-- Migration from 0006 (the backfill): a lease row for every row with an owner or a token.
CREATE TABLE leases (
    id            bigint      PRIMARY KEY,
    kind          text        NOT NULL,
    status        text        NOT NULL,
    token         bigint,
    owner         text        NOT NULL,
    expires_at    timestamptz,
    related_token bigint
);
CREATE INDEX leases_expiry_idx ON leases (kind, status, expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX leases_related_token_idx ON leases (related_token) WHERE related_token IS NOT NULL;
INSERT INTO leases (id, kind, status, token, owner, expires_at, related_token)
SELECT id, kind, status, lock_token, lock_owner, lock_expires_at, related_token FROM resources
WHERE lock_owner IS NOT NULL OR lock_token IS NOT NULL;
DROP INDEX resources_fetch_idx;
DROP INDEX resources_lease_expiry_idx;
DROP INDEX resources_related_token_idx;
CREATE INDEX resources_fetch_idx ON resources (kind, status, last_processed_at NULLS FIRST, id);
