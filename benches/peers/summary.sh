#!/usr/bin/env bash
# The Markdown table of a `benches/peers/run.sh` results file (its argument): per contender the median items/s over
# the repetitions, the half spread, the ratios of its rate to graphile-worker's batched mode and to the lean pgbench
# line measured in the same repetition (median over repetitions), and per item CPU (PostgreSQL's processes; the
# client's where the runner measures it), WAL bytes and the share of updates that were HOT. Medians of the per-item
# costs too. Lines with a reference of their own show their ratio to it instead of the two peers': per-item mode
# (`*_per_item`) against the one-row raw line (`pgbench_raw1`) of the same repetition, a line with processing time
# (`lockstep_<r>x<w>_<ms>ms`) against workers / processing time (r × w × 1000 / ms items/s).
set -euo pipefail
exec gawk '
function median(list,    n, a, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  if (n == 0) return ""
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function spread(list,    n, a, i, lo, hi) {
  n = split(list, a, " "); lo = hi = a[1] + 0
  for (i = 2; i <= n; i++) { if (a[i] + 0 < lo) lo = a[i] + 0; if (a[i] + 0 > hi) hi = a[i] + 0 }
  return (hi - lo) / 2
}
function add(key, value) { values[key] = (key in values) ? values[key] " " value : value }
function fmt(x) { return x == "" ? "–" : sprintf("%\047.0f", x) }
/^(MACHINE|POSTGRES|ITEMS|LOAD_BEFORE|LOAD_AFTER) / { header = header "\n" $0; next }
/^MISSING / { miss[$2] = substr($0, index($0, "reason=") + 7); if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } ; next }
/^RESULT / {
  label = $2; delete f
  for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
  if (!(label in seen)) { seen[label] = 1; order[++n] = label }
  rate = f["items"] / f["secs"]; rates[label, f["rep"]] = rate; reps[f["rep"]] = 1
  add(label SUBSEP "rate", rate)
  add(label SUBSEP "items", f["items"])
  add(label SUBSEP "db", f["db_cpu_s"] * 1e6 / f["items"])
  if (f["client_cpu_s"] != "-") add(label SUBSEP "client", f["client_cpu_s"] * 1e6 / f["items"])
  add(label SUBSEP "wal", f["wal_bytes"] / f["items"])
  if (f["upd"] > 0) add(label SUBSEP "hot", 100 * f["hot_upd"] / f["upd"])
}
END {
  print "Run:" header "\n"
  print "| system | items | items/s (median) | ± half spread | ÷ graphile batched | ÷ pgbench lean | ÷ own reference | PG CPU µs/item | client CPU µs/item | WAL bytes/item | HOT updates |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (k = 1; k <= n; k++) {
    l = order[k]
    if (!((l SUBSEP "rate") in values)) { printf "| %s | missing: %s | | | | | | | | | |\n", l, miss[l]; continue }
    m = median(values[l, "rate"])
    split("graphile_batched pgbench_lean", names, " ")
    cells = ""
    own = "–"
    if (l ~ /_per_item$/) {
      list = ""
      for (rep in reps) if (((l, rep) in rates) && (("pgbench_raw1", rep) in rates)) list = list " " rates[l, rep] / rates["pgbench_raw1", rep]
      own = list == "" ? "–" : sprintf("%.2f (÷ pgbench_raw1)", median(list))
    } else if (match(l, /_([0-9]+)x([0-9]+)_([0-9]+)ms$/, g)) {
      expected = g[1] * g[2] * 1000 / g[3]
      own = sprintf("%.2f (÷ %d/s)", m / expected, expected)
    }
    for (r = 1; r <= 2; r++) {
      list = ""
      if (own == "–") for (rep in reps) if (((l, rep) in rates) && ((names[r], rep) in rates)) list = list " " rates[l, rep] / rates[names[r], rep]
      cells = cells sprintf(" %s |", list == "" ? "–" : sprintf("%.2f", median(list)))
    }
    cells = cells " " own " |"
    hot = ((l SUBSEP "hot") in values) ? sprintf("%.0f %%", median(values[l, "hot"])) : "–"
    client = ((l SUBSEP "client") in values) ? fmt(median(values[l, "client"])) : "–"
    printf "| %s | %s | %s | ±%.0f%% |%s %s | %s | %s | %s |\n", l, fmt(median(values[l, "items"])), fmt(m),
      100 * spread(values[l, "rate"]) / m, cells, fmt(median(values[l, "db"])), client, fmt(median(values[l, "wal"])), hot
  }
}' "$1"
