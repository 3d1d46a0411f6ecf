//! Who may hold a place on a node's peer port before it has said hello,
//! and what the port refused.
//!
//! Anyone who reaches the port can open connections; only a member (or a
//! direct user) of a group joined here can say a hello that leads
//! anywhere, and both say it as soon as they connect. So a connection
//! that has not yet said hello is cheap to drop: it holds one of at most
//! [`Admission`]'s places, for at most the hello deadline, and a newer
//! connection never waits for one to come free. It takes the place of the
//! oldest connection of its own source once that source holds its share,
//! or else, on a full port, of the oldest connection of the source holding
//! most. One flooding address thus keeps nobody else out, and a member's
//! connection, whose hello is read as soon as it arrives, is only dropped
//! by a flood from its own address (its dialer then tries again).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Connections waiting for their hello, with what ends each (an abort
/// handle on the port; anything in tests), oldest first.
pub(crate) struct Admission<H> {
    max: usize,
    per_source: usize,
    next: u64,
    pending: VecDeque<Pending<H>>,
}

pub(crate) struct Pending<H> {
    pub id: u64,
    pub from: SocketAddr,
    pub handle: H,
}

impl<H> Admission<H> {
    pub fn new(max: usize, per_source: usize) -> Self {
        Admission {
            max: max.max(1),
            per_source: per_source.clamp(1, max.max(1)),
            next: 0,
            pending: VecDeque::new(),
        }
    }

    /// The connection that must yield for a new one from `ip`, if any.
    pub fn victim(&self, ip: IpAddr) -> Option<u64> {
        let ip = source(ip);
        let mine = || self.pending.iter().filter(|p| source(p.from.ip()) == ip);
        if mine().count() >= self.per_source {
            return mine().next().map(|p| p.id);
        }
        if self.pending.len() < self.max {
            return None;
        }
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        for p in &self.pending {
            *held.entry(source(p.from.ip())).or_default() += 1;
        }
        let most = held.values().copied().max()?;
        // Ties go to the source whose oldest connection is oldest.
        self.pending
            .iter()
            .find(|p| held[&source(p.from.ip())] == most)
            .map(|p| p.id)
    }

    /// The id the next connection admitted will have.
    pub fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub fn admit(&mut self, id: u64, from: SocketAddr, handle: H) {
        self.pending.push_back(Pending { id, from, handle });
    }

    /// Takes a connection off the list: it said hello, gave up, or yields
    /// its place (`None`: it was already taken off).
    pub fn remove(&mut self, id: u64) -> Option<Pending<H>> {
        let at = self.pending.iter().position(|p| p.id == id)?;
        self.pending.remove(at)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

/// The source a connection's places are counted against: its IPv4
/// address, or its IPv6 /64 (the block one host is typically given, so a
/// host cannot pass for many by changing the low bits).
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
            }
        },
    }
}

/// Why the peer port ended a connection before it became a link or a
/// direct connection (`node_manager_peer_port_refused_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its place went to a newer connection before it said hello.
    Evicted,
    /// No hello within the deadline, or closed before one.
    NoHello,
    /// Its first message was not a peer hello.
    BadHello,
    /// A hello for a group not joined here (a member dialing early sees
    /// this too, and dials again).
    UnknownGroup,
    /// A hello without the group's token.
    WrongToken,
    /// The group's token, but from or to a rank that may not link here.
    WrongRank,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::Evicted,
        Refusal::NoHello,
        Refusal::BadHello,
        Refusal::UnknownGroup,
        Refusal::WrongToken,
        Refusal::WrongRank,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Evicted => "evicted",
            Refusal::NoHello => "no_hello",
            Refusal::BadHello => "bad_hello",
            Refusal::UnknownGroup => "unknown_group",
            Refusal::WrongToken => "wrong_token",
            Refusal::WrongRank => "wrong_rank",
        }
    }
}

/// At most one warning line about refused connections per this long and
/// port: a flood is counted, not written out connection by connection.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a peer port refused, by reason.
#[derive(Debug, Default)]
pub struct PortStats {
    counts: [AtomicU64; Refusal::ALL.len()],
    log: Mutex<LogGate>,
}

#[derive(Debug, Default)]
struct LogGate {
    last: Option<Instant>,
    /// Refusals not written since `last`.
    quiet: u64,
}

