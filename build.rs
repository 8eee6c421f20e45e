//! Build script:
//! - Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds each file it finds with
//!   `include_str!`, which tracks edits to existing files but not new files in `migrations/` (sqlx's documented
//!   build script).
//! - Sets `LOCKSTEP_BUILD_ID`, the build id that replay files record (`lockstep sim replay` refuses a file of
//!   another build): an FNV-1a hash of every file the binary is built from (`src/`, `sim/`, `build.rs`,
//!   `Cargo.toml`, `Cargo.lock`, `migrations/`, `.cargo/config.toml`), the compiler's version, the profile and
//!   whether this is the simulator build. It changes whenever the code changes, uncommitted edits included
//!   (a git commit and dirty flag would give two different dirty trees one id), and it is the same for two
//!   builds of the same tree (a hash of the executable is also exact but costs seconds per replay on a debug
//!   build of 100+ MB).

use std::path::{Path, PathBuf};

// The crate's FNV-1a (a leaf that uses nothing of the crate), so the build id hashes as the replay files' other
// identities do.
#[path = "src/hash.rs"]
mod hash;

const INPUTS: [&str; 7] = ["src", "sim", "build.rs", "Cargo.toml", "Cargo.lock", "migrations", ".cargo/config.toml"];

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
    // Every part hashed, each followed by a 0xff byte (no UTF-8 text holds one), so that ("ab", "c") and
    // ("a", "bc") hash apart.
    let mut hashed = Vec::new();
    let mut part = |bytes: &[u8]| {
        hashed.extend_from_slice(bytes);
        hashed.push(0xff);
    };
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        part(relative.to_string_lossy().as_bytes());
        part(&std::fs::read(file).unwrap_or_default());
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc).arg("-V").output().map(|out| out.stdout).unwrap_or_default();
    part(&version);
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let simulator = std::env::var_os("CARGO_CFG_MADSIM").is_some();
    part(format!("{profile} madsim={simulator}").as_bytes());
    let flavour = if simulator { "sim" } else { "real" };
    let package = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=LOCKSTEP_BUILD_ID={package}-{flavour}-{profile}-{:016x}", hash::fnv1a64(&hashed));
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
