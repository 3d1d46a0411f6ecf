//! Routing (seed 001 §III-B: a separate, replaceable routing module). The
//! default routes along a shortest path of the group's topology and routes
//! around links that went down.

use std::collections::VecDeque;

/// Chooses the next hop toward a destination, for one node.
pub trait Router: Send + 'static {
    /// The neighbour to hand a message for `dst` to; `None` if unreachable.
    fn next_hop(&self, dst: u32) -> Option<u32>;
    /// The link between `a` and `b` is gone: stop routing over it.
    fn link_down(&mut self, a: u32, b: u32);
}

/// Shortest paths by breadth-first search from this node over the group's
/// graph (ties go to the lowest-numbered neighbour, so routes are stable and
/// each source–destination pair keeps its order).
#[derive(Debug, Clone)]
pub struct ShortestPath {
    me: u32,
    graph: Vec<Vec<u32>>,
    first_hop: Vec<Option<u32>>,
}

impl ShortestPath {
    pub fn new(me: u32, graph: Vec<Vec<u32>>) -> Self {
        let mut r = ShortestPath {
            me,
            graph,
            first_hop: Vec::new(),
        };
        r.recompute();
        r
    }

    fn recompute(&mut self) {
        let n = self.graph.len();
        let mut first = vec![None; n];
        let mut seen = vec![false; n];
        let mut q = VecDeque::new();
        if (self.me as usize) < n {
            seen[self.me as usize] = true;
            for &x in &self.graph[self.me as usize] {
                if !seen[x as usize] {
                    seen[x as usize] = true;
                    first[x as usize] = Some(x);
                    q.push_back(x);
                }
            }
        }
        while let Some(u) = q.pop_front() {
            for &x in &self.graph[u as usize] {
                if !seen[x as usize] {
                    seen[x as usize] = true;
                    first[x as usize] = first[u as usize];
                    q.push_back(x);
                }
            }
        }
        self.first_hop = first;
    }

    /// Hops from this node to `dst` along current routes (tests, models).
    pub fn distance(&self, dst: u32) -> Option<u32> {
        let mut d = 0;
        let mut at = self.me;
        while at != dst {
            let next = ShortestPath::new(at, self.graph.clone()).next_hop(dst)?;
            at = next;
            d += 1;
        }
        Some(d)
    }
}

impl Router for ShortestPath {
    fn next_hop(&self, dst: u32) -> Option<u32> {
        self.first_hop.get(dst as usize).copied().flatten()
    }

    fn link_down(&mut self, a: u32, b: u32) {
        let n = self.graph.len() as u32;
        if a < n && b < n {
            self.graph[a as usize].retain(|&x| x != b);
            self.graph[b as usize].retain(|&x| x != a);
            self.recompute();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::Topology;

    #[test]
    fn ring_routes_the_short_way_and_around_a_broken_link() {
        let mut r = ShortestPath::new(0, Topology::Ring.graph(8));
        assert_eq!(r.next_hop(3), Some(1));
        assert_eq!(r.next_hop(6), Some(7));
        assert_eq!(r.distance(4), Some(4));
        r.link_down(0, 1);
        assert_eq!(r.next_hop(1), Some(7));
        r.link_down(0, 7);
        assert_eq!(r.next_hop(3), None);
    }

    #[test]
    fn torus_distances_are_manhattan_with_wraparound() {
        let g = Topology::Torus { cols: 4 }.graph(16);
        let r = ShortestPath::new(0, g);
        assert_eq!(r.distance(5), Some(2));
        assert_eq!(r.distance(10), Some(4));
        assert_eq!(r.distance(15), Some(2));
    }
}
