//! The logical trees of seed 003 §4.2.2.4, rooted anywhere: ranks are taken
//! relative to the root (v = (rank − root) mod n), so every tree's subtree
//! is a contiguous range of relative ranks.

use corefarm_smp::Algo;

#[derive(Debug, Clone, Copy)]
pub struct Tree {
    pub algo: Algo,
    pub n: u32,
    pub root: u32,
}

impl Tree {
    pub fn new(algo: Algo, n: u32, root: u32) -> Self {
        Tree { algo, n, root }
    }

    fn rel(&self, rank: u32) -> u32 {
        (rank + self.n - self.root) % self.n
    }

    fn abs(&self, v: u32) -> u32 {
        (v + self.root) % self.n
    }

    fn lowbit(v: u32) -> u32 {
        v & v.wrapping_neg()
    }

    pub fn parent(&self, rank: u32) -> Option<u32> {
        let v = self.rel(rank);
        if v == 0 {
            return None;
        }
        Some(self.abs(match self.algo {
            Algo::Linear => v - 1,
            Algo::Star => 0,
            Algo::Binomial => v - Self::lowbit(v),
        }))
    }

    /// Children, largest subtree first (so the longest path starts first).
    pub fn children(&self, rank: u32) -> Vec<u32> {
        let v = self.rel(rank);
        let rel: Vec<u32> = match self.algo {
            Algo::Linear => (v + 1 < self.n).then_some(v + 1).into_iter().collect(),
            Algo::Star if v == 0 => (1..self.n).collect(),
            Algo::Star => Vec::new(),
            Algo::Binomial => {
                let limit = if v == 0 {
                    self.n.next_power_of_two()
                } else {
                    Self::lowbit(v)
                };
                let mut c = Vec::new();
                let mut bit = limit >> 1;
                while bit > 0 {
                    if v + bit < self.n {
                        c.push(v + bit);
                    }
                    bit >>= 1;
                }
                c
            }
        };
        rel.into_iter().map(|v| self.abs(v)).collect()
    }

    /// Number of ranks in the subtree of `rank` (itself included).
    pub fn subtree_size(&self, rank: u32) -> u32 {
        let v = self.rel(rank);
        if v == 0 {
            return self.n;
        }
        match self.algo {
            Algo::Linear => self.n - v,
            Algo::Star => 1,
            Algo::Binomial => Self::lowbit(v).min(self.n - v),
        }
    }

    /// Ranks in the subtree of `rank`, itself first.
    pub fn subtree(&self, rank: u32) -> impl Iterator<Item = u32> + '_ {
        let v = self.rel(rank);
        (v..v + self.subtree_size(rank)).map(|x| self.abs(x))
    }

    pub fn in_subtree(&self, of: u32, rank: u32) -> bool {
        // Ranks come from peers' chunk headers: one past the group is in
        // no subtree (and would wrap round to one that is).
        if of >= self.n || rank >= self.n {
            return false;
        }
        let (v, x) = (self.rel(of), self.rel(rank));
        x >= v && x < v + self.subtree_size(of)
    }

    /// Depth of the tree: the number of sequential stages of a broadcast.
    pub fn depth(&self) -> u32 {
        (0..self.n)
            .map(|r| {
                let (mut d, mut at) = (0, r);
                while let Some(p) = self.parent(at) {
                    d += 1;
                    at = p;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tree_spans_the_group_once() {
        for algo in [Algo::Linear, Algo::Binomial, Algo::Star] {
            for n in 1..20 {
                for root in [0, n / 2, n - 1] {
                    let t = Tree::new(algo, n, root);
                    let mut reached = vec![0; n as usize];
                    for r in 0..n {
                        for c in t.children(r) {
                            assert_eq!(t.parent(c), Some(r), "{algo} n={n} root={root}");
                            reached[c as usize] += 1;
                        }
                        let sum: u32 = t.children(r).iter().map(|&c| t.subtree_size(c)).sum();
                        assert_eq!(sum + 1, t.subtree_size(r), "{algo} n={n} rank {r}");
                        assert!(t.subtree(r).all(|x| t.in_subtree(r, x)));
                    }
                    reached[root as usize] += 1;
                    assert!(reached.iter().all(|&x| x == 1), "{algo} n={n}: {reached:?}");
                }
            }
        }
    }

    #[test]
    fn ranks_outside_the_group_are_in_no_subtree() {
        for algo in [Algo::Linear, Algo::Binomial, Algo::Star] {
            let t = Tree::new(algo, 4, 1);
            for of in 0..4 {
                assert!(!t.in_subtree(of, 4 + of), "{algo:?}");
                assert!(!t.in_subtree(of, u32::MAX), "{algo:?}");
                assert!(!t.in_subtree(u32::MAX, of), "{algo:?}");
            }
        }
    }

    #[test]
    fn depths_match_the_seed() {
        assert_eq!(Tree::new(Algo::Binomial, 16, 3).depth(), 4);
        assert_eq!(Tree::new(Algo::Linear, 16, 0).depth(), 15);
        assert_eq!(Tree::new(Algo::Star, 16, 0).depth(), 1);
        assert_eq!(Tree::new(Algo::Binomial, 8, 0).children(0), vec![4, 2, 1]);
    }
}
