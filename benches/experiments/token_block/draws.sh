#!/bin/bash
# The cost of the draws alone: pgbench, 8 clients, -M prepared, DURATION s a run, a statement that numbers 100 rows
# and draws a value of a sequence for each (row) or once (once), interleaved (row first in odd pairs). The difference
# of PostgreSQL CPU per statement, over 100, is what one nextval costs when 8 sessions draw from one sequence; it
# bounds what one draw per fetch can save per item. In a schema of its own, tb_draws_<pid>, dropped after.
cd "$(dirname "$0")"
out=${OUT:-/tmp/token_draws.txt}
P="psql -qAtX -h 127.0.0.1 -U postgres test"
s=tb_draws_$$
$P -c "CREATE SCHEMA $s" -c "CREATE SEQUENCE $s.tb_draws AS bigint"
for p in $(seq 1 ${PAIRS:-5}); do
  order="row once"; [ $((p % 2)) = 0 ] && order="once row"
  for v in $order; do
    load=$(cut -d' ' -f1 /proc/loadavg); c0=$(./pgcpu.sh)
    PGOPTIONS="-c search_path=$s" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 8 -j 2 -T ${DURATION:-5} \
      -f nextval_$v.pgbench test > /tmp/tb_draws_$$.out 2>&1
    c1=$(./pgcpu.sh)
    n=$(grep 'number of transactions actually processed' /tmp/tb_draws_$$.out | awk '{print $6}' | cut -d/ -f1)
    echo "pair=$p variant=$v load=$load statements=$n pg_cpu_us_per_statement=$(echo "scale=2; ($c1 - $c0) * 1000000 / $n" | bc)" | tee -a $out
  done
done
$P -c "DROP SCHEMA $s CASCADE"
rm -f /tmp/tb_draws_$$.out
