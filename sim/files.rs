//! The files the `lockstep sim` commands read and write: the caps of the inputs (read through
//! [`crate::files::read_text`]: a device or pipe that never ends, `/dev/zero`, is refused instead of filling
//! memory), and output paths checked against the inputs and each other before anything is created
//! (`run mine.toml --html mine.toml` would replace the scenario file with a page; `--trace same.out --html same.out`
//! would lose one of them).

use crate::files::MIB;
use std::path::{Path, PathBuf};

/// The most bytes a scenario file (or a ranges file) may hold: 16 MiB. The largest in `scenarios/` and
/// `tests/fixtures/` is about 4 KB, and a generated scenario a thousand times that is still far below it; the cap
/// is there so that a path that is not a scenario file (`/dev/zero`, a pipe, a disk image) is refused instead
/// of read until memory runs out. The spec files a scenario names have the gang's cap,
/// [`SPEC_FILE_BYTES_MAX`](crate::gang::spec::SPEC_FILE_BYTES_MAX).
pub const SCENARIO_FILE_BYTES_MAX: u64 = 16 * MIB;

/// The most bytes a replay file may hold: 64 MiB. It carries its scenario's text and spec files (each at most
/// 16 MiB: [`SCENARIO_FILE_BYTES_MAX`], [`SPEC_FILE_BYTES_MAX`](crate::gang::spec::SPEC_FILE_BYTES_MAX)), a
/// summary line and a trace hash; those the tests write are a few KB.
pub const REPLAY_FILE_BYTES_MAX: u64 = 64 * MIB;

/// The most bytes a trace file (`run --trace`) may hold: 1 GiB. A run's trace holds at most
/// [`TRACE_LEN_MAX`](super::trace::TRACE_LEN_MAX) (5 000 000) events, and this leaves about 215 bytes for each:
/// measured on `scenarios/gang-mixed-soak.toml` and `rows-mixed.toml` (seed 1), trace lines average 64 to 74
/// bytes and the longest holds 188.
pub const TRACE_FILE_BYTES_MAX: u64 = 1024 * MIB;

/// The most bytes one line of a sweep's result file may hold: a seed line carries its failure's replay file (at
/// most [`REPLAY_FILE_BYTES_MAX`]), escaped as a JSON string, so twice that.
pub const RESULT_LINE_BYTES_MAX: u64 = 2 * REPLAY_FILE_BYTES_MAX;

/// Checks, before a run, that `dir` is a directory or can be made one: the path, or if it does not exist the
/// nearest of its ancestors that does, is a directory. A command that writes into it only at the end (`run`'s
/// replay file on a failure, `shrink`'s files) would otherwise find out after minutes of runs.
///
/// Errors: the rule, naming the path that is not a directory.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    let Some(existing) = dir.ancestors().find(|path| path.as_os_str().is_empty() || path.exists()) else {
        return Ok(());
    };
    if existing.as_os_str().is_empty() || existing.is_dir() {
        return Ok(());
    }
    let what = if existing == dir { "it is".to_string() } else { format!("{} is", existing.display()) };
    Err(format!("{} cannot be a directory: {what} a file; give a directory", dir.display()))
}

/// A file a command reads or writes, for [`check_distinct`]: what names it (a flag, `--html`, or what a
/// positional argument is, `the scenario file`) and its path.
pub type Named<'a> = (&'a str, &'a Path);

