//! Replay files: everything needed to rerun one failing seed exactly, and to refuse a rerun that could not be
//! exact (DESIGN §5: a run is a function of scenario, seed and build).
//!
//! A replay file is JSON ([`ReplayFile`]): its format version, the build that wrote it, the scenario's name and
//! version (the file's `version` key and a hash of its normalized content), the scenario's text itself and the
//! text of every spec file it reads (so a replay depends on neither still existing unchanged), the seed, the trace's hash and
//! length, and what failed. `lockstep sim replay` refuses a file of another format, another build or whose
//! scenario text no longer hashes to the recorded version, then reruns the seed and compares trace hashes.

use super::run::{RunReport, summary};
use super::scenario_file::gang::SpecSource;
use super::scenario_file::{PipelineSets, ScenarioError, ScenarioFile};
use crate::hash::fnv1a64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The replay file format this build writes and reads (2: the spec files' texts, `spec_files`).
pub const REPLAY_FORMAT: u32 = 3;

/// A run's trace identity: the FNV-1a hash of its text (16 hex digits) and its length in events.
pub fn trace_identity(report: &RunReport) -> TraceIdentity {
    TraceIdentity { hash: format!("{:016x}", fnv1a64(report.trace_text().as_bytes())), events: report.trace.len() }
}

/// A trace's hash and length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceIdentity {
    /// FNV-1a 64 of the trace text, 16 hex digits.
    pub hash: String,
    /// Events in the trace.
    pub events: usize,
}

/// Which scenario a replay file ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayScenario {
    /// The scenario's `name`.
    pub name: String,
    /// Its version label, `v{version}-{content hash}` ([`ScenarioFile::version_label`]).
    pub version: String,
    /// Where it was read from when the replay file was written (informational).
    pub path: String,
}

/// One failing run, written by `lockstep sim run` and `sim sweep`, read by `sim replay`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayFile {
    /// [`REPLAY_FORMAT`] of the writer.
    pub format: u32,
    /// The writing build's id (the `lockstep` binary's own hash; see the binary's `build_id`).
    pub build: String,
    /// The scenario's name, version and path.
    pub scenario: ReplayScenario,
    /// The scenario file's text, whole.
    pub scenario_text: String,
    /// The text of every spec file the scenario reads (`spec_file`), by the path the scenario writes.
    #[serde(default)]
    pub spec_files: BTreeMap<String, String>,
    /// The run's seed.
    pub seed: u64,
    /// The trace the run produced.
    pub trace: TraceIdentity,
    /// What failed: the one-line summary of the run.
    pub failure: String,
    /// FNV-1a 64 (16 hex digits) of the file's JSON with this field empty: a replay file is a record of a run, not
    /// an input, and one edited after it was written (another seed, another scenario text) is refused as edited
    /// instead of being blamed on the simulator when its trace differs.
    pub checksum: String,
}

/// Why a replay file cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// Not JSON of the replay file's shape.
    #[error("{path}: not a lockstep replay file: {message}")]
    Malformed {
        /// The replay file.
        path: String,
        /// What did not parse.
        message: String,
    },
    /// Written in another format version.
    #[error("{path}: replay format {found}, but this build reads format {expected}")]
    Format {
        /// The replay file.
        path: String,
        /// The file's format.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// Written by another build: the rerun could not be exact. The command line prints the command that runs
    /// the scenario under the seed on this build ([`ReplayError::rerun`]).
    #[error(
        "{path}: made by build {file}, but this is build {current}; a run is exact only on the build that made it: \
         check out and build that version, or run its scenario file {scenario} under seed {seed} on this build"
    )]
    Build {
        /// The replay file.
        path: String,
        /// The build that wrote it.
        file: String,
        /// This build.
        current: String,
        /// The scenario file's path as the run was given it, for the hint.
        scenario: String,
        /// The seed, for the hint.
        seed: u64,
    },
    /// The file's fields do not match its checksum: it was changed after it was written. The command line
    /// prints the command that runs the scenario file it names under the seed it holds ([`ReplayError::rerun`]).
    #[error(
        "{path}: edited after it was written (its checksum does not match its fields): a replay file records a run \
         and replays only as written; to try another seed, run the scenario file with that seed"
    )]
    Edited {
        /// The replay file.
        path: String,
        /// The scenario file's path the file holds.
        scenario: String,
        /// The seed the file holds.
        seed: u64,
    },
    /// The embedded scenario's name or version is not the one recorded.
    #[error(
        "{path}: made for scenario {recorded}, but the scenario it carries is {embedded}: the replay file was \
         edited or the scenario format changed"
    )]
    Scenario {
        /// The replay file.
        path: String,
        /// `name version` as recorded.
        recorded: String,
        /// `name version` of the embedded text as this build reads it.
        embedded: String,
    },
    /// The embedded scenario text no longer parses.
    #[error("{path}: the scenario it carries is invalid: {source}")]
    ScenarioText {
        /// The replay file.
        path: String,
        /// The parse error (boxed: it carries the offending line).
        source: Box<ScenarioError>,
    },
}

