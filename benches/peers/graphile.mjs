// One drain of graphile-worker (docs/benchmarks-history.md, "Peers in the same run"): migrate graphile-worker into
// a schema of
// its own, fill it with N no-op jobs, run one worker process with 8-way concurrency until every job is done, and
// print one result line (items, seconds, PostgreSQL CPU seconds, this process's CPU seconds, WAL bytes) for
// `benches/peers/run.sh` to read. The schema is dropped afterwards.
//
//   node graphile.mjs <database url> <schema> <jobs> <batched|default>
//
// Run from the folder graphile-worker is installed in (run.sh installs a pinned version outside the repository).
// "batched" is graphile-worker's batched mode: `localQueue.size` 500 and `completeJobBatchDelay` 0; "default"
// leaves both at their defaults (a fetch per job, a completion per job).

import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.cwd(), "package.json"));
const { run, runMigrations, Logger } = require("graphile-worker");
const pg = require("pg");

const [url, schema, jobsText, mode] = process.argv.slice(2);
const jobs = Number(jobsText);
if (!url || !/^[a-z_][a-z0-9_]*$/.test(schema ?? "") || !(jobs > 0) || !["batched", "default"].includes(mode)) {
  console.error("usage: node graphile.mjs <database url> <schema: [a-z_][a-z0-9_]*> <jobs > 0> <batched|default>");
  process.exit(2);
}
const CONCURRENCY = 8;
const FILL_BATCH = 10000;
// How often the drain's end is checked once every handler has run (the last completions may still be in flight).
const DONE_POLL_MS = 20;

// CPU seconds of every process named `postgres` (the server and its backends), from /proc (USER_HZ = 100), with the
// CPU of ended backends that the postmaster reaped (its cutime and cstime), as run.sh and the Rust bench count.
function postgresCpuSecs() {
  let ticks = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/comm`, "utf8").trim() !== "postgres") continue;
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      ticks += [14, 15, 16, 17].reduce((sum, field) => sum + Number(fields[field - 3]), 0);
    } catch {
      // The process ended between the listing and the read.
    }
  }
  return ticks / 100;
}

function selfCpuSecs() {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1e6;
}

const quiet = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

const client = new pg.Client({ connectionString: url });
await client.connect();
const walBytes = async () =>
  BigInt((await client.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8 AS b")).rows[0].b);

try {
  await runMigrations({ connectionString: url, schema, logger: quiet });
  for (let filled = 0; filled < jobs; filled += FILL_BATCH) {
    const n = Math.min(FILL_BATCH, jobs - filled);
    await client.query(
      `SELECT count(*) FROM "${schema}".add_jobs(ARRAY(
         SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::"${schema}".job_spec
         FROM generate_series(1, $1)))`,
      [n],
    );
  }
  await client.query(`VACUUM ANALYZE "${schema}"._private_jobs`);

  let handled = 0;
  const worker = mode === "batched" ? { localQueue: { size: 500 }, completeJobBatchDelay: 0 } : {};
  const db0 = postgresCpuSecs();
  const self0 = selfCpuSecs();
  const wal0 = await walBytes();
  const start = process.hrtime.bigint();
  const runner = await run({
    connectionString: url,
    schema,
    concurrency: CONCURRENCY,
    noHandleSignals: true,
    logger: quiet,
    taskList: {
      noop: async () => {
        handled += 1;
      },
    },
    preset: { worker },
  });
  // Done when every handler has run and no job is left in the table (a completed job is deleted).
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, DONE_POLL_MS));
    if (handled < jobs) continue;
    const left = await client.query(`SELECT EXISTS (SELECT 1 FROM "${schema}"._private_jobs) AS any`);
    if (!left.rows[0].any) break;
  }
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  const db1 = postgresCpuSecs();
  const self1 = selfCpuSecs();
  const wal1 = await walBytes();
  await runner.stop();
  console.log(
    `RESULT graphile_${mode} items=${jobs} secs=${secs.toFixed(3)} db_cpu_s=${(db1 - db0).toFixed(2)} ` +
      `client_cpu_s=${(self1 - self0).toFixed(2)} wal_bytes=${wal1 - wal0}`,
  );
} finally {
  await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await client.end();
}
