//! Build script: sets `USER_PIPELINES_BUILD_ID`, the build id this project's simulator binary gives lockstep
//! (`Registry::with_build_id`), from a hash of the files its handlers are built from. Replay files record the id
//! and `replay` refuses a file of another id, so a replay written before an edit of a handler is refused with the
//! command that runs its scenario again, instead of replaying other code and reporting a determinism bug. Copy it
//! into a project of your own and list your sources in `INPUTS`; it needs nothing but `std`.

use std::path::{Path, PathBuf};

const INPUTS: [&str; 3] = ["src", "build.rs", "Cargo.toml"];

fn main() {
    for input in INPUTS {
        println!("cargo:rerun-if-changed={input}");
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for input in INPUTS {
        collect(&root.join(input), &mut files);
    }
    files.sort();
    // FNV-1a 64 over each file's path (relative to the project) and bytes: the same tree gives the same id.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file).to_string_lossy().into_owned();
        for byte in relative.bytes().chain(std::fs::read(file).unwrap_or_default()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=USER_PIPELINES_BUILD_ID=user-pipelines-{version}-{hash:016x}");
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else { return };
        for entry in entries.flatten() {
            collect(&entry.path(), files);
        }
    } else if path.is_file() {
        files.push(path.to_path_buf());
    }
}
