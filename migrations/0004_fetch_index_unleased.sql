-- Leased rows leave the fetch's index range (issue 16). `resources_fetch_idx` held every row, so a leased row, and
-- the dead versions its lease and apply left behind, stayed inside the range of its kind and status: every later
-- fetch walked over them (about four index entries and their heap rows per row leased, measured under load) before
-- reaching the rows it could take. Now the index holds only rows without a lease expiry (never leased, applied,
-- released, reset for retry), and a second, small index holds the rows with one (live or expired leases and marks):
-- the fetch reads the first in fetch order and the expired entries of the second (a takeover), and the next
-- expiry reads the second. A row's lease moves it from the first to the second and its apply back.
--
-- A non-HOT update enters a row's new version in every index whose predicate it meets, so a lease still writes
-- three index entries (primary key, lock token, lease expiry) and an apply two (primary key, fetch), as before.
DROP INDEX resources_fetch_idx;
CREATE INDEX resources_fetch_idx ON resources (kind, status, last_processed_at NULLS FIRST, id)
    WHERE lock_expires_at IS NULL;
CREATE INDEX resources_lease_expiry_idx ON resources (kind, status, lock_expires_at)
    WHERE lock_expires_at IS NOT NULL;
