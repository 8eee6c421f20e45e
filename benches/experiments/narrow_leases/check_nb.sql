-- Protocol checks of candidate nb on a scratch schema (check_nb.sh makes it: 4 rows, row 4 of status 'other').
-- Each \echo names the rule; the line after it is what to read.
\set ON_ERROR_STOP 1
\set lim 100
\set ttl '60 seconds'
\ir nb_statements.sql
UPDATE resources SET status = 'other' WHERE id = 4;

\echo '1. fetch as p1 leases rows 1-3 in one batch:'
\set cid 1
\set off '0 seconds'
\ir fetch_nb.sql
\echo :ids :toks :batches
\set ids1 :ids
\set toks1 :toks
\set batch1 :batches
SELECT id, lock_token, lease_batch, lock_expires_at - now() AS ttl FROM resources ORDER BY id;

\echo '2. a second fetch (p2) while they are live leases nothing and reads no leased entry (rows of the scan):'
\set cid 2
\ir fetch_nb.sql
\echo :ids
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT id FROM resources WHERE kind = 'job' AND status = 'ready' AND lease_batch IS NULL ORDER BY last_processed_at NULLS FIRST, id LIMIT 100;

\echo '3. an apply with a stale token (token + 1000) writes nothing:'
SELECT array_agg(t + 1000)::text AS bad FROM unnest(:'toks1'::int8[]) AS t \gset
\set ids :ids1
\set toks :bad
\set batches :batch1
BEGIN;
\ir apply_nb.sql
SELECT count(*) AS written_by_stale_apply FROM resources WHERE status = 'done';
ROLLBACK;

\echo '4. heartbeat of row 1 only (ttl 120 s): row 1 extended by a HOT update, the batch bound stays at rows 2-3 expiry:'
SELECT (:'ids1'::int8[])[1:1]::text AS hb_ids, (:'toks1'::int8[])[1:1]::text AS hb_toks \gset
\set ids :hb_ids
\set toks :hb_toks
\set ttl '120 seconds'
BEGIN;
\ir heartbeat_nb.sql
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'resources';
COMMIT;
\set ttl '60 seconds'
SELECT id, lock_token, lease_batch, round(extract(epoch FROM lock_expires_at - now())) AS expires_in FROM resources ORDER BY id;
SELECT id, round(extract(epoch FROM expires_at - now())) AS bound_in, ids FROM lease_batches;

\echo '5. next expiry now (exact): about 60 s (rows 2-3):'
SELECT nb_next_expiry('0 seconds', 'job', '{ready}') / 1000000 AS next_expiry_s;

\echo '6. 90 s later (clock offset) a fetch by p2 takes over rows 2-3 (expired), not row 1 (extended to 120 s):'
\set off '90 seconds'
\set cid 2
\ir fetch_nb.sql
\echo :ids :toks :batches
\set ids2 :ids
\set toks2 :toks
\set batch2 :batches
SELECT id, lock_token, lock_owner, lease_batch, round(extract(epoch FROM lock_expires_at - now())) AS expires_in FROM resources ORDER BY id;

\echo '7. the old holder (p1) applies rows 1-3 with its tokens at 90 s: only row 1 (still its lease) is written; 2-3 are stale:'
\set ids :ids1
\set toks :toks1
\set batches :batch1
\ir apply_nb.sql
SELECT id, status, lock_token, lease_batch FROM resources ORDER BY id;
\echo '   batch 1 is gone (no row of it is leased any more), batch 2 stays:'
SELECT id, ids FROM lease_batches ORDER BY id;

\echo '8. next expiry at 90 s: p2 leases end at 150 s, so 60 s:'
SELECT nb_next_expiry('90 seconds', 'job', '{ready}') / 1000000 AS next_expiry_s;

\echo '9. related lock: p2 locks row 4 under the token of row 2 (same batch); its apply of rows 2-3 unlocks row 4:'
SELECT (:'toks2'::int8[])[1] AS t2, (:'batch2'::int8[])[1] AS b2 \gset
UPDATE resources SET lock_token = :t2, related_token = :t2, lock_owner = 'p2',
    lock_expires_at = lockstep_ts_plus(lockstep_now('90 seconds'), '60 seconds'), lease_batch = :b2
WHERE id = 4;
UPDATE lease_batches SET ids = ids || 4::int8 WHERE id = :b2;
SELECT id, lock_token, related_token, lease_batch FROM resources WHERE id = 4;
\set ids :ids2
\set toks :toks2
\set batches :batch2
\ir apply_nb.sql
SELECT id, status, lock_token, related_token, lease_batch FROM resources ORDER BY id;
\echo '   no batch left:'
SELECT count(*) AS batches FROM lease_batches;

\echo '10. a lease batch of a dead replica whose rows were all taken over is swept by the next fetch:'
INSERT INTO lease_batches VALUES (-1, 'job', now() - interval '1 hour', '{1,2}');
\set off '0 seconds'
\set cid 3
\ir fetch_nb.sql
SELECT count(*) AS batches_left_with_id_minus_1 FROM lease_batches WHERE id = -1;
