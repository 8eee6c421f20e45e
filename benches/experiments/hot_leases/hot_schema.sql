-- HOT leases (sixth round, measurement only): no index on any lease column, no index predicate on one.
DROP INDEX resources_fetch_idx;
DROP INDEX resources_lease_expiry_idx;
CREATE INDEX resources_fetch_idx ON resources (kind, status, last_processed_at NULLS FIRST, id);
