//! The run's random streams (DESIGN §5): every random choice of the harness (workload, each fault process, the
//! database node, the handlers' processing) draws from its own ChaCha stream, keyed by the run's seed and the
//! purpose's name. Adding a fault process or a draw in one stream never reshuffles another.
//!
//! (madsim's own RNG, seeded with the same seed, drives what the simulator itself randomizes: network latency
//! and loss, and `buggify`.)

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The stream of `purpose` in the run seeded by `seed`.
pub fn stream(seed: u64, purpose: &str) -> ChaCha8Rng {
    keyed(seed, purpose, 0)
}

/// The stream of `purpose`, instance `key` (a fault process's index, a database incarnation, a lease), in the
/// run seeded by `seed`: what one instance draws depends on (seed, purpose, key) only.
pub fn keyed(seed: u64, purpose: &str, key: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ key.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // FNV-1a of the purpose: a stable stream number for a name.
    rng.set_stream(crate::hash::fnv1a64(purpose.as_bytes()));
    rng
}
