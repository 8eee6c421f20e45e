//! Sweeps of many seeds (`lockstep sim sweep`, `sim merge`): which seeds a shard runs, the result file a sweep
//! streams as it goes, and the table of outcomes, from a running sweep or from the result files of its shards.
//!
//! **Memory stays flat in the number of seeds.** A sweep keeps per seed only what its table needs, and only as
//! counts ([`Tally`]: seeds by outcome and by failed checker, simulated time summed and its maximum); each seed's
//! [`SeedRecord`] goes to the result file as it finishes, a failing seed's replay file is written then too, and
//! the report (with its trace) is dropped. A killed sweep loses none of the seeds it finished: they are lines of
//! its result file.
//!
//! **Shards.** `--shard K/N` runs the K-th (from 0) of N disjoint slices of `A..B`, strided: the seeds `s` with
//! `(s - A) % N == K` ([`Shard`]). Strided slices cost about the same (a range's seeds are alike in cost, and
//! each slice samples all of it) and a shard that stops early has still covered the range evenly. Without
//! `--shard`, K and N come from the variables of the engine running the sweep ([`Shard::from_env`]): a
//! Kubernetes Indexed Job's `JOB_COMPLETION_INDEX` (with `LOCKSTEP_SHARD_COUNT`: Kubernetes does not pass the
//! completion count to its pods), a Slurm array's `SLURM_ARRAY_TASK_ID` and `SLURM_ARRAY_TASK_COUNT`, a
//! YTsaurus vanilla task's `YT_JOB_COOKIE` and `YT_TASK_JOB_COUNT`.
//!
//! **Result files** are JSON lines ([`Line`]): a [`Header`] (format, build, scenario name and version, the seed
//! range, the shard), one [`SeedRecord`] per finished seed in completion order (a failing seed's record carries
//! its whole replay file), and an [`End`] when the sweep ends (`interrupted` if Ctrl-C stopped it). Every line
//! is one `write` of a whole line, so a killed sweep's file ends at a line's end. `sim merge` reads the files of
//! all shards (several shards' lines may share one file: a YTsaurus output table read back is one), refuses
//! shards of another build, scenario version, seed range or shard count, and prints the table an unsharded
//! sweep of the range prints ([`merge`]).

use super::replay::{ReplayFile, ReplayScenario};
use super::run::{RunReport, summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The result file format this build writes and reads.
pub const SWEEP_FORMAT: u32 = 1;

/// The variable giving a Kubernetes Indexed Job's shard count (its `completions`), which Kubernetes does not pass
/// to its pods itself.
pub const SHARD_COUNT_VAR: &str = "LOCKSTEP_SHARD_COUNT";

/// The most shards a sweep is split into (a sweep runs at most a million seeds; more shards than that would run
/// nothing).
pub const SHARDS_MAX: u64 = 1_000_000;

/// One of `count` disjoint slices of a seed range: the seeds `s` of `first..=last` with
/// `(s - first) % count == index`. `index` counts from 0; `count` is at least 1 (1: the whole range).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// Which slice, from 0, below `count`.
    pub index: u64,
    /// How many slices, 1..=[`SHARDS_MAX`].
    pub count: u64,
}