/// Checks, before any output is created, that no output path is the same file as an input or as another output
/// (a write would replace what the command reads, or one output would overwrite the other). Paths are compared
/// as the files they name: resolved with [`std::fs::canonicalize`] where the file exists (so `./x`, `x` and a
/// symbolic link to it are one file; and on Unix, hard links by device and inode), else as the resolved parent
/// directory and the file name. A path that names no regular file (`/dev/null`, `/dev/stdout`) is never
/// refused: writing to it replaces nothing.
///
/// Errors: the first clash, naming both (what names each, and its path as given) and the rule.
pub fn check_distinct(inputs: &[Named<'_>], outputs: &[Named<'_>]) -> Result<(), String> {
    for (i, (flag, path)) in outputs.iter().enumerate() {
        let clash = inputs.iter().chain(&outputs[..i]).find(|(_, other)| same_file(path, other));
        if let Some((other_flag, other)) = clash {
            return Err(format!(
                "{flag} {} is the same file as {other_flag} {}: an output must not overwrite a file the command \
                 reads or another output; give another path",
                path.display(),
                other.display()
            ));
        }
    }
    Ok(())
}

/// Whether `a` and `b` name one regular file (existing or to be created); see [`check_distinct`].
fn same_file(a: &Path, b: &Path) -> bool {
    let (Some(a_path), Some(b_path)) = (resolved(a), resolved(b)) else { return false };
    let regular = |path: &Path| std::fs::metadata(path).map_or(true, |meta| meta.is_file());
    if !regular(&a_path) || !regular(&b_path) {
        return false;
    }
    a_path == b_path || same_inode(&a_path, &b_path)
}

/// `path` resolved: canonical if it exists, else its parent's canonical path joined with its file name; `None`
/// when neither resolves (its directory is missing: creating it will fail and say so).
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(path) = std::fs::canonicalize(path) {
        return Some(path);
    }
    let name = path.file_name()?;
    let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::canonicalize(parent).ok().map(|parent| parent.join(name))
}

/// Whether two existing files are one (hard links): same device and inode.
#[cfg(unix)]
fn same_inode(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Elsewhere, only canonical paths compare.
#[cfg(not(unix))]
fn same_inode(_: &Path, _: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed when the returned guard drops (the test's end).
    fn temp_dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("lockstep-files-{name}-")).tempdir().unwrap()
    }

    #[test]
    fn a_directory_that_is_a_file_or_lies_below_one_is_refused() {
        let scratch = temp_dir("check-dir");
        let dir = scratch.path();
        let file = dir.join("f");
        std::fs::write(&file, "x").unwrap();
        check_dir(dir).unwrap();
        check_dir(&dir.join("new/deeper")).unwrap();
        check_dir(Path::new("relative-dir-not-made")).unwrap();
        assert_eq!(
            check_dir(&file).unwrap_err(),
            format!("{} cannot be a directory: it is a file; give a directory", file.display())
        );
        let below = file.join("x");
        let error = check_dir(&below).unwrap_err();
        assert_eq!(
            error,
            format!("{} cannot be a directory: {} is a file; give a directory", below.display(), file.display())
        );
    }

    #[test]
    fn an_output_that_is_an_input_or_another_output_is_refused() {
        let scratch = temp_dir("distinct");
        let dir = scratch.path();
        let input = dir.join("mine.toml");
        std::fs::write(&input, "").unwrap();
        let spelled = dir.join(".").join("mine.toml");
        let error = check_distinct(&[("the scenario file", &input)], &[("--html", &spelled)]).unwrap_err();
        assert!(error.contains("--html ") && error.contains("is the same file as the scenario file "), "{error}");
        let (a, b) = (dir.join("same.out"), dir.join("sub/../same.out"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let error = check_distinct(&[("the scenario file", &input)], &[("--trace", &a), ("--html", &b)]).unwrap_err();
        assert!(error.contains("is the same file as --trace "), "{error}");
        let other = dir.join("other.out");
        assert!(check_distinct(&[("the scenario file", &input)], &[("--trace", &a), ("--html", &other)]).is_ok());
        let null = Path::new("/dev/null");
        assert!(check_distinct(&[], &[("--trace", null), ("--html", null)]).is_ok());
        std::fs::hard_link(&input, dir.join("link.toml")).unwrap();
        assert!(check_distinct(&[("the scenario file", &input)], &[("--html", &dir.join("link.toml"))]).is_err());
    }
}
