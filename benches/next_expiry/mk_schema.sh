#!/bin/bash
# mk_schema.sh SCHEMA ROWS LEASED: lockstep's migrations in SCHEMA, ROWS ready rows of kind 'job', the first LEASED
# of them in fetch order under a live one-hour lease of another owner (long handlers), as a fetcher of the kind
# sees them while they run.
here=$(cd "$(dirname "$0")" && pwd); root=$here/../..
s=$1 rows=$2 leased=$3
P="psql -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres test"
$P -c "DROP SCHEMA IF EXISTS $s CASCADE" -c "CREATE SCHEMA $s"
{ echo "SET search_path TO $s;"; cat $root/migrations/0*.sql
  echo "INSERT INTO resources (kind, status, data, created_at, updated_at) SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $rows);"
  echo "UPDATE resources SET lock_token = nextval('lock_tokens'), lock_owner = 'long', lock_expires_at = now() + interval '1 hour' WHERE id <= $leased;"
} | $P
$P -c "VACUUM ANALYZE $s.resources"