impl ReplayError {
    /// The build that wrote a replay file of another build ([`ReplayError::Build`]); `None` for the other errors.
    pub fn writer(&self) -> Option<&str> {
        match self {
            ReplayError::Build { file, .. } => Some(file),
            _ => None,
        }
    }

    /// The scenario file and seed a user can run instead of a replay that cannot be exact (another build) or
    /// was edited: the command line prints them as a command to paste. `None` for the other errors.
    pub fn rerun(&self) -> Option<(&str, u64)> {
        match self {
            ReplayError::Build { scenario, seed, .. } | ReplayError::Edited { scenario, seed, .. } => {
                Some((scenario, *seed))
            }
            _ => None,
        }
    }
}

impl ReplayFile {
    /// The replay file of `report`, a run of `file` on build `build`.
    pub fn new(file: &ScenarioFile, report: &RunReport, build: &str) -> ReplayFile {
        ReplayFile {
            format: REPLAY_FORMAT,
            build: build.to_string(),
            scenario: ReplayFile::scenario_of(file),
            scenario_text: file.text.clone(),
            spec_files: file.spec_files.clone(),
            seed: report.seed,
            trace: trace_identity(report),
            failure: summary(report),
            checksum: String::new(),
        }
        .sealed()
    }

    /// Which scenario `file` is: its name, version label and path.
    pub fn scenario_of(file: &ScenarioFile) -> ReplayScenario {
        ReplayScenario { name: file.scenario.name.clone(), version: file.version_label(), path: file.origin.clone() }
    }

    /// The same file with its checksum computed over its other fields (what [`ReplayFile::new`] writes; tools and
    /// tests that make a replay file by hand seal it last).
    pub fn sealed(mut self) -> ReplayFile {
        self.checksum = self.expected_checksum();
        self
    }

    /// What the checksum of this file's other fields is.
    fn expected_checksum(&self) -> String {
        let unsealed = ReplayFile { checksum: String::new(), ..self.clone() };
        let json = serde_json::to_string(&unsealed).expect("a replay file serializes");
        format!("{:016x}", fnv1a64(json.as_bytes()))
    }

    /// Its file name: `{scenario}-seed-{seed}.replay.json`.
    pub fn file_name(&self) -> String {
        format!("{}-seed-{}.replay.json", self.scenario.name, self.seed)
    }

