#!/bin/bash
# Sixth round (docs/benchmarks-history.md, "Sixth round: HOT leases"): the drain bench of the engine as it is (`pipeline-base`) against HOT leases
# (`pipeline-hot`: the engine with hot_fetch.patch applied, on a schema changed by hot_schema.sql), interleaved, a
# CHECKPOINT before each drain. Build each binary with `cargo bench --bench pipeline --no-run` and copy it to
# $BINS (default /tmp/hot_leases) under that name. From the repository's root: benches/experiments/hot_leases/drains.sh.
cd "$(dirname "$0")"; B=${BINS:-/tmp/hot_leases}
out=${OUT:-/tmp/hot_leases_drains.txt}
PAIRS=${PAIRS:-4}
one() { # variant case
  local v=$1 c=$2 env=()
  case $c in
    batched) env=(LOCKSTEP_BENCH_DRAIN_ROWS=100000) ;;
    per_item) env=(LOCKSTEP_BENCH_DRAIN_ROWS=10000 LOCKSTEP_BENCH_DRAIN_MODE=per_item) ;;
    slow) env=(LOCKSTEP_BENCH_DRAIN_ROWS=16000 LOCKSTEP_BENCH_DRAIN_PROCESSING_MS=10 LOCKSTEP_BENCH_DRAIN_REPLICAS=4) ;;
  esac
  [ $v = hot ] && env+=(LOCKSTEP_BENCH_SCHEMA_SQL=$PWD/hot_schema.sql)
  psql -qAt -h 127.0.0.1 -U postgres test -c CHECKPOINT
  local load=$(cut -d' ' -f1 /proc/loadavg)
  local r=$(env "${env[@]}" $B/pipeline-$v --bench drain 2>&1 | grep '^RESULT')
  echo "pair=$p variant=$v case=$c load=$load $r" | tee -a $out
}
for p in $(seq 1 $PAIRS); do
  for c in batched per_item slow; do
    if [ $((p % 2)) = 1 ]; then one base $c; one hot $c; else one hot $c; one base $c; fi
  done
done
