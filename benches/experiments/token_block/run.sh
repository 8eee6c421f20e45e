#!/bin/bash
# One token draw per fetch against one per row, at the SQL level (seventh round). pgbench, 8 clients,
# -M prepared, CHECKPOINT before each run, base and block interleaved (base first in odd pairs, block first in even
# ones), each run in a fresh schema tb_<variant>_<pid> (mk_schema.sh: 200 000 ready rows), dropped after.
#   batched:  100 transactions a client, each a fetch of 100 and the batched apply of what it leased (80 000 items)
#   per_item: 1 000 transactions a client, each a fetch of 1 and the lone lease's apply (8 000 items)
# Per run: items/s, PostgreSQL CPU per item (every postgres process with the reaped backends, pgcpu.sh: other
# sessions of the server count too), WAL per item (the server's pg_current_wal_lsn), the sequence's draws.
# MODES, PAIRS, ROWS, OUT to change what it runs. From the repository's root: benches/experiments/token_block/run.sh.
cd "$(dirname "$0")"
./gen.sh
out=${OUT:-/tmp/token_block.txt}
P="psql -qAtX -h 127.0.0.1 -U postgres test"
for m in ${MODES:-batched per_item}; do
  tx=100; [ $m = per_item ] && tx=1000
  for p in $(seq 1 ${PAIRS:-6}); do
    order="base block"; [ $((p % 2)) = 0 ] && order="block base"
    for v in $order; do
      s=tb_${v}_$$
      ./mk_schema.sh $s $v ${ROWS:-200000} >/tmp/tb_mk_$$.out 2>&1 || { cat /tmp/tb_mk_$$.out; exit 1; }
      $P -c CHECKPOINT
      load=$(cut -d' ' -f1 /proc/loadavg)
      c0=$(./pgcpu.sh); l0=$($P -c "SELECT pg_current_wal_lsn()")
      t0=$(date +%s.%N)
      PGOPTIONS="-c search_path=$s" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 8 -j 2 -t $tx \
        -f round_${m}_$v.pgbench test > /tmp/tb_pgb_$$.out 2>&1
      t1=$(date +%s.%N)
      c1=$(./pgcpu.sh); l1=$($P -c "SELECT pg_current_wal_lsn()")
      load1=$(cut -d' ' -f1 /proc/loadavg)
      items=$($P -c "SELECT count(*) FROM $s.resources WHERE status = 'done'")
      draws=$($P -c "SELECT (last_value - 1) / CASE WHEN '$v' = 'block' THEN 1024 ELSE 1 END + 1 FROM $s.lock_tokens")
      wal=$($P -c "SELECT pg_wal_lsn_diff('$l1', '$l0')::int8")
      secs=$(echo "$t1 - $t0" | bc)
      echo "mode=$m pair=$p variant=$v load=$load/$load1 items=$items secs=$secs items_s=$(echo "$items / $secs" | bc) pg_cpu_us=$(echo "scale=1; ($c1 - $c0) * 1000000 / $items" | bc) wal_b=$((wal / items)) draws=$draws" | tee -a $out
      grep -i error /tmp/tb_pgb_$$.out | head -3
      $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
    done
  done
done
rm -f /tmp/tb_mk_$$.out /tmp/tb_pgb_$$.out
