//! Helpers every engine and the pipeline share on tokens and ids.

/// FNV-1a, 64 bit: a stable hash (unlike `DefaultHasher`, it is fixed across
/// Rust releases), used for determinism (tool-call ids) and cache keys.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A token count as the protocol's `u32`, saturating.
pub fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
