//! What the scheduler shows in the status: functions, and per user and per
//! node the shared-mode fields the registry does not know.

use std::collections::HashMap;

use corefarm_smp::{ClusterStatus, FunctionStatus};

use super::{Sched, SlotState};

/// The scheduler's part of the status, published by the driver.
#[derive(Debug, Default, Clone)]
pub struct View {
    pub functions: Vec<FunctionStatus>,
    /// User id → (function, queued, in flight).
    pub users: HashMap<u64, (Option<String>, u64, u64)>,
    /// Node id → the function it holds or loads.
    pub nodes: HashMap<u64, String>,
}

impl View {
    /// Fills the shared-mode fields of a registry snapshot.
    pub fn merge(&self, s: &mut ClusterStatus) {
        s.functions = self.functions.clone();
        for n in &mut s.nodes {
            n.function = self.nodes.get(&n.id).cloned();
        }
        for u in &mut s.users {
            if let Some((f, queued, in_flight)) = self.users.get(&u.id) {
                u.function = f.clone();
                u.queued = *queued;
                u.in_flight = *in_flight;
                // No node is any user's here: a user's nodes are those
                // holding or loading its function, which it shares.
                u.nodes = s
                    .nodes
                    .iter()
                    .filter(|n| f.is_some() && n.function == *f)
                    .map(|n| n.id)
                    .collect();
            }
        }
    }
}

impl Sched {
    /// A function's name as status shows it (its short id if unknown).
    fn label(&self, f: super::FnId) -> String {
        self.fns
            .get(&f)
            .map_or_else(|| f.short(), |x| x.label.clone())
    }

    pub fn view(&self) -> View {
        let mut functions: Vec<FunctionStatus> = self
            .fns
            .values()
            .map(|f| {
                let mut st = FunctionStatus {
                    id: f.id.short(),
                    name: Some(f.label.clone()),
                    queued: f.queue.len() as u64,
                    demand: f.demand,
                    service_us: f.service.map(|s| s * 1e6),
                    reconfigurations: f.reconfigurations,
                    users: f.users.iter().copied().collect(),
                    ..Default::default()
                };
                for s in self.nodes.values() {
                    match s.state {
                        SlotState::Configuring { target, .. } if target == f.id => st.loading += 1,
                        SlotState::Ready | SlotState::Draining { .. }
                            if s.function == Some(f.id) =>
                        {
                            st.replicas += u32::from(s.state == SlotState::Ready);
                            st.in_flight += s.in_flight.len() as u64;
                        }
                        _ => {}
                    }
                }
                st
            })
            .collect();
        functions.sort_by(|a, b| a.id.cmp(&b.id));
        let users = self
            .users
            .iter()
            .filter(|(_, u)| !u.joining)
            .map(|(&id, u)| {
                let queued = u
                    .function
                    .and_then(|f| self.fns.get(&f))
                    .map_or(0, |f| f.queue.len_of(id) as u64);
                let label = u.function.map(|f| self.label(f));
                (id, (label, queued, u.in_flight))
            })
            .collect();
        let nodes = self
            .nodes
            .iter()
            .filter_map(|(&id, s)| {
                let f = match s.state {
                    SlotState::Configuring { target, .. } => Some(target),
                    _ => s.function,
                };
                f.map(|f| (id, self.label(f)))
            })
            .collect();
        View {
            functions,
            users,
            nodes,
        }
    }
}
