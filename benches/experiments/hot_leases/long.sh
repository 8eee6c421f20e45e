#!/bin/bash
# Many live leases at the head of the fetch range (long handlers), pgbench of lockstep's fetch of 100 + batched apply.
# In schemas of its own, hot6_base and hot6_hot (mk_schema.sh makes each anew; dropped after each run). From the
# repository's root: benches/experiments/hot_leases/long.sh (LEASED, PAIRS, OUT to change what it runs and where it writes).
cd "$(dirname "$0")"
out=${OUT:-/tmp/hot_leases_long.txt}
P="psql -qAtX -h 127.0.0.1 -U postgres test"
for L in ${LEASED:-0 1000 10000}; do for p in $(seq 1 ${PAIRS:-2}); do
  order="base hot"; [ $((p % 2)) = 0 ] && order="hot base"
  for v in $order; do
    s=hot6_$v
    ./mk_schema.sh $s $v 200000 $L >/dev/null 2>&1
    $P -c CHECKPOINT
    load=$(cut -d' ' -f1 /proc/loadavg)
    c0=$(./pgcpu.sh); w0=$($P -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8")
    t0=$(date +%s.%N)
    PGOPTIONS="-c search_path=$s" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 8 -j 2 -t 100 -f round_$v.pgbench test > /tmp/hot_leases_pgb.out 2>&1
    t1=$(date +%s.%N)
    c1=$(./pgcpu.sh); w1=$($P -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8")
    sleep 0.5
    items=$($P -c "SELECT count(*) FROM $s.resources WHERE status = 'done'")
    hot=$($P -c "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname = 'resources'")
    lat=$(grep "latency average" /tmp/hot_leases_pgb.out | awk '{print $4}')
    echo "leased=$L pair=$p variant=$v load=$load items=$items secs=$(echo "$t1 - $t0" | bc) pg_cpu_s=$(echo "$c1 - $c0" | bc) wal=$((w1 - w0)) upd_hot=\"$hot\" lat_ms=$lat" | tee -a $out
    grep -i error /tmp/hot_leases_pgb.out | head -2
    $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
  done
done; done