impl Shard {
    /// The whole range: shard 0 of 1.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Reads `K/N` (`--shard`), e.g. `0/4`: K from 0, below N; N at most [`SHARDS_MAX`].
    ///
    /// Errors: text not of that shape, or K not below N, naming the value and the rule.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let bad = || format!("\"{text}\" is not a shard: write K/N, the K-th (from 0) of N slices, e.g. 0/4");
        let (index, count) = text.split_once('/').ok_or_else(bad)?;
        let index = index.trim().parse::<u64>().map_err(|_| bad())?;
        let count = count.trim().parse::<u64>().map_err(|_| bad())?;
        Shard::checked(index, count).map_err(|rule| format!("\"{text}\": {rule}"))
    }

    fn checked(index: u64, count: u64) -> Result<Shard, String> {
        if count == 0 || count > SHARDS_MAX {
            return Err(format!("the shard count must be 1..={SHARDS_MAX}, not {count}"));
        }
        if index >= count {
            return Err(format!("shard {index} does not exist: shards count from 0 and there are {count}"));
        }
        Ok(Shard { index, count })
    }

    /// The shard the engine running this process gives it, read with `var` (the process's environment:
    /// `|name| std::env::var(name).ok()`), and the variables it came from; `None` when no engine's variable is
    /// set. Read in this order, the first engine whose index variable is set wins:
    /// - Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` (from 0) of [`SHARD_COUNT_VAR`] (set it in the pod
    ///   template to the Job's `completions`);
    /// - Slurm job array: (`SLURM_ARRAY_TASK_ID` − `SLURM_ARRAY_TASK_MIN`) / `SLURM_ARRAY_TASK_STEP` (the minimum
    ///   0 and the step 1 when unset) of `SLURM_ARRAY_TASK_COUNT`: `--array=0-3` and `--array=1-4` both make
    ///   shards 0..4 of 4;
    /// - YTsaurus vanilla task: `YT_JOB_COOKIE` (from 0) of `YT_TASK_JOB_COUNT` (the task's `job_count`).
    ///
    /// Errors: a variable that is not a whole number, a count variable missing, [`SHARD_COUNT_VAR`] set without
    /// `JOB_COMPLETION_INDEX`, a Slurm step of 0, an index not below the count; each message names the variables
    /// and their values as set.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<(Shard, String)>, String> {
        let number = |name: &str, rule: &str| -> Result<Option<u64>, String> {
            match var(name) {
                None => Ok(None),
                Some(value) => value
                    .trim()
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("{name}={value:?} is not a shard {rule}: it must be a whole number")),
            }
        };
        let required = |name: &str, rule: &str, index_name: &str| -> Result<u64, String> {
            number(name, rule)?
                .ok_or_else(|| format!("{index_name} is set but {name} is not: set it to the number of shards"))
        };
        let shard = |index: u64, count: u64, origin: String| -> Result<Option<(Shard, String)>, String> {
            Shard::checked(index, count)
                .map(|shard| Some((shard, origin.clone())))
                .map_err(|rule| format!("{origin}: {rule}"))
        };
        if let Some(index) = number("JOB_COMPLETION_INDEX", "index")? {
            let count = required(SHARD_COUNT_VAR, "count", "JOB_COMPLETION_INDEX")?;
            return shard(index, count, format!("JOB_COMPLETION_INDEX={index}, {SHARD_COUNT_VAR}={count}"));
        }
        if let Some(count) = var(SHARD_COUNT_VAR) {
            // Ours, set only in a Kubernetes Indexed Job's pod template: without the index Kubernetes sets beside
            // it, the sweep would run every seed in every pod.
            return Err(format!(
                "{SHARD_COUNT_VAR}={count:?} is set but JOB_COMPLETION_INDEX is not: it gives a Kubernetes Indexed \
                 Job's shard count, whose index Kubernetes sets (completionMode: Indexed); unset it, or give --shard K/N"
            ));
        }
        if let Some(id) = number("SLURM_ARRAY_TASK_ID", "index")? {
            let count = required("SLURM_ARRAY_TASK_COUNT", "count", "SLURM_ARRAY_TASK_ID")?;
            let min = number("SLURM_ARRAY_TASK_MIN", "index")?;
            let step = number("SLURM_ARRAY_TASK_STEP", "step")?;
            // The variables as they were set (an unset one is not named), in every message.
            let origin = [
                Some(format!("SLURM_ARRAY_TASK_ID={id}")),
                min.map(|min| format!("SLURM_ARRAY_TASK_MIN={min}")),
                step.map(|step| format!("SLURM_ARRAY_TASK_STEP={step}")),
                Some(format!("SLURM_ARRAY_TASK_COUNT={count}")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            // Slurm sets the step of `--array=A-B:S` (S ≥ 1; 1 when not given): 0 is not a step of any array.
            if step == Some(0) {
                return Err(format!("{origin}: the step must be at least 1 (Slurm's `--array=A-B:S` has S ≥ 1)"));
            }
            let (min, step) = (min.unwrap_or(0), step.unwrap_or(1));
            let offset = id.checked_sub(min).ok_or_else(|| format!("{origin}: the task id is below the minimum"))?;
            if offset % step != 0 {
                return Err(format!("{origin}: the task id is not the minimum plus a multiple of the step"));
            }
            return shard(offset / step, count, origin);
        }
        if let Some(index) = number("YT_JOB_COOKIE", "index")? {
            let count = required("YT_TASK_JOB_COUNT", "count", "YT_JOB_COOKIE")?;
            return shard(index, count, format!("YT_JOB_COOKIE={index}, YT_TASK_JOB_COUNT={count}"));
        }
        Ok(None)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The seeds a sweep (or one shard of it) runs: `first..=last` sliced by `shard`. Never listed in memory: the
/// i-th seed is computed ([`Seeds::nth`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seeds {
    /// The range's first seed.
    pub first: u64,
    /// The range's last seed (included).
    pub last: u64,
}

impl Seeds {
    /// Seeds in the whole range.
    pub fn range_len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// The `i`-th seed of `shard`'s slice (from 0), if the slice has that many.
    pub fn nth(&self, shard: Shard, i: u64) -> Option<u64> {
        let offset = u128::from(shard.index) + u128::from(i) * u128::from(shard.count);
        let seed = u128::from(self.first) + offset;
        (seed <= u128::from(self.last)).then_some(seed as u64)
    }

    /// Seeds in `shard`'s slice (0 when the range has fewer seeds than the shard's index).
    pub fn len(&self, shard: Shard) -> u64 {
        let range = self.range_len();
        if shard.index >= range { 0 } else { (range - shard.index).div_ceil(shard.count) }
    }

    /// Whether `seed` is in `shard`'s slice.
    pub fn holds(&self, shard: Shard, seed: u64) -> bool {
        (self.first..=self.last).contains(&seed) && (seed - self.first) % shard.count == shard.index
    }
}

/// The first line of a result file: which sweep (and shard) the seed lines after it belong to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// [`SWEEP_FORMAT`] of the writer.
    pub format: u32,
    /// The writing build's id (as replay files record it).
    pub build: String,
    /// The scenario's name, version (`v{version}-{content hash}`) and path.
    pub scenario: ReplayScenario,
    /// The whole sweep's seed range.
    pub seeds: Seeds,
    /// This file's shard of it ([`Shard::WHOLE`] for an unsharded sweep).
    pub shard: Shard,
    /// Threads it ran on.
    pub jobs: usize,
}

