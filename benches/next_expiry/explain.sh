#!/bin/bash
# explain.sh SCHEMA VARIANT(before|after) STATUSES: EXPLAIN (ANALYZE, BUFFERS) of the next expiry's generic plan
# (as a connection runs it after five calls), its parameters bound by EXECUTE; prints the execution time, the
# shared buffers of the whole plan and the index entries its scans returned.
cd "$(dirname "$0")"
stmt=$(sed -e 's/:offset::interval/$1/g' -e 's/:kind/$2/g' -e 's/:statuses::text\[\]/$3/g' -e 's/;$//' next_expiry_$2.pgbench)
plan=$(psql -qAtX -h 127.0.0.1 -U postgres test <<SQL
SET search_path TO $1;
BEGIN;
SET LOCAL plan_cache_mode = force_generic_plan;
PREPARE ne(interval, text, text[]) AS $stmt;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE ne('0', 'job', '$3');
ROLLBACK;
SQL
)
exec_ms=$(echo "$plan" | grep 'Execution Time' | awk '{print $3}')
buffers=$(echo "$plan" | grep -m1 'Buffers: shared' | sed 's/.*Buffers: shared //' | tr ' ' ',')
entries=$(echo "$plan" | grep 'Index.*Scan.*resources_lease_expiry_idx' | sed 's/.*actual time=[^ ]* rows=\([0-9]*\) loops=\([0-9]*\).*/\1x\2/' | tr '\n' ' ')
echo "exec_ms=$exec_ms buffers=$buffers index_rows_x_loops=${entries% }"
