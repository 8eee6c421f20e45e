//! FNV-1a, 64 bits: the crate's one stable hash. The same bytes give the same value on every platform, process
//! and build (unlike std's `DefaultHasher`, whose keys are random per process and whose function may change
//! between Rust versions). It names random streams (a pipeline's jitter, a simulated job's draw, a simulator
//! purpose's stream), PostgreSQL's migration lock and long channel names, and trace, scenario and build
//! identities. Not for adversarial input: anyone can make two texts collide.
//!
//! A leaf: it uses nothing of the crate, so every layer, and the build script (`build.rs` includes this file),
//! can use it.

/// The FNV-1a 64 offset basis.
const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The FNV-1a 64 prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes` (draft-eastlake-fnv's FNV-1a, 64 bits).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_values() {
        // The FNV reference test vectors (draft-eastlake-fnv, FNV-1a 64).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