/// How one seed's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every checker passed.
    Passed,
    /// A checker found a violation (`checkers` names them).
    Failed,
    /// The run panicked before the checkers ran.
    Panicked,
}

/// One finished seed: what the table counts, and for a failure what reproduces it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRecord {
    /// The seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The checkers that found a violation, each once, sorted (empty unless `failed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkers: Vec<String>,
    /// Simulated time the run took (for a panicked run, the time of its last trace event), in microseconds.
    pub simulated_us: u64,
    /// Wall-clock time the run took, in milliseconds (informational: no table sums it).
    pub wall_ms: u64,
    /// What failed, one line ([`summary`]); absent for a passed seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The failing seed's replay file, whole (so that shards' failures replay from their result files alone);
    /// absent for a passed seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayFile>,
    /// A swarm's seed: the world it drew and what its run reached (absent in a sweep of one scenario file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm: Option<Box<SwarmSeed>>,
}

/// What a swarm's result line says of its seed's world: the world in one line, and what the run reached (the
/// world itself is redrawn from the header's ranges and the seed; a failing seed's replay file carries it whole).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwarmSeed {
    /// [`crate::sim::swarm::World::summary`].
    pub world: String,
    /// Whether the world ran the row workload (or a user's pipeline set).
    pub rows: bool,
    /// Whether it had operations.
    pub gang: bool,
    /// Whether it ran the built-in row workload (not a user's set).
    #[serde(default)]
    pub builtin: bool,
    /// The fault kinds it switched on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<String>,
    /// The kinds its run injected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
    /// The paths ([`crate::sim::swarm::coverage::PATHS`]) its run went through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

impl SeedRecord {
    /// The record of `report`; `replay` is its replay file when it failed.
    pub fn of(report: &RunReport, replay: Option<ReplayFile>) -> SeedRecord {
        let checkers: std::collections::BTreeSet<&str> = report.violations.iter().map(|v| v.checker).collect();
        let outcome = match (&report.panic, checkers.is_empty()) {
            (Some(_), _) => Outcome::Panicked,
            (None, false) => Outcome::Failed,
            (None, true) => Outcome::Passed,
        };
        let failed = outcome != Outcome::Passed;
        SeedRecord {
            seed: report.seed,
            outcome,
            checkers: checkers.into_iter().map(str::to_string).collect(),
            simulated_us: u64::try_from(report.simulated.as_micros()).unwrap_or(u64::MAX),
            wall_ms: u64::try_from(report.wall.as_millis()).unwrap_or(u64::MAX),
            failure: failed.then(|| summary(report)),
            replay: if failed { replay } else { None },
            swarm: None,
        }
    }
}

/// The last line of a result file, written when the sweep ends (a killed sweep's file has none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    /// The shard that ended.
    pub shard: Shard,
    /// Seed lines it wrote.
    pub seeds: u64,
    /// Whether it stopped before its last seed (Ctrl-C, SIGTERM, a result file that could not be written).
    pub interrupted: bool,
    /// Its wall-clock time, in milliseconds.
    pub wall_ms: u64,
}

/// One line of a result file: `{"sweep": …}`, `{"seed": …}` or `{"end": …}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Line {
    /// The header.
    Sweep(Header),
    /// A finished seed.
    Seed(SeedRecord),
    /// The end.
    End(End),
}

impl Line {
    /// As one line of JSON, ending in a newline.
    pub fn to_json_line(&self) -> String {
        let mut text = serde_json::to_string(self).expect("a result line serializes");
        text.push('\n');
        text
    }
}

/// The file name of a result file: `{scenario}-seeds-{first}-{last}.sweep.jsonl`, with `-shard-{K}-of-{N}` before
/// the extension for a shard.
pub fn file_name(scenario: &str, seeds: Seeds, shard: Shard) -> String {
    let shard =
        if shard == Shard::WHOLE { String::new() } else { format!("-shard-{}-of-{}", shard.index, shard.count) };
    format!("{scenario}-seeds-{}-{}{shard}.sweep.jsonl", seeds.first, seeds.last)
}

