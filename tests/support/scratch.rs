//! Scratch directories of the tests: a fresh directory under the system's temp dir, removed when its test is done
//! (kept, and named on stderr, when the test fails), so a passing run leaves nothing behind in `/tmp`
//! (the walk-throughs of `tests/readme.rs` and the commands of `tests/sim_cli.rs` left a directory per case).

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A directory `lockstep-{name}-{pid}` under the temp dir, emptied when made. Derefs to its path.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory for `name` (unique within this test process).
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("lockstep-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
        Scratch(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} of the failed test", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
