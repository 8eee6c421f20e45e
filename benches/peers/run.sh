#!/usr/bin/env bash
# Peers in the same run (BENCHMARKS.md): drains of pre-filled no-op items on one PostgreSQL, lockstep and
# its peers interleaved repetition by repetition, each in a scoped schema of its own that is dropped afterwards:
#
#   graphile_batched  graphile-worker (a pinned version, installed by npm into $PEERS_DIR, outside the repository),
#                     one process, concurrency 8, localQueue.size 500, completeJobBatchDelay 0
#   graphile_default  the same with graphile-worker's defaults (GRAPHILE_DEFAULT_ITEMS items: it is ~10x slower)
#   pgbench_lean      pgbench, 8 clients: claim 100 with SKIP LOCKED + complete, on a lean table with a partial
#                     index on pending rows (lean.sql, lean_claim_complete.pgbench)
#   pgbench_raw       the same claim and completion on lockstep's own table and SQL (migrations/, raw_sql.rs)
#   lockstep_1x8      lockstep, default config, 1 replica x 8 workers (`cargo bench --bench pipeline -- drain`)
#   lockstep_2x8      lockstep, 2 replicas x 8 workers
#   pgbench_raw1      the raw line claiming 1 row per statement (raw1_claim_complete.pgbench), PEERS_PER_ITEM_ITEMS
#   lockstep_1x8_per_item  lockstep in per-item mode (one row per fetch, apply and refetch batching off, a fetch
#                     loop per worker), 1 x 8,
#                     PEERS_PER_ITEM_ITEMS items
#   lockstep_1x8_10ms lockstep, default config, 1 x 8, each item processed in 10 ms (a sleep), PEERS_SLOW_ITEMS
#                     items: throughput should follow workers / processing time (800/s)
#
#   benches/peers/run.sh            # from the repository's root
#
# Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test), PEERS_ITEMS (200000),
# GRAPHILE_DEFAULT_ITEMS (PEERS_ITEMS / 10), PEERS_PER_ITEM_ITEMS (PEERS_ITEMS / 20), PEERS_SLOW_ITEMS (PEERS_ITEMS
# / 25), PEERS_REPS (3), PEERS_CONTENDERS (all nine, in the order above),
# PEERS_DIR (/tmp/lockstep-peers), GRAPHILE_WORKER_VERSION (0.18.0), PEERS_OUT (a results file; default
# $PEERS_DIR/results-<time>.txt). Prints one RESULT line per drain as it ends, then a Markdown table: median items/s,
# ratios of lockstep to the peers measured in the same repetition, and per item CPU (PostgreSQL's processes and the
# client's), WAL bytes, and the share of HOT updates on the drained table. A peer that cannot be installed or run is
# reported as missing in the table.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPO=$PWD
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
PEERS_ITEMS=${PEERS_ITEMS:-200000}
GRAPHILE_DEFAULT_ITEMS=${GRAPHILE_DEFAULT_ITEMS:-$((PEERS_ITEMS / 10))}
PEERS_PER_ITEM_ITEMS=${PEERS_PER_ITEM_ITEMS:-$((PEERS_ITEMS / 20))}
PEERS_SLOW_ITEMS=${PEERS_SLOW_ITEMS:-$((PEERS_ITEMS / 25))}
PEERS_REPS=${PEERS_REPS:-3}
PEERS_CONTENDERS=${PEERS_CONTENDERS:-graphile_batched graphile_default pgbench_lean pgbench_raw lockstep_1x8 lockstep_2x8
  pgbench_raw1 lockstep_1x8_per_item lockstep_1x8_10ms}
PEERS_DIR=${PEERS_DIR:-/tmp/lockstep-peers}
GRAPHILE_WORKER_VERSION=${GRAPHILE_WORKER_VERSION:-0.18.0}
mkdir -p "$PEERS_DIR"
PEERS_OUT=${PEERS_OUT:-$PEERS_DIR/results-$(date -u +%Y%m%dT%H%M%S).txt}
: >"$PEERS_OUT"
PEERS=$REPO/benches/peers
CLIENTS=8
BATCH=100
GRAPHILE_DIR=$PEERS_DIR/graphile-worker-$GRAPHILE_WORKER_VERSION