/// What a sweep's table counts: seeds by outcome and by failed checker, and their simulated time. Constant in
/// size whatever the number of seeds (it grows only with the number of distinct checkers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Seeds counted.
    pub seeds: u64,
    /// Seeds whose every checker passed.
    pub passed: u64,
    /// Seeds a checker failed, by checker (a seed failing two checkers counts under each).
    pub failed_by_checker: BTreeMap<String, u64>,
    /// Seeds whose run panicked.
    pub panicked: u64,
    /// Simulated time of all seeds, in microseconds (exact: the same sum in any order).
    pub simulated_us_total: u128,
    /// The longest simulated time of a seed, in microseconds.
    pub simulated_us_max: u64,
    /// A swarm's coverage: what its worlds reached (empty for a sweep of one scenario file).
    pub coverage: crate::sim::swarm::SwarmCoverage,
}

impl Tally {
    /// Counts `record`.
    pub fn add(&mut self, record: &SeedRecord) {
        self.seeds += 1;
        match record.outcome {
            Outcome::Passed => self.passed += 1,
            Outcome::Panicked => self.panicked += 1,
            Outcome::Failed => {}
        }
        for checker in &record.checkers {
            *self.failed_by_checker.entry(checker.clone()).or_default() += 1;
        }
        self.simulated_us_total += u128::from(record.simulated_us);
        self.simulated_us_max = self.simulated_us_max.max(record.simulated_us);
        if let Some(swarm) = &record.swarm {
            let reached = crate::sim::swarm::coverage::Reached {
                on: swarm.on.clone(),
                injected: swarm.injected.clone(),
                paths: swarm.paths.clone(),
            };
            self.coverage.add(&reached, (swarm.rows, swarm.builtin, swarm.gang));
        }
    }

    /// Seeds that did not pass.
    pub fn failed(&self) -> u64 {
        self.seeds - self.passed
    }

    /// The table: a row per outcome (passed, failed by checker, panicked) with its seeds, then the simulated
    /// time in all, per seed on average and at most. The same for the same seeds, in any order and any split.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, u64)> = vec![("passed".into(), self.passed)];
        rows.extend(self.failed_by_checker.iter().map(|(checker, count)| (format!("failed: {checker}"), *count)));
        rows.push(("panicked".into(), self.panicked));
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0).max("outcome".len());
        let mut text = format!("{:<width$}  seeds\n", "outcome");
        for (name, count) in rows {
            text.push_str(&format!("{name:<width$}  {count:>5}\n"));
        }
        let total = self.simulated_us_total as f64 / 1e6;
        let max = self.simulated_us_max as f64 / 1e6;
        let mean = if self.seeds == 0 { 0.0 } else { total / self.seeds as f64 };
        text.push_str(&format!("simulated time: {total:.1} s in all, mean {mean:.1} s, max {max:.1} s per seed\n"));
        if self.coverage.seeds > 0 {
            text.push_str(&self.coverage.table());
        }
        text
    }
}

/// The table's last line for a sweep of `seeds` seeds that took `wall`.
pub fn wall_line(seeds: u64, wall: Duration) -> String {
    let rate = seeds as f64 / wall.as_secs_f64().max(1e-9);
    format!("wall time: {:.2} s ({rate:.1} seeds/s)\n", wall.as_secs_f64())
}

/// The most failing seeds a sweep or merge lists after its table (the lowest seeds; every one is in the result
/// file and has its replay file): a sweep where every seed fails must not grow with its seeds either.
pub const FAILURES_LISTED_MAX: usize = 100;

/// The lowest failing seeds seen, at most [`FAILURES_LISTED_MAX`], with what the listing prints for each.
#[derive(Debug)]
pub struct Failures<T> {
    listed: BTreeMap<u64, T>,
    /// Failing seeds seen in all.
    pub count: u64,
}

impl<T> Default for Failures<T> {
    fn default() -> Self {
        Failures { listed: BTreeMap::new(), count: 0 }
    }
}

impl<T> Failures<T> {
    /// Notes a failing `seed` with its listing `item`.
    pub fn add(&mut self, seed: u64, item: T) {
        self.count += 1;
        self.listed.insert(seed, item);
        if self.listed.len() > FAILURES_LISTED_MAX {
            self.listed.pop_last();
        }
    }

    /// The listed ones, by seed.
    pub fn listed(&self) -> impl Iterator<Item = (&u64, &T)> {
        self.listed.iter()
    }

    /// Failing seeds seen but not listed.
    pub fn unlisted(&self) -> u64 {
        self.count - self.listed.len() as u64
    }
}