    /// As pretty JSON, ending in a newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a replay file serializes");
        text.push('\n');
        text
    }

    /// Reads a replay file's `text` (from `path`, named in errors) and checks that this `build` can replay it:
    /// same format, same build, and an embedded scenario that parses to the recorded name and version.
    /// Returns the file and its scenario.
    ///
    /// # Errors
    /// [`ReplayError`], naming both values of whatever differs.
    pub fn check(text: &str, path: &str, build: &str) -> Result<(ReplayFile, ScenarioFile), ReplayError> {
        ReplayFile::check_in(text, path, build, &PipelineSets::new())
    }

    /// As [`ReplayFile::check`], resolving the scenario's `pipelines` key among `sets` (the binary's registered
    /// pipeline sets).
    ///
    /// # Errors
    /// As [`ReplayFile::check`].
    pub fn check_in(
        text: &str,
        path: &str,
        build: &str,
        sets: &PipelineSets,
    ) -> Result<(ReplayFile, ScenarioFile), ReplayError> {
        let malformed = |message: String| ReplayError::Malformed { path: path.to_string(), message };
        let value: serde_json::Value = serde_json::from_str(text).map_err(|error| malformed(error.to_string()))?;
        let format = value.get("format").and_then(serde_json::Value::as_u64);
        let format = format.ok_or_else(|| malformed("no `format` number".into()))?;
        if format != u64::from(REPLAY_FORMAT) {
            let found = u32::try_from(format).unwrap_or(u32::MAX);
            return Err(ReplayError::Format { path: path.to_string(), found, expected: REPLAY_FORMAT });
        }
        let replay: ReplayFile = serde_json::from_value(value).map_err(|error| malformed(error.to_string()))?;
        if replay.checksum != replay.expected_checksum() {
            return Err(ReplayError::Edited {
                path: path.to_string(),
                scenario: replay.scenario.path,
                seed: replay.seed,
            });
        }
        if replay.build != build {
            return Err(ReplayError::Build {
                path: path.to_string(),
                file: replay.build,
                current: build.to_string(),
                scenario: replay.scenario.path,
                seed: replay.seed,
            });
        }
        let origin = format!("{path} (its scenario_text, from {})", replay.scenario.path);
        let specs = SpecSource::Files(&replay.spec_files);
        let scenario = ScenarioFile::parse_in(&replay.scenario_text, &origin, specs, sets)
            .map_err(|source| ReplayError::ScenarioText { path: path.to_string(), source: Box::new(source) })?;
        let recorded = format!("{} {}", replay.scenario.name, replay.scenario.version);
        let embedded = format!("{} {}", scenario.scenario.name, scenario.version_label());
        if recorded != embedded {
            return Err(ReplayError::Scenario { path: path.to_string(), recorded, embedded });
        }
        Ok((replay, scenario))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_of(text: &str, build: &str) -> ReplayFile {
        let file = ScenarioFile::parse(text, "s.toml").unwrap();
        ReplayFile {
            format: REPLAY_FORMAT,
            build: build.into(),
            scenario: ReplayScenario {
                name: file.scenario.name.clone(),
                version: file.version_label(),
                path: "s.toml".into(),
            },
            scenario_text: text.into(),
            spec_files: BTreeMap::new(),
            seed: 7,
            trace: TraceIdentity { hash: "0".repeat(16), events: 3 },
            failure: "seed 7: liveness: …".into(),
            checksum: String::new(),
        }
        .sealed()
    }

    #[test]
    fn a_replay_file_round_trips_and_is_accepted_by_its_build() {
        let replay = replay_of("name = \"s\"\nversion = 2\n", "b1");
        let (read, scenario) = ReplayFile::check(&replay.to_json(), "r.json", "b1").unwrap();
        assert_eq!(read, replay);
        assert_eq!(scenario.version, 2);
        assert_eq!(replay.file_name(), "s-seed-7.replay.json");
    }

    #[test]
    fn a_replay_carries_its_spec_files_and_needs_nothing_on_disk() {
        let dir = std::env::temp_dir().join(format!("lockstep-replay-specs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("specs")).unwrap();
        std::fs::write(dir.join("specs/g.yson"), "{tasks={w={job_count=2;command=w;gang_options={}}}}").unwrap();
        let text = "name = \"s\"\nversion = 1\n[topology]\nagents = 2\n[[operations]]\nname = \"g\"\nat = \"1s\"\n\
                    spec_file = \"specs/g.yson\"\n";
        std::fs::write(dir.join("s.toml"), text).unwrap();
        let file = ScenarioFile::load(&dir.join("s.toml")).unwrap();
        assert_eq!(file.spec_files.keys().collect::<Vec<_>>(), ["specs/g.yson"]);
        let mut replay = replay_of("name = \"s\"\nversion = 1\n", "b1");
        replay.scenario.version = file.version_label();
        replay.scenario_text = text.into();
        replay.spec_files = file.spec_files.clone();
        let mut replay = replay.sealed();
        std::fs::remove_dir_all(&dir).unwrap();
        let (_, scenario) = ReplayFile::check(&replay.to_json(), "r.json", "b1").unwrap();
        assert_eq!(scenario.scenario.gang.unwrap().operations[0].spec, file.scenario.gang.unwrap().operations[0].spec);
        // Without the copy, the replay is refused, naming the spec file.
        replay.spec_files.clear();
        let replay = replay.sealed();
        let error = ReplayFile::check(&replay.to_json(), "r.json", "b1").unwrap_err().to_string();
        assert!(error.contains("operations[0].spec_file") && error.contains("specs/g.yson"), "{error}");
    }

    #[test]
    fn another_build_format_or_scenario_version_is_refused_naming_both_values() {
        let replay = replay_of("name = \"s\"\nversion = 2\n", "b1");
        let error = ReplayFile::check(&replay.to_json(), "r.json", "b2").unwrap_err().to_string();
        assert!(error.contains("made by build b1, but this is build b2"), "{error}");
        assert!(error.contains("or run its scenario file s.toml under seed 7 on this build"), "{error}");
        let error = ReplayFile::check(&replay.to_json(), "r.json", "b2").unwrap_err();
        assert_eq!(error.rerun(), Some(("s.toml", 7)));

        let mut edited = replay.clone();
        edited.scenario_text = "name = \"s\"\nversion = 3\n".into();
        let error = ReplayFile::check(&edited.sealed().to_json(), "r.json", "b1").unwrap_err().to_string();
        assert!(error.contains(&format!("made for scenario s {}", replay.scenario.version)), "{error}");
        assert!(error.contains("but the scenario it carries is s v3-"), "{error}");

        let mut future = serde_json::to_value(&replay).unwrap();
        future["format"] = 99.into();
        let error = ReplayFile::check(&future.to_string(), "r.json", "b1").unwrap_err().to_string();
        assert!(error.contains(&format!("replay format 99, but this build reads format {REPLAY_FORMAT}")), "{error}");

        let error =
            ReplayFile::check(&format!("{{\"format\": {REPLAY_FORMAT}}}"), "r.json", "b1").unwrap_err().to_string();
        assert!(error.contains("not a lockstep replay file"), "{error}");
    }

    /// A replay file edited by hand (here its seed) is refused as edited, not replayed and blamed on the
    /// simulator when its trace differs.
    #[test]
    fn an_edited_replay_file_is_refused_as_edited() {
        let replay = replay_of("name = \"s\"\nversion = 2\n", "b1");
        let mut json = serde_json::to_value(&replay).unwrap();
        json["seed"] = 8.into();
        let error = ReplayFile::check(&json.to_string(), "r.json", "b1").unwrap_err().to_string();
        assert!(error.contains("r.json: edited after it was written"), "{error}");
        let error = ReplayFile::check(&json.to_string(), "r.json", "b1").unwrap_err();
        assert_eq!(error.rerun(), Some((replay.scenario.path.as_str(), 8)), "the seed the file now holds");
    }
}
