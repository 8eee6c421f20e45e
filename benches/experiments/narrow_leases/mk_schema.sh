#!/bin/bash
# mk_schema.sh SCHEMA VARIANT ROWS LEASED: a scratch schema for one variant (base | lean | one of the candidates'
# <variant>_schema.sql), ROWS ready rows of kind 'job', the first LEASED of them in fetch order under a live
# one-hour lease of another owner (long handlers).
here=$(cd "$(dirname "$0")" && pwd); root=$here/../../..
s=$1 v=$2 rows=$3 leased=$4
P="psql -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres test"
$P -c "DROP SCHEMA IF EXISTS $s CASCADE" -c "CREATE SCHEMA $s"
{ echo "SET search_path TO $s;"
  case $v in
  lean)
    cat $root/benches/peers/lean.sql
    echo "INSERT INTO lean_jobs (state) SELECT 0 FROM generate_series(1, $rows);"
    echo "UPDATE lean_jobs SET state = 1, locked_by = -1, locked_until = now() + interval '1 hour' WHERE id <= $leased;"
    ;;
  base|raw)
    cat $root/migrations/000{1,2,3,4,5,6}_*.sql
    echo "INSERT INTO resources (kind, status, data, created_at, updated_at) SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $rows);"
    echo "UPDATE resources SET lock_token = nextval('lock_tokens'), lock_owner = 'long', lock_expires_at = now() + interval '1 hour' WHERE id <= $leased;"
    ;;
  *)
    # A candidate: lockstep's schema 0001-0006 (filled and leased as base is), then the candidate's migration,
    # which moves the lease state where the candidate keeps it (the backfill of a migration from 0006).
    cat $root/migrations/000{1,2,3,4,5,6}_*.sql
    echo "INSERT INTO resources (kind, status, data, created_at, updated_at) SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $rows);"
    echo "UPDATE resources SET lock_token = nextval('lock_tokens'), lock_owner = 'long', lock_expires_at = now() + interval '1 hour' WHERE id <= $leased;"
    case $v in nbt|rawnbt) cat $here/nb_schema.sql ;; *) cat $here/${v}_schema.sql ;; esac
    ;;
  esac
} | $P
for t in $($P -Atc "SELECT tablename FROM pg_tables WHERE schemaname = '$s'"); do $P -c "VACUUM ANALYZE $s.$t"; done
