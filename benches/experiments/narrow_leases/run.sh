#!/bin/bash
# Many live leases at the head of the fetch range, pgbench (8 clients, -M prepared, 100 transactions each: a fetch
# of 100 and its batched apply) per variant, interleaved. In schemas of its own, narrow_<variant>_<pid>, made anew
# by mk_schema.sh and dropped after each run. VARIANTS, LEASED, PAIRS, ROWS, OUT to change what it runs.
# Per run: items/s, PostgreSQL CPU (every postgres process with the reaped backends: pgcpu.sh), WAL (the server's
# pg_current_wal_lsn), HOT updates of the schema's tables (pg_stat_user_tables), and pg_waldump's per-record
# statistics of the run's WAL range in $OUT.d/.
cd "$(dirname "$0")"
out=${OUT:-/tmp/narrow_leases.txt}; mkdir -p $out.d
P="psql -qAtX -h 127.0.0.1 -U postgres test"
WALDIR=$($P -c "SHOW data_directory")/pg_wal
variants=(${VARIANTS:-base lean sp})
for L in ${LEASED:-0 10000 30000}; do for p in $(seq 1 ${PAIRS:-2}); do
  # Rotate the order from pair to pair.
  n=${#variants[@]}; order=(); for i in $(seq 0 $((n - 1))); do order+=(${variants[$(( (i + p - 1) % n ))]}); done
  for v in ${order[@]}; do
    s=narrow_${v}_$$
    ./mk_schema.sh $s $v ${ROWS:-200000} $L >/tmp/narrow_mk_$$.out 2>&1 || { cat /tmp/narrow_mk_$$.out; exit 1; }
    hotq="SELECT coalesce(sum(n_tup_upd), 0) || ' ' || coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables WHERE schemaname = '$s'"
    h0=($($P -c "$hotq"))
    $P -c CHECKPOINT
    load=$(cut -d' ' -f1 /proc/loadavg)
    c0=$(./pgcpu.sh); l0=$($P -c "SELECT pg_current_wal_lsn()")
    t0=$(date +%s.%N)
    opts="-c search_path=$s"
    # nl: its generic plans were made while `leases` held almost no rows, and chose a sequential scan of it per
    # index entry of the fetch (a planner risk of the design, measured once: 1 009 items/s); the runs measure it
    # with index scans.
    [ $v = nl ] && opts="$opts -c enable_seqscan=off"
    PGOPTIONS="$opts" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c 8 -j 2 -t ${TX:-100} -f round_$v.pgbench test > /tmp/narrow_pgb_$$.out 2>&1
    t1=$(date +%s.%N)
    c1=$(./pgcpu.sh); l1=$($P -c "SELECT pg_current_wal_lsn()")
    load1=$(cut -d' ' -f1 /proc/loadavg)
    sleep 0.5
    case $v in
      lean) items=$($P -c "SELECT count(*) FROM $s.lean_jobs WHERE state = 2") ;;
      base|raw*|nl*|nb*) items=$($P -c "SELECT count(*) FROM $s.resources WHERE status = 'done'") ;;
      *) items=$($P -c "SELECT count(*) FROM $s.sched WHERE status = 'done'") ;;
    esac
    h1=($($P -c "$hotq")); hot="$((h1[0] - h0[0])) $((h1[1] - h0[1]))"
    wal=$($P -c "SELECT pg_wal_lsn_diff('$l1', '$l0')::int8")
    f=$out.d/L${L}_p${p}_$v.waldump
    /usr/lib/postgresql/15/bin/pg_waldump -p $WALDIR -s $l0 -e $l1 --stats=record > $f 2>&1
    secs=$(echo "$t1 - $t0" | bc)
    echo "leased=$L pair=$p variant=$v load=$load/$load1 items=$items secs=$secs items_s=$(echo "$items / $secs" | bc) pg_cpu_us=$(echo "($c1 - $c0) * 1000000 / $items" | bc) wal_b=$((wal / items)) upd_hot=\"$hot\"" | tee -a $out
    grep -i error /tmp/narrow_pgb_$$.out | head -3
    $P -c "DROP SCHEMA $s CASCADE" 2>/dev/null
  done
done; done
