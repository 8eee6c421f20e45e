//! Input files read through a size cap: a path that is not the file it should be (a device or a pipe that never
//! ends, `/dev/zero`, a disk image) is refused with the cap and why there is one, instead of read until memory runs
//! out. Real mode reads its spec files and `--database-url-file` through it, the simulator its scenario, replay,
//! trace and result files (whose caps and output checks are in `sim/files.rs`).
//!
//! A leaf: it uses nothing of the crate, so every layer can use it.

use std::io::Read;
use std::path::Path;

/// One mebibyte, in bytes: the unit of the caps.
pub const MIB: u64 = 1 << 20;

/// `bytes` as a person reads a limit: `16 MiB` (whole mebibytes), else `N bytes`.
pub fn size(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) { format!("{} MiB", bytes / MIB) } else { format!("{bytes} bytes") }
}

/// The text of the file at `path`, `what` it is (`scenario file`, `spec file`) in messages, read through
/// [`Read::take`] so that at most `limit` + 1 bytes are ever held.
///
/// # Errors
/// As the reason alone (the caller names the path: `cannot read {path}: {reason}`): the operating system's, text
/// that is not UTF-8, or more than `limit` bytes (the reason gives the limit and why there is one).
pub fn read_text(path: &Path, what: &str, limit: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|error| error.to_string())?;
    read_text_from(file, what, limit)
}

/// As [`read_text`], from `reader` (standard input, for a command given `-`).
///
/// # Errors
/// As [`read_text`].
pub fn read_text_from(reader: impl Read, what: &str, limit: u64) -> Result<String, String> {
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes).map_err(|error| error.to_string())?;
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

    #[test]
    fn a_file_past_its_cap_is_refused_naming_the_cap() {
        let scratch = tempfile::Builder::new().prefix("lockstep-files-cap-").tempdir().unwrap();
        let path = scratch.path().join("big.toml");
        std::fs::write(&path, "x".repeat(11)).unwrap();
        assert_eq!(read_text(&path, "scenario file", 11).unwrap().len(), 11);
        let error = read_text(&path, "scenario file", 10).unwrap_err();
        assert!(error.starts_with("it holds more than 10 bytes (10 bytes), the most a scenario file"), "{error}");
        let error = read_text(Path::new("/dev/zero"), "scenario file", 16 * MIB).unwrap_err();
        assert!(error.starts_with("it holds more than 16 MiB (16777216 bytes)"), "{error}");
    }
}