/// Why result files cannot be merged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The path.
        path: String,
        /// The OS's reason.
        message: String,
    },
    /// No result file (`*.jsonl`) was found.
    #[error("no result file (*.sweep.jsonl, *.jsonl) in {paths}")]
    Empty {
        /// The paths given.
        paths: String,
    },
    /// A line is not a result line.
    #[error("{path}:{line}: not a line of a lockstep sweep result file: {message}")]
    Malformed {
        /// The file.
        path: String,
        /// The line number, from 1.
        line: usize,
        /// What did not parse.
        message: String,
    },
    /// Two headers disagree on what was swept.
    #[error("{first} and {second} are not shards of one sweep: {field} {a} vs {b}")]
    Mismatch {
        /// The file of the first header.
        first: String,
        /// The file of the disagreeing header.
        second: String,
        /// The field: `format`, `build`, `scenario`, `seeds`, `shard count`.
        field: &'static str,
        /// The first header's value.
        a: String,
        /// The other's.
        b: String,
    },
    /// A shard's header appears twice.
    #[error("shard {shard} appears twice: in {first} and in {second} (merge each shard's result file once)")]
    DuplicateShard {
        /// The shard.
        shard: Shard,
        /// Where first: `FILE:LINE` of its header (two headers may share a file).
        first: String,
        /// Where again: `FILE:LINE`.
        second: String,
    },
    /// A seed line before any header, or of a shard whose header is missing, or outside the sweep, or twice.
    #[error("{path}:{line}: seed {seed} {why}")]
    StraySeed {
        /// The file.
        path: String,
        /// The line number, from 1.
        line: usize,
        /// The seed.
        seed: u64,
        /// What is wrong with it.
        why: String,
    },
}

/// The shards' result files merged: their header (one sweep), the tally of every seed, the failures, and what is
/// missing.
#[derive(Debug)]
pub struct Merged {
    /// The first header read (every other agrees with it but for its shard).
    pub header: Header,
    /// Every seed of every shard.
    pub tally: Tally,
    /// The failing seeds: summary line and replay file.
    pub failures: Failures<(String, Option<ReplayFile>)>,
    /// Shards by index: (seeds read, the end line if any).
    pub shards: BTreeMap<u64, (u64, Option<End>)>,
    /// The files whose last line was cut off (no newline, and not a whole line: a sweep killed, or out of disk,
    /// while it wrote), by path: their complete lines are merged, the cut-off one is not.
    pub cut_off: Vec<String>,
}

impl Merged {
    /// Ways the sweep is incomplete: files whose last line was cut off, shards missing, shards without an end
    /// (killed) or interrupted, shards with fewer seeds than their slice holds. Empty when every seed of the
    /// range is counted.
    pub fn gaps(&self) -> Vec<String> {
        let count = self.header.shard.count;
        let mut gaps: Vec<String> = (self.cut_off.iter())
            .map(|path| format!("{path} ends in a cut-off line (killed while writing?), left out"))
            .collect();
        let missing: Vec<String> =
            (0..count).filter(|index| !self.shards.contains_key(index)).map(|index| index.to_string()).collect();
        if !missing.is_empty() {
            let shown: Vec<String> = missing.iter().take(20).cloned().collect();
            let more = if missing.len() > shown.len() {
                format!(" and {} more", missing.len() - shown.len())
            } else {
                String::new()
            };
            gaps.push(format!("{} of the {count} shards missing: {}{more}", missing.len(), shown.join(", ")));
        }
        for (index, (seeds, end)) in &self.shards {
            let shard = Shard { index: *index, count };
            let expected = self.header.seeds.len(shard);
            let how = match end {
                None => "has no end line (killed?)",
                Some(end) if end.interrupted => "was interrupted",
                Some(_) if *seeds < expected => "ended early",
                Some(_) => continue,
            };
            gaps.push(format!("shard {shard} {how}: {seeds} of {}", crate::text::count(expected, "seed")));
        }
        gaps
    }

    /// The longest shard's wall time and all shards' together (of those that ended).
    pub fn wall(&self) -> (Duration, Duration) {
        let walls = self.shards.values().filter_map(|(_, end)| end.as_ref()).map(|end| end.wall_ms);
        let (max, sum) = walls.fold((0, 0), |(max, sum), wall| (u64::max(max, wall), sum + wall));
        (Duration::from_millis(max), Duration::from_millis(sum))
    }
}

/// The result files at `paths`: each a file, or a directory whose `*.jsonl` files are read (not its
/// subdirectories), in name order.
pub fn result_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, MergeError> {
    let read = |path: &Path, error: std::io::Error| MergeError::Read {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|error| read(path, error))?;
        if !meta.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|error| read(path, error))? {
            let entry = entry.map_err(|error| read(path, error))?;
            let name = entry.path();
            if name.extension().is_some_and(|ext| ext == "jsonl") && name.is_file() {
                found.push(name);
            }
        }
        found.sort();
        files.extend(found);
    }
    if files.is_empty() {
        let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(MergeError::Empty { paths: paths.join(", ") });
    }
    Ok(files)
}

