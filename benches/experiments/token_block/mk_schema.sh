#!/bin/bash
# mk_schema.sh SCHEMA VARIANT(base|block) ROWS: lockstep's migrations 0001-0006 in SCHEMA, ROWS ready rows of kind
# 'job'; for block, the token sequence steps by a block of 1024 (one draw reserves a fetch's tokens).
here=$(cd "$(dirname "$0")" && pwd); root=$here/../../..
s=$1 v=$2 rows=$3
P="psql -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres test"
$P -c "DROP SCHEMA IF EXISTS $s CASCADE" -c "CREATE SCHEMA $s"
{ echo "SET search_path TO $s;"; cat $root/migrations/000{1,2,3,4,5,6}_*.sql
  [ $v = block ] && echo "ALTER SEQUENCE lock_tokens INCREMENT BY 1024;"
  echo "INSERT INTO resources (kind, status, data, created_at, updated_at) SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $rows);"
} | $P
$P -c "VACUUM ANALYZE $s.resources"
