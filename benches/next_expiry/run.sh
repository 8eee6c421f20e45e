#!/bin/bash
# The next-expiry read (NEXT_EXPIRY in src/store/pg/sql.rs) before and after one indexed min per status
# (seventh round), at 0 to 30 000 live leases on the rows it looks at. pgbench, 1 client, -M prepared (the
# parameters are bound, as sqlx binds them, so the connection runs the statement's generic plan after five calls),
# TX calls a run, one status ('{ready}') and two ('{ready,retrying}'); before and after interleaved (before first in
# odd pairs), in one schema per lease count, ne_<pid> (mk_schema.sh), dropped after.
# Per run: mean latency (pgbench, a round trip included: the server's CPU is shared with other sessions, which a
# run this short cannot tell apart). Per lease count, variant and statuses once: the generic plan's EXPLAIN (ANALYZE,
# BUFFERS), its execution time and shared buffers (explain.sh). LEASED, PAIRS, TX, OUT to change what it runs. From
# the repository's root: benches/next_expiry/run.sh.
cd "$(dirname "$0")"
out=${OUT:-/tmp/next_expiry.txt}
P="psql -qAtX -h 127.0.0.1 -U postgres test"
tx=${TX:-2000}
for L in ${LEASED:-0 1000 10000 30000}; do
  s=ne_$$
  ./mk_schema.sh $s 200000 $L >/tmp/ne_mk_$$.out 2>&1 || { cat /tmp/ne_mk_$$.out; exit 1; }
  for statuses in '{ready}' '{ready,retrying}'; do
    for v in before after; do
      echo "leased=$L statuses=$statuses variant=$v $(./explain.sh $s $v "$statuses")" | tee -a $out
    done
    for p in $(seq 1 ${PAIRS:-3}); do
      order="before after"; [ $((p % 2)) = 0 ] && order="after before"
      for v in $order; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        PGOPTIONS="-c search_path=$s" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 1 -t $tx \
          -D offset=0 -D kind=job -D "statuses=$statuses" -f next_expiry_$v.pgbench test > /tmp/ne_pgb_$$.out 2>&1
        lat=$(grep 'latency average' /tmp/ne_pgb_$$.out | awk '{print $4}')
        echo "leased=$L statuses=$statuses pair=$p variant=$v load=$load lat_ms=$lat" | tee -a $out
        grep -i error /tmp/ne_pgb_$$.out | head -2
      done
    done
  done
  $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
done
rm -f /tmp/ne_mk_$$.out /tmp/ne_pgb_$$.out