/// Merges the result files `files` (read line by line: memory grows with shards, not seeds). A file's last line
/// that is cut off (it has no newline and does not parse: a sweep killed, or out of disk, while writing it; a
/// sweep writes each line whole, so only the last can be) is left out and the file listed in
/// [`Merged::cut_off`]: a killed sweep loses nothing it finished.
///
/// Errors: a file that cannot be read, a line that is not a result line (but a cut-off last one) or longer than
/// [`RESULT_LINE_BYTES_MAX`](super::files::RESULT_LINE_BYTES_MAX), headers of different sweeps (format, build,
/// scenario name or version, seed range, shard count), a shard twice, a seed outside its shard's slice, before
/// any header, of a shard without a header, or twice.
pub fn merge(files: &[PathBuf]) -> Result<Merged, MergeError> {
    let mut merged: Option<Merged> = None;
    let mut cut_off = Vec::new();
    // Each shard's header, as `FILE:LINE`.
    let mut header_files: BTreeMap<u64, String> = BTreeMap::new();
    let mut first_file = String::new();
    // The seeds seen, per shard, a bit each (by their place in the shard's slice): a repeated seed is refused.
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for file in files {
        let path = file.display().to_string();
        let reader = std::fs::File::open(file)
            .map_err(|error| MergeError::Read { path: path.clone(), message: error.to_string() })?;
        let mut lines = ResultLines { reader: std::io::BufReader::new(reader), path: &path, number: 0 };
        while let Some((line, whole)) = lines.next_line()? {
            let number = lines.number;
            if line.trim_ascii().is_empty() {
                continue;
            }
            let parsed: Line = match serde_json::from_slice(&line) {
                Ok(parsed) => parsed,
                Err(_) if !whole => {
                    cut_off.push(path.clone());
                    break;
                }
                Err(error) => {
                    return Err(MergeError::Malformed { path: path.clone(), line: number, message: error.to_string() });
                }
            };
            match parsed {
                Line::Sweep(header) => {
                    if header.format != SWEEP_FORMAT {
                        return Err(MergeError::Malformed {
                            path,
                            line: number,
                            message: format!("format {}, but this build reads format {SWEEP_FORMAT}", header.format),
                        });
                    }
                    let Some(merged) = &mut merged else {
                        first_file = path.clone();
                        header_files.insert(header.shard.index, format!("{path}:{number}"));
                        seen.insert(header.shard.index, Vec::new());
                        let shards = BTreeMap::from([(header.shard.index, (0, None))]);
                        merged = Some(Merged {
                            header,
                            tally: Tally::default(),
                            failures: Failures::default(),
                            shards,
                            cut_off: Vec::new(),
                        });
                        continue;
                    };
                    agree(&merged.header, &header, &first_file, &path)?;
                    if let Some(first) = header_files.get(&header.shard.index) {
                        return Err(MergeError::DuplicateShard {
                            shard: header.shard,
                            first: first.clone(),
                            second: format!("{path}:{number}"),
                        });
                    }
                    header_files.insert(header.shard.index, format!("{path}:{number}"));
                    seen.insert(header.shard.index, Vec::new());
                    merged.shards.insert(header.shard.index, (0, None));
                }
                Line::Seed(record) => {
                    let stray = |why: String| MergeError::StraySeed {
                        path: path.clone(),
                        line: number,
                        seed: record.seed,
                        why,
                    };
                    let Some(merged) = &mut merged else { return Err(stray("comes before any header".into())) };
                    let seeds = merged.header.seeds;
                    if !(seeds.first..=seeds.last).contains(&record.seed) {
                        return Err(stray(format!("is outside the sweep's seeds {}..={}", seeds.first, seeds.last)));
                    }
                    let index = (record.seed - seeds.first) % merged.header.shard.count;
                    let Some((count, _)) = merged.shards.get_mut(&index) else {
                        return Err(stray(format!("is of shard {index}, whose header was not read before it")));
                    };
                    let place = (record.seed - seeds.first) / merged.header.shard.count;
                    let (word, bit) = ((place / 64) as usize, 1u64 << (place % 64));
                    let bits = seen.entry(index).or_default();
                    if bits.len() <= word {
                        bits.resize(word + 1, 0);
                    }
                    if bits[word] & bit != 0 {
                        return Err(stray("appears twice".into()));
                    }
                    bits[word] |= bit;
                    *count += 1;
                    merged.tally.add(&record);
                    if record.outcome != Outcome::Passed {
                        merged.failures.add(record.seed, (record.failure.clone().unwrap_or_default(), record.replay));
                    }
                }
                Line::End(end) => {
                    let Some(merged) = &mut merged else {
                        return Err(MergeError::Malformed {
                            path,
                            line: number,
                            message: "an end line before any header".into(),
                        });
                    };
                    match merged.shards.get_mut(&end.shard.index) {
                        Some((_, slot)) if end.shard.count == merged.header.shard.count => *slot = Some(end),
                        _ => {
                            return Err(MergeError::Malformed {
                                path,
                                line: number,
                                message: format!("the end of shard {}, whose header was not read before it", end.shard),
                            });
                        }
                    }
                }
            }
        }
    }
    let mut merged = merged.ok_or_else(|| MergeError::Empty {
        paths: files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
    })?;
    merged.cut_off = cut_off;
    Ok(merged)
}

/// The lines of one result file, each read through a cap of
/// [`RESULT_LINE_BYTES_MAX`](super::files::RESULT_LINE_BYTES_MAX) bytes (a path that is not a result file, a
/// device that never ends, is refused instead of filling memory).
struct ResultLines<'a, R> {
    reader: R,
    path: &'a str,
    /// The number of the line last read, from 1.
    number: usize,
}

