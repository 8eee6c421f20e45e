#!/bin/bash
# The statements the drain loop does not run, at 30 000 live one-hour leases (LEASED to change): a heartbeat of 100
# leases (rows 1-100, one batch in nb) and the next expiry, base against nb, pgbench 1 client, -M prepared;
# latency, WAL per call (server-wide), HOT share. Schemas of its own, dropped after.
cd "$(dirname "$0")"
P="psql -qAtX -h 127.0.0.1 -U postgres test"
L=${LEASED:-30000}
for v in base nb base nb; do
  s=narrow_side_${v}_$$
  ./mk_schema.sh $s $v 200000 $L >/dev/null 2>&1
  [ $v = nb ] && PGOPTIONS="-c search_path=$s" $P -f nb_statements.sql >/dev/null
  ids=$($P -c "SELECT array_agg(id ORDER BY id)::text FROM $s.resources WHERE id <= 100")
  toks=$($P -c "SELECT array_agg(lock_token ORDER BY id)::text FROM $s.resources WHERE id <= 100")
  # pgbench has no psql variables: write the heartbeat with its values as literals.
  sed -e "s/:'ids'/'$ids'/g" -e "s/:'toks'/'$toks'/g" -e "s/:'off'/'0 seconds'/g" -e "s/:'ttl'/'1 hour'/g" heartbeat_$v.sql \
    | grep -v '^--' | tr '\n' ' ' > /tmp/narrow_side_hb_$$.pgbench; echo >> /tmp/narrow_side_hb_$$.pgbench
  if [ $v = nb ]; then echo "SELECT nb_next_expiry('0 seconds', 'job', '{ready}');" > /tmp/narrow_side_ne_$$.pgbench
  else echo "SELECT (extract(epoch FROM min(lock_expires_at) - lockstep_now('0 seconds')) * 1000000)::int8 FROM resources WHERE kind = 'job' AND status = ANY('{ready}') AND lock_expires_at > lockstep_now('0 seconds') AND isfinite(lock_expires_at);" > /tmp/narrow_side_ne_$$.pgbench; fi
  for w in hb ne; do
    hotq="SELECT coalesce(sum(n_tup_upd), 0) || ' ' || coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables WHERE schemaname = '$s'"
    h0=($($P -c "$hotq")); $P -c CHECKPOINT; l0=$($P -c "SELECT pg_current_wal_lsn()")
    PGOPTIONS="-c search_path=$s" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 1 -t ${TX:-300} -f /tmp/narrow_side_${w}_$$.pgbench test > /tmp/narrow_side_pgb_$$.out 2>&1
    l1=$($P -c "SELECT pg_current_wal_lsn()"); sleep 0.5; h1=($($P -c "$hotq"))
    grep -i error /tmp/narrow_side_pgb_$$.out | head -2
    echo "variant=$v leased=$L stmt=$w load=$(cut -d' ' -f1 /proc/loadavg) lat_ms=$(grep 'latency average' /tmp/narrow_side_pgb_$$.out | awk '{print $4}') wal_per_call=$(( $($P -c "SELECT pg_wal_lsn_diff('$l1', '$l0')::int8") / ${TX:-300} )) upd_hot=\"$((h1[0] - h0[0])) $((h1[1] - h0[1]))\""
  done
  $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
done