impl PortStats {
    /// Connections refused for `why` so far.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.counts[why as usize].load(Ordering::Relaxed)
    }

    /// Every reason with its count, in [`Refusal::ALL`]'s order.
    pub fn all(&self) -> [(Refusal, u64); Refusal::ALL.len()] {
        Refusal::ALL.map(|r| (r, self.refused(r)))
    }

    /// Counts a refusal and logs it, rate-limited. `what` may quote the
    /// peer only through bounded strings.
    pub(crate) fn refuse(&self, why: Refusal, from: SocketAddr, what: &dyn fmt::Display) {
        self.counts[why as usize].fetch_add(1, Ordering::Relaxed);
        if why == Refusal::UnknownGroup {
            // Members dialing before this node joined look the same.
            return tracing::debug!("peer port: {from}: {what}");
        }
        let quiet = {
            let mut g = self.log.lock().expect("log gate lock");
            let now = Instant::now();
            if g.last.is_some_and(|t| now < t + LOG_EVERY) {
                g.quiet += 1;
                return;
            }
            g.last = Some(now);
            std::mem::take(&mut g.quiet)
        };
        match quiet {
            0 => tracing::warn!("peer port: {from}: {what}"),
            n => tracing::warn!(
                "peer port: {from}: {what} (and {n} more connection(s) refused since the last \
                 such line; node_manager_peer_port_refused_total counts them by reason)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ip: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((ip, port))
    }

    fn fill(a: &mut Admission<()>, ip: [u8; 4], n: u16) -> Vec<u64> {
        (0..n)
            .map(|i| {
                let id = a.next_id();
                a.admit(id, at(ip, 1000 + i), ());
                id
            })
            .collect()
    }

    #[test]
    fn a_source_over_its_share_yields_its_own_oldest() {
        let mut a = Admission::new(8, 3);
        let other = fill(&mut a, [10, 0, 0, 2], 1);
        let mine = fill(&mut a, [10, 0, 0, 1], 3);
        assert_eq!(a.victim([10, 0, 0, 1].into()), Some(mine[0]));
        // Another source still has room: nobody yields.
        assert_eq!(a.victim([10, 0, 0, 3].into()), None);
        assert_eq!(a.victim([10, 0, 0, 2].into()), None);
        assert!(a.remove(mine[0]).is_some());
        assert!(a.remove(mine[0]).is_none(), "taken off once");
        assert_eq!(a.victim([10, 0, 0, 1].into()), None);
        assert_eq!(a.len(), 3);
        let _ = other;
    }

    #[test]
    fn a_full_port_takes_the_oldest_place_of_the_source_holding_most() {
        let mut a = Admission::new(6, 4);
        let quiet = fill(&mut a, [10, 0, 0, 2], 2);
        let flood = fill(&mut a, [10, 0, 0, 1], 4);
        // A third source arrives at a full port: the flood yields, not the
        // older connections of the source holding less.
        assert_eq!(a.victim([10, 0, 0, 3].into()), Some(flood[0]));
        // Between equal holdings, the oldest connection yields.
        let mut b = Admission::new(4, 2);
        let first = fill(&mut b, [10, 0, 0, 2], 2);
        fill(&mut b, [10, 0, 0, 1], 2);
        assert_eq!(b.victim([10, 0, 0, 3].into()), Some(first[0]));
        let _ = quiet;
    }

    #[test]
    fn an_ipv6_source_is_its_64_block() {
        let mut a = Admission::new(8, 2);
        let v6 = |last: u16| SocketAddr::from(([0x2001, 0xdb8, 0, 1, 0, 0, 0, last], 9));
        let first = a.next_id();
        a.admit(first, v6(1), ());
        let id = a.next_id();
        a.admit(id, v6(2), ());
        let other_block: IpAddr = [0x2001, 0xdb8, 0, 2, 0, 0, 0, 1].into();
        assert_eq!(a.victim(other_block), None);
        assert_eq!(a.victim(v6(0xffff).ip()), Some(first));
        // An IPv4 peer on a dual-stack port is its IPv4 address.
        let mapped: IpAddr = std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().into();
        assert_eq!(source(mapped), IpAddr::from([10, 0, 0, 1]));
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let s = PortStats::default();
        let from = at([127, 0, 0, 1], 9);
        for _ in 0..3 {
            s.refuse(Refusal::NoHello, from, &"no hello");
        }
        s.refuse(Refusal::UnknownGroup, from, &"unknown group 4");
        assert_eq!(s.refused(Refusal::NoHello), 3);
        assert_eq!(s.refused(Refusal::UnknownGroup), 1);
        assert_eq!(s.refused(Refusal::Evicted), 0);
        assert_eq!(s.all().iter().map(|(_, n)| n).sum::<u64>(), 4);
    }
}
