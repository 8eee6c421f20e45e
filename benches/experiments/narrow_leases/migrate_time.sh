#!/bin/bash
# How long the candidates' migrations from 0006 take on a populated schema: ROWS rows (1 000 000), LEASED of them
# (30 000) under live leases, the migration run in one transaction as sqlx runs one. Schemas of its own, dropped.
cd "$(dirname "$0")"
P="psql -qAtX -h 127.0.0.1 -U postgres test"
rows=${ROWS:-1000000}; L=${LEASED:-30000}
for v in nb nl; do
  s=narrow_mig_${v}_$$
  ./mk_schema.sh $s base $rows $L >/dev/null 2>&1
  $P -c CHECKPOINT
  t0=$(date +%s.%N); l0=$($P -c "SELECT pg_current_wal_lsn()")
  { echo "SET search_path TO $s; BEGIN;"; cat ${v}_schema.sql; echo "COMMIT;"; } | psql -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres test >/dev/null || echo "migration $v failed"
  t1=$(date +%s.%N); l1=$($P -c "SELECT pg_current_wal_lsn()")
  extra=""
  [ $v = nb ] && extra="batches=$($P -c "SELECT count(*) FROM $s.lease_batches") leased_rows_with_batch=$($P -c "SELECT count(*) FROM $s.resources WHERE lease_batch IS NOT NULL")"
  [ $v = nl ] && extra="lease_rows=$($P -c "SELECT count(*) FROM $s.leases")"
  echo "migration=$v rows=$rows leased=$L load=$(cut -d' ' -f1 /proc/loadavg) secs=$(echo "$t1 - $t0" | bc) wal_mb=$(( $($P -c "SELECT pg_wal_lsn_diff('$l1', '$l0')::int8") / 1000000 )) $extra"
  $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
done
