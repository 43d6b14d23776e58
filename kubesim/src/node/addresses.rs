//! The loopback address scheme. Linux routes all of 127.0.0.0/8 to `lo`, so every simulated
//! node and pod can have its own address and bind the same port as its neighbours.
//!
//! Node `i` is `127.(10 + i / 256).(i % 256).1`; its pods get `127.(10 + i / 256).(i % 256).z`
//! with `z` in `2..=254`.

use std::net::Ipv4Addr;

/// Second octets 10..=255 give 246 blocks of 256 nodes.
pub const MAX_NODES: usize = 246 * 256;
/// Host octets 2..=254 on a node's /24.
pub const MAX_PODS_PER_NODE: usize = 253;

const FIRST_POD_OCTET: u8 = 2;
const LAST_POD_OCTET: u8 = 254;

/// The node's own address. Panics for an index at or beyond [`MAX_NODES`]
/// (`NodeConfig::validate` refuses those first).
pub fn node_ip(index: usize) -> Ipv4Addr {
    assert!(
        index < MAX_NODES,
        "node index {index} beyond the 127/8 address scheme"
    );
    let (b, c) = block(index);
    Ipv4Addr::new(127, b, c, 1)
}

fn block(index: usize) -> (u8, u8) {
    ((10 + index / 256) as u8, (index % 256) as u8)
}

/// Whether `ip` is a pod address of node `index`.
pub fn is_pod_ip_of(index: usize, ip: Ipv4Addr) -> bool {
    let (b, c) = block(index);
    let o = ip.octets();
    o[0] == 127 && o[1] == b && o[2] == c && (FIRST_POD_OCTET..=LAST_POD_OCTET).contains(&o[3])
}

/// Pod addresses of one node. Freed addresses are reused round-robin (the next allocation
/// continues after the last one handed out) so a just-freed address, which a client may still
/// have in a cache, is the last to come back.
#[derive(Debug)]
pub struct PodIpPool {
    prefix: (u8, u8),
    used: [bool; 256],
    next: u8,
    in_use: usize,
}

impl PodIpPool {
    pub fn new(node_index: usize) -> Self {
        PodIpPool {
            prefix: block(node_index),
            used: [false; 256],
            next: FIRST_POD_OCTET,
            in_use: 0,
        }
    }

    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        if self.in_use >= MAX_PODS_PER_NODE {
            return None;
        }
        let mut z = self.next;
        loop {
            if !self.used[z as usize] {
                self.used[z as usize] = true;
                self.in_use += 1;
                self.next = if z == LAST_POD_OCTET {
                    FIRST_POD_OCTET
                } else {
                    z + 1
                };
                return Some(self.ip(z));
            }
            z = if z == LAST_POD_OCTET {
                FIRST_POD_OCTET
            } else {
                z + 1
            };
        }
    }

    /// Marks a specific address used (a pod that already has it, found on re-sync).
    /// False when it is not this node's pod address or already taken.
    pub fn claim(&mut self, ip: Ipv4Addr) -> bool {
        let Some(z) = self.octet(ip) else {
            return false;
        };
        if self.used[z as usize] {
            return false;
        }
        self.used[z as usize] = true;
        self.in_use += 1;
        true
    }

    pub fn free(&mut self, ip: Ipv4Addr) {
        if let Some(z) = self.octet(ip)
            && self.used[z as usize]
        {
            self.used[z as usize] = false;
            self.in_use -= 1;
        }
    }

    pub fn in_use(&self) -> usize {
        self.in_use
    }

    fn ip(&self, z: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.prefix.0, self.prefix.1, z)
    }

    fn octet(&self, ip: Ipv4Addr) -> Option<u8> {
        let o = ip.octets();
        (o[0] == 127
            && (o[1], o[2]) == self.prefix
            && (FIRST_POD_OCTET..=LAST_POD_OCTET).contains(&o[3]))
        .then_some(o[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses() {
        assert_eq!(node_ip(0), Ipv4Addr::new(127, 10, 0, 1));
        assert_eq!(node_ip(255), Ipv4Addr::new(127, 10, 255, 1));
        assert_eq!(node_ip(256), Ipv4Addr::new(127, 11, 0, 1));
        assert_eq!(node_ip(4999), Ipv4Addr::new(127, 29, 135, 1));
        assert_eq!(node_ip(MAX_NODES - 1), Ipv4Addr::new(127, 255, 255, 1));
    }

    #[test]
    #[should_panic(expected = "beyond")]
    fn node_index_out_of_range_panics() {
        node_ip(MAX_NODES);
    }

    #[test]
    fn pool_allocates_all_then_reuses_round_robin() {
        let mut pool = PodIpPool::new(257);
        let all: Vec<_> = std::iter::from_fn(|| pool.allocate()).collect();
        assert_eq!(all.len(), MAX_PODS_PER_NODE);
        assert_eq!(all[0], Ipv4Addr::new(127, 11, 1, 2));
        assert_eq!(all[252], Ipv4Addr::new(127, 11, 1, 254));
        assert!(
            all.iter()
                .all(|ip| is_pod_ip_of(257, *ip) && !is_pod_ip_of(256, *ip))
        );
        pool.free(Ipv4Addr::new(127, 11, 1, 9));
        pool.free(Ipv4Addr::new(127, 11, 1, 5));
        // Continues after the last one handed out (254 wraps to 2), so .5 comes before .9.
        assert_eq!(pool.allocate(), Some(Ipv4Addr::new(127, 11, 1, 5)));
        assert_eq!(pool.allocate(), Some(Ipv4Addr::new(127, 11, 1, 9)));
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn freed_address_is_not_reused_first() {
        let mut pool = PodIpPool::new(0);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        pool.free(a);
        let c = pool.allocate().unwrap();
        assert_ne!(c, a);
        assert_ne!(c, b);
        assert_eq!(pool.in_use(), 2);
    }

    #[test]
    fn claim_and_foreign_addresses() {
        let mut pool = PodIpPool::new(0);
        assert!(pool.claim(Ipv4Addr::new(127, 10, 0, 2)));
        assert!(!pool.claim(Ipv4Addr::new(127, 10, 0, 2)));
        assert!(
            !pool.claim(Ipv4Addr::new(127, 10, 0, 1)),
            "the node's own address"
        );
        assert!(
            !pool.claim(Ipv4Addr::new(127, 10, 1, 5)),
            "another node's block"
        );
        assert_eq!(pool.allocate(), Some(Ipv4Addr::new(127, 10, 0, 3)));
        pool.free(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(pool.in_use(), 2);
    }
}