impl<R: std::io::BufRead> ResultLines<'_, R> {
    /// The next line's bytes, without its newline, and whether it had one (a last line without is cut off, or a
    /// file written without a final newline; cut off, it may end inside a UTF-8 character); `None` at the end of
    /// the file.
    fn next_line(&mut self) -> Result<Option<(Vec<u8>, bool)>, MergeError> {
        use std::io::{BufRead, Read};
        let limit = super::files::RESULT_LINE_BYTES_MAX;
        let mut bytes = Vec::new();
        let read = (&mut self.reader).take(limit + 1).read_until(b'\n', &mut bytes);
        let read =
            read.map_err(|error| MergeError::Read { path: self.path.to_string(), message: error.to_string() })?;
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        let whole = bytes.last() == Some(&b'\n');
        if !whole && bytes.len() as u64 > limit {
            return Err(MergeError::Malformed {
                path: self.path.to_string(),
                line: self.number,
                message: format!(
                    "longer than {}, the most a result line holds (a seed line carries its replay file)",
                    crate::files::size(limit)
                ),
            });
        }
        if whole {
            bytes.pop();
        }
        Ok(Some((bytes, whole)))
    }
}

/// Checks that `other` (read from `second`) is a shard of the sweep `first` (read from `first_file`) heads.
fn agree(first: &Header, other: &Header, first_file: &str, second: &str) -> Result<(), MergeError> {
    let mismatch = |field: &'static str, a: String, b: String| {
        Err(MergeError::Mismatch { first: first_file.to_string(), second: second.to_string(), field, a, b })
    };
    if first.build != other.build {
        return mismatch("build", first.build.clone(), other.build.clone());
    }
    let scenario = |h: &Header| format!("{} {}", h.scenario.name, h.scenario.version);
    if scenario(first) != scenario(other) {
        return mismatch("scenario", scenario(first), scenario(other));
    }
    if first.seeds != other.seeds {
        let seeds = |h: &Header| format!("{}..={}", h.seeds.first, h.seeds.last);
        return mismatch("seeds", seeds(first), seeds(other));
    }
    if first.shard.count != other.shard.count {
        return mismatch("shard count", first.shard.count.to_string(), other.shard.count.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_shard_is_k_of_n_from_zero() {
        assert_eq!(Shard::parse("0/4"), Ok(Shard { index: 0, count: 4 }));
        assert_eq!(Shard::parse("3/4"), Ok(Shard { index: 3, count: 4 }));
        assert!(Shard::parse("4/4").unwrap_err().contains("shard 4 does not exist: shards count from 0"));
        assert!(Shard::parse("0/0").unwrap_err().contains("the shard count must be 1..="));
        assert!(Shard::parse("1").unwrap_err().contains("is not a shard: write K/N"));
        assert!(Shard::parse("a/4").unwrap_err().contains("is not a shard"));
    }

    #[test]
    fn shards_slice_a_range_into_disjoint_strided_parts_that_cover_it() {
        let seeds = Seeds { first: 5, last: 14 };
        let mut all = Vec::new();
        for index in 0..4 {
            let shard = Shard { index, count: 4 };
            let slice: Vec<u64> = (0..).map_while(|i| seeds.nth(shard, i)).collect();
            assert_eq!(slice.len() as u64, seeds.len(shard), "{shard}");
            assert!(slice.iter().all(|seed| seeds.holds(shard, *seed)), "{shard}: {slice:?}");
            all.extend(slice);
        }
        assert_eq!(seeds.nth(Shard { index: 1, count: 4 }, 0), Some(6));
        all.sort();
        assert_eq!(all, (5..=14).collect::<Vec<_>>());
        // More shards than seeds: the extra shards run nothing.
        let tiny = Seeds { first: 1, last: 2 };
        assert_eq!(tiny.len(Shard { index: 3, count: 4 }), 0);
        assert_eq!(tiny.nth(Shard { index: 3, count: 4 }, 0), None);
        let top = Seeds { first: u64::MAX - 1, last: u64::MAX };
        assert_eq!(top.nth(Shard { index: 1, count: 2 }, 0), Some(u64::MAX));
        assert_eq!(top.nth(Shard { index: 1, count: 2 }, 1), None);
    }

    #[test]
    fn shards_come_from_kubernetes_slurm_or_ytsaurus_variables() {
        let shard = |index, count| Shard { index, count };
        assert_eq!(Shard::from_env(env(&[])), Ok(None));
        let k8s = Shard::from_env(env(&[("JOB_COMPLETION_INDEX", "2"), (SHARD_COUNT_VAR, "4")])).unwrap().unwrap();
        assert_eq!(k8s, (shard(2, 4), "JOB_COMPLETION_INDEX=2, LOCKSTEP_SHARD_COUNT=4".to_string()));
        let slurm =
            env(&[("SLURM_ARRAY_TASK_ID", "4"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "4")]);
        assert_eq!(Shard::from_env(slurm).unwrap().unwrap().0, shard(3, 4));
        let stepped = env(&[
            ("SLURM_ARRAY_TASK_ID", "6"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Shard::from_env(stepped).unwrap().unwrap().0, shard(3, 4));
        let yt = Shard::from_env(env(&[("YT_JOB_COOKIE", "0"), ("YT_TASK_JOB_COUNT", "3")])).unwrap().unwrap();
        assert_eq!(yt.0, shard(0, 3));
    }

    #[test]
    fn bad_shard_variables_are_refused_naming_the_variable() {
        let error = |pairs: &[(&str, &str)]| Shard::from_env(env(pairs)).unwrap_err();
        let e = error(&[("JOB_COMPLETION_INDEX", "two"), (SHARD_COUNT_VAR, "4")]);
        assert!(e.contains("JOB_COMPLETION_INDEX=\"two\" is not a shard index: it must be a whole number"), "{e}");
        let e = error(&[("JOB_COMPLETION_INDEX", "1")]);
        assert!(e.contains("JOB_COMPLETION_INDEX is set but LOCKSTEP_SHARD_COUNT is not"), "{e}");
        let e = error(&[("JOB_COMPLETION_INDEX", "4"), (SHARD_COUNT_VAR, "4")]);
        assert!(e.contains("JOB_COMPLETION_INDEX=4, LOCKSTEP_SHARD_COUNT=4: shard 4 does not exist"), "{e}");
        let e = error(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_COUNT", "x")]);
        assert!(e.contains("SLURM_ARRAY_TASK_COUNT=\"x\" is not a shard count"), "{e}");
        let e = error(&[("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "2")]);
        assert!(e.contains("the task id is below the minimum"), "{e}");
        let e = error(&[("YT_JOB_COOKIE", "0"), ("YT_TASK_JOB_COUNT", "0")]);
        assert!(e.contains("YT_JOB_COOKIE=0, YT_TASK_JOB_COUNT=0: the shard count must be 1..="), "{e}");
        let e = error(&[(SHARD_COUNT_VAR, "4")]);
        assert!(e.contains("LOCKSTEP_SHARD_COUNT=\"4\" is set but JOB_COMPLETION_INDEX is not"), "{e}");
        let e = error(&[(SHARD_COUNT_VAR, "4"), ("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_COUNT", "2")]);
        assert!(e.contains("LOCKSTEP_SHARD_COUNT=\"4\" is set but JOB_COMPLETION_INDEX is not"), "{e}");
        let e = error(&[("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_STEP", "0"), ("SLURM_ARRAY_TASK_COUNT", "2")]);
        assert!(
            e.contains("SLURM_ARRAY_TASK_ID=0, SLURM_ARRAY_TASK_STEP=0, SLURM_ARRAY_TASK_COUNT=2: the step"),
            "{e}"
        );
        let e = error(&[("YT_JOB_COOKIE", "-1"), ("YT_TASK_JOB_COUNT", "2")]);
        assert!(e.contains("YT_JOB_COOKIE=\"-1\" is not a shard index"), "{e}");
    }

    #[test]
    fn a_tally_counts_outcomes_the_same_in_any_order() {
        let record = |seed, outcome, checkers: &[&str], simulated_us| SeedRecord {
            seed,
            outcome,
            checkers: checkers.iter().map(|c| c.to_string()).collect(),
            simulated_us,
            wall_ms: 0,
            failure: None,
            replay: None,
            swarm: None,
        };
        let records = [
            record(1, Outcome::Passed, &[], 1_000_000),
            record(2, Outcome::Failed, &["liveness", "lease_exclusivity"], 2_500_000),
            record(3, Outcome::Panicked, &[], 300_000),
            record(4, Outcome::Failed, &["liveness"], 100_001),
        ];
        let mut forward = Tally::default();
        records.iter().for_each(|r| forward.add(r));
        let mut backward = Tally::default();
        records.iter().rev().for_each(|r| backward.add(r));
        assert_eq!(forward, backward);
        assert_eq!(forward.failed(), 3);
        assert_eq!(
            forward.table(),
            "outcome                    seeds\n\
             passed                         1\n\
             failed: lease_exclusivity      1\n\
             failed: liveness               2\n\
             panicked                       1\n\
             simulated time: 3.9 s in all, mean 1.0 s, max 2.5 s per seed\n"
        );
    }

    #[test]
    fn failures_keep_the_lowest_seeds_listed_and_count_the_rest() {
        let mut failures = Failures::default();
        for seed in (0..(FAILURES_LISTED_MAX as u64 + 10)).rev() {
            failures.add(seed, ());
        }
        assert_eq!(failures.count, FAILURES_LISTED_MAX as u64 + 10);
        assert_eq!(failures.unlisted(), 10);
        assert_eq!(failures.listed().map(|(seed, _)| *seed).max(), Some(FAILURES_LISTED_MAX as u64 - 1));
    }
}
