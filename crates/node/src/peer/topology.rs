//! Logical topologies of a group: which members hold a direct link. A group
//! of n nodes needs a bounded number of links per node (ring 2, torus 4,
//! binomial tree ⌈log2 n⌉); the router forwards the rest (seed 001 §III-B).

use std::fmt;

/// How the members of a group are linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Every pair linked: n − 1 links per node, no forwarding.
    FullMesh,
    /// rank r linked to r ± 1 (mod n).
    Ring,
    /// A 2-D torus of `cols` columns, row-major ranks (seed 001 figure 2);
    /// n must be a multiple of `cols`.
    Torus { cols: u32 },
    /// The binomial tree rooted at rank 0: r linked to r with its lowest set bit cleared.
    BinomialTree,
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::FullMesh => f.write_str("full mesh"),
            Topology::Ring => f.write_str("ring"),
            Topology::Torus { cols } => write!(f, "torus with {cols} columns"),
            Topology::BinomialTree => f.write_str("binomial tree"),
        }
    }
}

/// A topology that cannot be, or cannot hold the group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("a group needs at least one member")]
    Empty,
    #[error("a torus with {cols} columns cannot hold {n} members")]
    Torus { cols: u32, n: u32 },
    #[error("unknown topology {0:?} (mesh, ring, tree or torus:<cols>)")]
    Unknown(String),
}

impl Topology {
    /// Checks that the topology can hold `n` members.
    pub fn check(&self, n: u32) -> Result<(), TopologyError> {
        if n == 0 {
            return Err(TopologyError::Empty);
        }
        if let Topology::Torus { cols } = *self {
            if cols == 0 || !n.is_multiple_of(cols) {
                return Err(TopologyError::Torus { cols, n });
            }
        }
        Ok(())
    }

    /// Direct neighbours of `rank` in a group of `n`, ascending, without `rank`.
    pub fn neighbours(&self, rank: u32, n: u32) -> Vec<u32> {
        let mut v: Vec<u32> = match *self {
            Topology::FullMesh => (0..n).collect(),
            Topology::Ring => vec![(rank + 1) % n, (rank + n - 1) % n],
            Topology::Torus { cols } => {
                let rows = n / cols;
                let (r, c) = (rank / cols, rank % cols);
                vec![
                    ((r + 1) % rows) * cols + c,
                    ((r + rows - 1) % rows) * cols + c,
                    r * cols + (c + 1) % cols,
                    r * cols + (c + cols - 1) % cols,
                ]
            }
            Topology::BinomialTree => {
                let mut v = Vec::new();
                if rank != 0 {
                    v.push(rank & (rank - 1));
                }
                let low = if rank == 0 {
                    n.next_power_of_two()
                } else {
                    rank & rank.wrapping_neg()
                };
                let mut bit = 1;
                while bit < low {
                    if rank + bit < n {
                        v.push(rank + bit);
                    }
                    bit <<= 1;
                }
                v
            }
        };
        v.retain(|&x| x != rank && x < n);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Adjacency lists of the whole group.
    pub fn graph(&self, n: u32) -> Vec<Vec<u32>> {
        (0..n).map(|r| self.neighbours(r, n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_symmetric_and_bounded() {
        for (t, n, max) in [
            (Topology::FullMesh, 5, 4),
            (Topology::Ring, 8, 2),
            (Topology::Ring, 2, 1),
            (Topology::Torus { cols: 4 }, 16, 4),
            (Topology::Torus { cols: 2 }, 4, 2),
            (Topology::BinomialTree, 16, 4),
            (Topology::BinomialTree, 11, 4),
        ] {
            let g = t.graph(n);
            for (r, ns) in g.iter().enumerate() {
                assert!(ns.len() <= max, "{t} n={n}: rank {r} has {ns:?}");
                for &x in ns {
                    assert!(
                        g[x as usize].contains(&(r as u32)),
                        "{t}: {r}–{x} one-sided"
                    );
                }
            }
        }
    }

    #[test]
    fn torus_neighbours_wrap() {
        assert_eq!(
            Topology::Torus { cols: 4 }.neighbours(0, 16),
            vec![1, 3, 4, 12]
        );
        assert_eq!(
            Topology::Torus { cols: 3 }.check(16),
            Err(TopologyError::Torus { cols: 3, n: 16 })
        );
    }

    #[test]
    fn binomial_tree_links() {
        assert_eq!(Topology::BinomialTree.neighbours(0, 8), vec![1, 2, 4]);
        assert_eq!(Topology::BinomialTree.neighbours(6, 8), vec![4, 7]);
        assert_eq!(Topology::BinomialTree.neighbours(4, 6), vec![0, 5]);
    }
}
