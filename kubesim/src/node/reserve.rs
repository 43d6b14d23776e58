//! Reserving a block of node indices (and so of loopback addresses) for one simulated cluster,
//! so clusters in concurrently running tests — threads of one process or separate processes —
//! never bind the same addresses.
//!
//! The lock is a listening socket on the first node address of every chunk of the block, at a
//! port outside the ephemeral range: the kernel releases it when the holder exits, however it
//! exits, so there is nothing to clean up.

use std::net::{SocketAddrV4, TcpListener};

use rand::RngExt;

use super::addresses::{MAX_NODES, node_ip};
use super::error::NodeError;

/// Blocks are made of chunks of this many consecutive node indices.
const CHUNK: usize = 16;
/// Reservations start above the first 256 indices, which tests may use directly.
const FIRST_RESERVABLE: usize = 256;
/// Outside Linux's default ephemeral range (32768–60999), so no client socket takes it.
const LOCK_PORT: u16 = 65_001;

/// A reserved run of node indices; released when dropped.
#[derive(Debug)]
pub struct NodeBlock {
    first: usize,
    count: usize,
    _locks: Vec<TcpListener>,
}

impl NodeBlock {
    /// The first reserved node index.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The reserved node indices.
    pub fn indices(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.count
    }
}

/// Reserves `count` consecutive node indices no other live reservation holds.
pub fn reserve_nodes(count: usize) -> Result<NodeBlock, NodeError> {
    let chunks = count.div_ceil(CHUNK).max(1);
    let first_chunk = FIRST_RESERVABLE / CHUNK;
    let last_chunk = MAX_NODES / CHUNK;
    if first_chunk + chunks > last_chunk {
        return Err(NodeError::InvalidConfig(format!(
            "cannot reserve {count} nodes: at most {} fit the address scheme",
            (last_chunk - first_chunk) * CHUNK
        )));
    }
    let mut rng = rand::rng();
    for _ in 0..64 {
        let start = rng.random_range(first_chunk..=last_chunk - chunks);
        let locks: Result<Vec<TcpListener>, _> = (start..start + chunks)
            .map(|c| TcpListener::bind(SocketAddrV4::new(node_ip(c * CHUNK), LOCK_PORT)))
            .collect();
        if let Ok(locks) = locks {
            return Ok(NodeBlock {
                first: start * CHUNK,
                count,
                _locks: locks,
            });
        }
    }
    Err(NodeError::InvalidConfig(format!(
        "no free block of {count} node addresses after 64 tries"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_reservations_never_overlap() {
        let blocks: Vec<NodeBlock> = (0..20).map(|_| reserve_nodes(40).unwrap()).collect();
        for (i, a) in blocks.iter().enumerate() {
            assert!(a.first() >= FIRST_RESERVABLE);
            for b in &blocks[i + 1..] {
                let (a, b) = (a.indices(), b.indices());
                assert!(a.end <= b.start || b.end <= a.start, "{a:?} overlaps {b:?}");
            }
        }
    }

    #[test]
    fn a_released_block_can_be_taken_again() {
        let b = reserve_nodes(1).unwrap();
        let first = b.first();
        drop(b);
        // The exact chunk is free again: binding its lock succeeds.
        TcpListener::bind(SocketAddrV4::new(node_ip(first), LOCK_PORT)).unwrap();
    }
}