note() { echo "[peers] $*" >&2; }
missing() { echo "MISSING $1 reason=$2" | tee -a "$PEERS_OUT"; }
QUIET="-c client_min_messages=warning"
sql() { PGOPTIONS=${PGOPTIONS:-$QUIET} psql -qtAX -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }
in_schema() { PGOPTIONS="-c search_path=$1 $QUIET" "${@:2}"; }

# CPU seconds of every process named postgres (USER_HZ = 100), with the CPU of the ended backends the postmaster
# reaped (its cutime and cstime: pgbench's sessions end before the second reading), and the WAL position in bytes.
postgres_cpu() {
  local ticks=0 pid stat rest
  for pid in /proc/[0-9]*; do
    [[ $(cat "$pid/comm" 2>/dev/null) == postgres ]] || continue
    stat=$(cat "$pid/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    read -r -a f <<<"$rest"
    ticks=$((ticks + f[11] + f[12] + f[13] + f[14]))
  done
  echo "scale=2; $ticks / 100" | bc
}
wal() { sql -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8"; }
# Updates and HOT updates of table $2 in schema $1 (read after the clients ended, so their counters are flushed).
updates() {
  sql -c "SELECT 'upd=' || n_tup_upd || ' hot_upd=' || n_tup_hot_upd FROM pg_stat_user_tables
          WHERE schemaname = '$1' AND relname = '$2'"
}

install_graphile() {
  if [[ -f $GRAPHILE_DIR/node_modules/graphile-worker/package.json ]]; then return 0; fi
  command -v npm >/dev/null || return 1
  mkdir -p "$GRAPHILE_DIR"
  (cd "$GRAPHILE_DIR" && echo '{"name":"lockstep-peers","private":true}' >package.json &&
    npm install --no-audit --no-fund --loglevel=error "graphile-worker@$GRAPHILE_WORKER_VERSION" >&2)
}

graphile() { # mode items
  local schema="peer_gw_$$_$1"
  (cd "$GRAPHILE_DIR" && node "$PEERS/graphile.mjs" "$DATABASE_URL" "$schema" "$2" "$1") | grep '^RESULT'
}

# A pgbench drain: schema $1 already filled with $2 claimable rows of table $3; script $4 (claiming $7 rows, default
# BATCH, per transaction); done rows counted by $5; RESULT label $6.
pgbench_drain() {
  local schema=$1 items=$2 table=$3 script=$4 done_sql=$5 label=$6 batch=${7:-$BATCH}
  local per_client=$(((items + CLIENTS * batch - 1) / (CLIENTS * batch)))
  sql -c "VACUUM ANALYZE $schema.$table"
  local db0 wal0 t0 t1 db1 wal1 done
  db0=$(postgres_cpu) wal0=$(wal) t0=$(date +%s.%N)
  in_schema "$schema" pgbench -n -M prepared -c $CLIENTS -j 2 -t "$per_client" -f "$script" "$DATABASE_URL" \
    >"$PEERS_DIR/pgbench.log" 2>&1 || { cat "$PEERS_DIR/pgbench.log" >&2; return 1; }
  t1=$(date +%s.%N) db1=$(postgres_cpu) wal1=$(wal)
  done=$(sql -c "SELECT count(*) FROM $schema.$table WHERE $done_sql")
  echo "RESULT $label items=$done secs=$(echo "$t1 - $t0" | bc) db_cpu_s=$(echo "$db1 - $db0" | bc)" \
    "client_cpu_s=- wal_bytes=$((wal1 - wal0)) $(updates "$schema" "$table")"
}

pgbench_lean() {
  local schema="peer_lean_$$"
  sql -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema"
  in_schema "$schema" sql -f "$PEERS/lean.sql" \
    -c "INSERT INTO lean_jobs (state) SELECT 0 FROM generate_series(1, $PEERS_ITEMS)"
  pgbench_drain "$schema" "$PEERS_ITEMS" lean_jobs "$PEERS/lean_claim_complete.pgbench" "state = 2" pgbench_lean
  sql -c "DROP SCHEMA $schema CASCADE"
}

pgbench_raw() { # items script label batch
  local schema="peer_raw_$$" m
  sql -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema"
  for m in "$REPO"/migrations/*.sql; do in_schema "$schema" sql -f "$m"; done
  # raw_sql.rs FILL: ready rows of kind job, unleased and never processed.
  in_schema "$schema" sql -c "INSERT INTO resources (kind, status, data, created_at, updated_at)
                              SELECT 'job', 'ready', '{}', now(), now() FROM generate_series(1, $1)"
  pgbench_drain "$schema" "$1" resources "$PEERS/$2" "status = 'done'" "$3" "$4"
  sql -c "DROP SCHEMA $schema CASCADE"
}

LOCKSTEP_BENCH_BIN=
lockstep() { # replicas [rows mode processing_ms]
  LOCKSTEP_BENCH_DRAIN_ROWS=${2:-$PEERS_ITEMS} LOCKSTEP_BENCH_DRAIN_REPLICAS=$1 LOCKSTEP_BENCH_DRAIN_MODE=${3:-batched} \
    LOCKSTEP_BENCH_DRAIN_PROCESSING_MS=${4:-0} "$LOCKSTEP_BENCH_BIN" --bench drain | grep '^RESULT'
}

GRAPHILE_OK=yes
if [[ " $PEERS_CONTENDERS " == *" graphile_"* ]]; then
  if ! install_graphile; then
    GRAPHILE_OK="npm install graphile-worker@$GRAPHILE_WORKER_VERSION failed"
  elif ! command -v node >/dev/null; then
    GRAPHILE_OK="node not found"
  fi
fi
if [[ " $PEERS_CONTENDERS " == *" lockstep_"* ]]; then
  note "building the pipeline bench (release)"
  LOCKSTEP_BENCH_BIN=$(cargo bench --bench pipeline --no-run 2>&1 | sed -n 's/.*Executable.*(\(.*\)).*/\1/p' | tail -1)
  [[ -x $LOCKSTEP_BENCH_BIN ]] || { echo "could not build the pipeline bench" >&2; exit 1; }
fi

{
  echo "MACHINE $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc), $(uname -r)"
  echo "POSTGRES $(sql -c "SELECT current_setting('server_version') || ', synchronous_commit ' ||
    current_setting('synchronous_commit') || ', fsync ' || current_setting('fsync')")"
  echo "ITEMS $PEERS_ITEMS graphile_default=$GRAPHILE_DEFAULT_ITEMS per_item=$PEERS_PER_ITEM_ITEMS" \
    "slow=$PEERS_SLOW_ITEMS reps=$PEERS_REPS"
  echo "LOAD_BEFORE $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$PEERS_OUT"

for rep in $(seq 1 "$PEERS_REPS"); do
  for c in $PEERS_CONTENDERS; do
    note "rep $rep/$PEERS_REPS: $c"
    line=
    case $c in
      graphile_batched | graphile_default)
        if [[ $GRAPHILE_OK != yes ]]; then
          missing "$c" "$GRAPHILE_OK"
          continue
        fi
        items=$PEERS_ITEMS
        [[ $c == graphile_default ]] && items=$GRAPHILE_DEFAULT_ITEMS
        line=$(graphile "${c#graphile_}" "$items") || true ;;
      pgbench_lean) line=$(pgbench_lean) || true ;;
      pgbench_raw) line=$(pgbench_raw "$PEERS_ITEMS" raw_claim_complete.pgbench pgbench_raw "$BATCH") || true ;;
      pgbench_raw1) line=$(pgbench_raw "$PEERS_PER_ITEM_ITEMS" raw1_claim_complete.pgbench pgbench_raw1 1) || true ;;
      lockstep_1x8) line=$(lockstep 1) || true ;;
      lockstep_2x8) line=$(lockstep 2) || true ;;
      lockstep_1x8_per_item) line=$(lockstep 1 "$PEERS_PER_ITEM_ITEMS" per_item) || true ;;
      lockstep_1x8_10ms) line=$(lockstep 1 "$PEERS_SLOW_ITEMS" batched 10) || true ;;
      *) echo "unknown contender $c" >&2; exit 2 ;;
    esac
    if [[ $line == RESULT* ]]; then
      echo "$line rep=$rep" | tee -a "$PEERS_OUT"
    else
      missing "$c" "run failed (rep $rep)"
    fi
  done
done
echo "LOAD_AFTER $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$PEERS_OUT"
note "raw results in $PEERS_OUT"
"$PEERS/summary.sh" "$PEERS_OUT"
