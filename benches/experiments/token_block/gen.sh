#!/bin/bash
# gen.sh: writes the pgbench scripts round_{batched,per_item}_{base,block}.pgbench from the statement files here
# (pgbench takes one statement a line: each file is joined into one line, its comments dropped). base is the fetch
# of src/store/pg/sql.rs (a nextval per row); block numbers the picked rows in fetch order (row_number over the sort
# `picked` does anyway) and draws one value for the whole fetch (none when it picked nothing), the sequence stepping
# by a block (mk_schema.sh).
cd "$(dirname "$0")"
line() { grep -v '^ *--' "$@" | tr '\n' ' ' | tr -s ' '; echo; }
for v in base block; do
  tokened=$(line tokened_$v.sql)
  ordinal=""; [ $v = block ] && ordinal=", row_number() OVER (ORDER BY last_processed_at NULLS FIRST, id) AS ordinal"
  fetch() { sed -e "s/@LIMIT@/$1/g" -e "s/@ORDINAL@/$ordinal/" fetch.sql.in | awk -v t="$tokened" '{gsub(/@TOKENED@/, t)} 1' | line; }
  { echo "WITH f AS ($(fetch 100)) SELECT COALESCE(array_agg(id), '{}')::text AS ids, COALESCE(array_agg(lock_token), '{}')::text AS toks FROM f"
    echo '\gset'
    line apply_batch.sql; } > round_batched_$v.pgbench
  { echo "WITH f AS ($(fetch 1)) SELECT COALESCE(max(id), 0) AS id, COALESCE(max(lock_token), 0) AS tok FROM f"
    echo '\gset'
    line apply_one.sql; } > round_per_item_$v.pgbench
done
