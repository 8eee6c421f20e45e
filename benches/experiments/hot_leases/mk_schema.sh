#!/bin/bash
# mk_schema.sh SCHEMA VARIANT(base|hot) ROWS LEASED: lockstep's migrations 0001-0006 in SCHEMA (+ HOT leases'
# indexes for hot), ROWS ready rows, the first LEASED in fetch order under a live one-hour lease of another owner.
here=$(cd "$(dirname "$0")" && pwd); root=$here/../../..
s=$1 v=$2 rows=$3 leased=$4
P="psql -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres test"
$P -c "DROP SCHEMA IF EXISTS $s CASCADE" -c "CREATE SCHEMA $s"
{ echo "SET search_path TO $s;"; cat $root/migrations/000{1,2,3,4,5,6}_*.sql; [ $v = hot ] && cat $here/hot_schema.sql;
  echo "INSERT INTO resources (kind, status, data, created_at, updated_at) SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $rows);"
  echo "UPDATE resources SET lock_token = nextval('lock_tokens'), lock_owner = 'long', lock_expires_at = now() + interval '1 hour' WHERE id <= $leased;"
} | $P
$P -c "VACUUM ANALYZE $s.resources"
