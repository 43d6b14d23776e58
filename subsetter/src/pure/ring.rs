//! The hash ring the policies break ties on, and image fingerprints are taken with: its own
//! module, below both the load index and the image sets that use it.

/// A position on the ring: FNV-1a 64 (stable across processes, unlike std's seeded hasher),
/// then MurmurHash3's 64-bit finalizer, because names that differ only in their last
/// characters (`r1`, `r2`…) would otherwise sit next to each other and all pick one node.
pub fn ring_hash(s: &str) -> u64 {
    let mut h = RingHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

/// [`ring_hash`] of a text given in pieces: the same value as of the pieces joined, with no
/// string built for them.
#[derive(Clone, Copy, Debug)]
pub struct RingHasher(u64);

impl Default for RingHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl RingHasher {
    pub fn write(&mut self, bytes: &[u8]) {
        self.0 = bytes.iter().fold(self.0, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    }

    pub fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// How far clockwise `node_hash` lies from `revision_hash` on the ring.
pub fn ring_distance(revision_hash: u64, node_hash: u64) -> u64 {
    node_hash.wrapping_sub(revision_hash)
}
