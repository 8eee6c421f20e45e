//! The files the `lockstep sim` commands read: input files read through a size cap (a device or pipe that never
//! ends, `/dev/zero`, is refused instead of filling memory).

use std::io::Read;
use std::path::Path;

/// One mebibyte, in bytes.
const MIB: u64 = 1 << 20;

/// The most bytes a scenario file, or a spec file it names, may hold: 16 MiB. The largest in `scenarios/` and
/// `tests/fixtures/` is about 4 KB, and a generated scenario a thousand times that is still far below it; the cap
/// is there so that a path that is not a scenario file (`/dev/zero`, a pipe, a disk image) is refused instead
/// of read until memory runs out.
pub const SCENARIO_FILE_BYTES_MAX: u64 = 16 * MIB;

/// The most bytes a replay file may hold: 64 MiB. It carries its scenario's text and spec files (each at most
/// [`SCENARIO_FILE_BYTES_MAX`]), a summary line and a trace hash; those the tests write are a few KB.
pub const REPLAY_FILE_BYTES_MAX: u64 = 64 * MIB;

/// The most bytes a trace file (`run --trace`) may hold: 1 GiB. A run's trace holds at most
/// [`TRACE_LEN_MAX`](super::trace::TRACE_LEN_MAX) (5 000 000) events, and this leaves about 215 bytes for each:
/// measured on `scenarios/gang-mixed-soak.toml` and `rows-mixed.toml` (seed 1), trace lines average 64 to 74
/// bytes and the longest holds 188.
pub const TRACE_FILE_BYTES_MAX: u64 = 1024 * MIB;

/// `bytes` as a person reads a limit: `16 MiB` (whole mebibytes), else `N bytes`.
pub fn size(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) { format!("{} MiB", bytes / MIB) } else { format!("{bytes} bytes") }
}

/// The text of the file at `path`, `what` it is (`scenario file`, `trace file`) in messages, read through
/// [`Read::take`] so that at most `limit` + 1 bytes are ever held.
///
/// Errors, as the reason alone (the caller names the path: `cannot read {path}: {reason}`): the operating
/// system's, text that is not UTF-8, or more than `limit` bytes (the reason gives the limit and why there is
/// one).
pub fn read_text(path: &Path, what: &str, limit: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|error| error.to_string())?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|error| error.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "it holds more than {} ({limit} bytes), the most a {what} may hold (a limit that keeps a path that \
             is not a {what}, a device or a pipe that never ends, from filling memory)",
            size(limit)
        ));
    }
    String::from_utf8(bytes).map_err(|error| format!("it is not UTF-8 text: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lockstep-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_file_past_its_cap_is_refused_naming_the_cap() {
        let dir = temp_dir("cap");
        let path = dir.join("big.toml");
        std::fs::write(&path, "x".repeat(11)).unwrap();
        assert_eq!(read_text(&path, "scenario file", 11).unwrap().len(), 11);
        let error = read_text(&path, "scenario file", 10).unwrap_err();
        assert!(error.starts_with("it holds more than 10 bytes (10 bytes), the most a scenario file"), "{error}");
        let error = read_text(Path::new("/dev/zero"), "scenario file", SCENARIO_FILE_BYTES_MAX).unwrap_err();
        assert!(error.starts_with("it holds more than 16 MiB (16777216 bytes)"), "{error}");
    }
}
