#!/bin/bash
# Runs check_nb.sql on a scratch schema of its own (dropped after).
cd "$(dirname "$0")"
s=narrow_check_$$
./mk_schema.sh $s nb 4 0 >/dev/null 2>&1
PGOPTIONS="-c search_path=$s" psql -X -h 127.0.0.1 -U postgres test -f check_nb.sql 2>&1
psql -qX -h 127.0.0.1 -U postgres test -c "DROP SCHEMA $s CASCADE" 2>/dev/null
