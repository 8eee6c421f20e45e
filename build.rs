//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds each file it finds with `include_str!`,
//! which tracks edits to existing files but not new files in `migrations/` (sqlx's documented build script).

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
