//! One node's membership in a group: its links, routing, and inbox.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use corefarm_smp::{CollHeader, PeerBody, PeerFrame, PeerHeader, PeerKind, PeerMsg};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::dedup::DedupWindow;
use super::link::{self, hello, Opened};
use super::router::{Router, ShortestPath};
use super::sched::{round_robin, Queued, SchedulerFactory};
use super::{FabricError, GroupSpec, LinkError, Member, PeerListener, Refusal, SpecError};

/// Messages waiting in a fabric's inbox before its links stop reading.
const INBOX: usize = 1024;
/// `coll_seq` of an abort that concerns no particular collective.
pub const NO_COLLECTIVE: u32 = u32::MAX;

/// What a fabric delivers to its owner.
#[derive(Debug)]
pub enum Event {
    /// A collective chunk addressed to this node.
    Chunk {
        src: u32,
        coll: CollHeader,
        data: Bytes,
    },
    /// The link to a neighbour ended.
    Lost { rank: u32, reason: String },
    /// Another member reports a failed collective and whom it blames.
    Abort {
        reporter: u32,
        culprit: u32,
        coll_seq: u32,
        reason: String,
    },
}

/// Counters of one fabric (seed 001's per-node packet statistics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FabricStats {
    /// Messages addressed to this node and accepted.
    pub delivered: u64,
    /// Messages passed on toward another node.
    pub forwarded: u64,
    /// Messages rejected as duplicates.
    pub duplicates: u64,
    /// Messages that could not be forwarded (no hops left, no route).
    pub dropped: u64,
}

#[derive(Clone)]
struct LinkTx {
    tx: mpsc::UnboundedSender<Queued>,
    budget: Arc<Semaphore>,
}

/// What the fabric handle and every peer link share: the group, the
/// router, the links by rank, the duplicate windows and the counters.
pub(crate) struct FabricState {
    group: u32,
    rank: u32,
    members: Vec<Member>,
    ttl: u16,
    max_frame: u32,
    link_budget: usize,
    router: Mutex<Box<dyn Router>>,
    links: Mutex<HashMap<u32, LinkTx>>,
    dedup: Mutex<HashMap<u32, DedupWindow>>,
    next_seq: AtomicU64,
    inbox: mpsc::Sender<Event>,
    delivered: AtomicU64,
    forwarded: AtomicU64,
    duplicates: AtomicU64,
    dropped: AtomicU64,
}

impl FabricState {
    fn n(&self) -> u32 {
        self.members.len() as u32
    }

    /// A message read from a link: delivered, forwarded, or (`Err`) a
    /// reason to drop the link.
    pub(crate) async fn incoming(&self, mut m: PeerMsg) -> Result<(), LinkError> {
        let h = m.header;
        if h.group != self.group {
            return Err(LinkError::OtherGroup {
                got: h.group,
                ours: self.group,
            });
        }
        if h.src >= self.n() || h.dst >= self.n() {
            return Err(LinkError::NoSuchRank {
                src: h.src,
                dst: h.dst,
                n: self.n(),
            });
        }
        if h.kind == PeerKind::Hello {
            return Err(LinkError::SecondHello);
        }
        if h.dst != self.rank {
            if h.ttl == 0 {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    group = self.group,
                    "dropped a message from rank {} to rank {}: no hops left",
                    h.src,
                    h.dst
                );
                return Ok(());
            }
            m.header.ttl -= 1;
            let frame = m.to_frame().map_err(LinkError::Invalid)?;
            match self.route(h.dst, frame, None) {
                Ok(()) => self.forwarded.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.dropped.fetch_add(1, Ordering::Relaxed),
            };
            return Ok(());
        }
        let fresh = self
            .dedup
            .lock()
            .expect("dedup lock")
            .entry(h.src)
            .or_default()
            .accept(h.seq);
        if !fresh {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let ev = match m.body {
            PeerBody::Collective { coll, data } => Event::Chunk {
                src: h.src,
                coll,
                data,
            },
            PeerBody::Abort {
                culprit,
                coll_seq,
                reason,
            } => Event::Abort {
                reporter: h.src,
                culprit,
                coll_seq,
                reason,
            },
            PeerBody::Hello { .. } => unreachable!("hello refused above"),
        };
        // The owner may have dropped its inbox (fabric shutting down).
        let _ = self.inbox.send(ev).await;
        Ok(())
    }

    fn next_hop(&self, dst: u32) -> Result<LinkTx, FabricError> {
        let hop = self.router.lock().expect("router lock").next_hop(dst);
        hop.and_then(|h| self.links.lock().expect("links lock").get(&h).cloned())
            .ok_or_else(|| FabricError::NoRoute {
                rank: dst,
                member: self.members[dst as usize].to_string(),
            })
    }

    fn route(
        &self,
        dst: u32,
        frame: PeerFrame,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<(), FabricError> {
        let link = self.next_hop(dst)?;
        link.tx
            .send(Queued::new(dst, frame, permit))
            .map_err(|_| FabricError::NoRoute {
                rank: dst,
                member: self.members[dst as usize].to_string(),
            })
    }

    fn message(&self, kind: PeerKind, dst: u32, body: PeerBody) -> PeerMsg {
        PeerMsg {
            header: PeerHeader {
                kind,
                ttl: self.ttl,
                group: self.group,
                src: self.rank,
                dst,
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            },
            body,
        }
    }

    /// Tells every other reachable member that a collective failed because of `culprit`.
    pub(crate) fn flood_abort(&self, culprit: u32, coll_seq: u32, reason: &str) {
        // The culprit too, if it still listens: it learns what the others saw.
        for r in (0..self.n()).filter(|&r| r != self.rank) {
            let body = PeerBody::Abort {
                culprit,
                coll_seq,
                reason: reason.to_string(),
            };
            if let Ok(f) = self.message(PeerKind::Abort, r, body).to_frame() {
                let _ = self.route(r, f, None);
            }
        }
    }

    pub(crate) async fn link_lost(&self, peer: u32, reason: String) {
        self.links.lock().expect("links lock").remove(&peer);
        self.router
            .lock()
            .expect("router lock")
            .link_down(self.rank, peer);
        // A clean close is how every link ends when its group does; a link
        // that closes mid-collective fails that collective, which the user
        // hears about, so only the broken ones are worth a warning here.
        let member = &self.members[peer as usize];
        if reason == CLOSED {
            tracing::info!(
                group = self.group,
                rank = self.rank,
                "link to rank {peer} ({member}) closed"
            );
        } else {
            tracing::warn!(
                group = self.group,
                rank = self.rank,
                "link to rank {peer} ({member}) lost: {reason}"
            );
        }
        let _ = self
            .inbox
            .send(Event::Lost {
                rank: peer,
                reason: reason.clone(),
            })
            .await;
        let why = format!("its link to rank {} was lost: {reason}", self.rank);
        self.flood_abort(peer, NO_COLLECTIVE, &why);
    }
}

/// The reason of a link its peer closed cleanly.
pub(crate) const CLOSED: &str = "connection closed";

/// How long a dropped fabric's links may take to send what is queued
/// (aborts telling the others why this member failed, typically).
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One node's membership in a group. Dropping it stops reading its links,
/// lets them send what is queued (bounded by a timeout), then closes them.
pub struct Fabric {
    shared: Arc<FabricState>,
    inbox: mpsc::Receiver<Event>,
    readers: Vec<JoinHandle<()>>,
    writers: Vec<JoinHandle<()>>,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for t in &self.readers {
            t.abort();
        }
        // Writers end once their queue is empty and closed.
        self.shared.links.lock().expect("links lock").clear();
        let writers = std::mem::take(&mut self.writers);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                for mut w in writers {
                    rt.spawn(async move {
                        if tokio::time::timeout(FLUSH_TIMEOUT, &mut w).await.is_err() {
                            w.abort();
                        }
                    });
                }
            }
            Err(_) => writers.iter().for_each(JoinHandle::abort),
        }
    }
}

impl Fabric {
    /// Joins a group with the default router (shortest path) and link
    /// scheduler (round robin); returns once every neighbour is linked.
    pub async fn join(listener: &PeerListener, spec: GroupSpec) -> Result<Fabric, FabricError> {
        let router = ShortestPath::new(spec.rank, spec.topology.graph(spec.size()));
        Self::join_with(listener, spec, Box::new(router), round_robin()).await
    }

    pub async fn join_with(
        listener: &PeerListener,
        spec: GroupSpec,
        router: Box<dyn Router>,
        sched: SchedulerFactory,
    ) -> Result<Fabric, FabricError> {
        let (group, rank, n) = (spec.group, spec.rank, spec.size());
        let spec_err = |reason: SpecError| FabricError::Spec { group, reason };
        spec.topology
            .check(n)
            .map_err(|e| spec_err(SpecError::Topology(e)))?;
        if rank >= n {
            return Err(spec_err(SpecError::NoSuchRank { rank, n }));
        }
        let neighbours = spec.topology.neighbours(rank, n);
        let (mut incoming, _registered) = listener.register(group)?;
        let deadline = Instant::now() + spec.connect_timeout;
        let name = spec.members[rank as usize].name.clone();
        let ours = link::offer(spec.chunk_size, listener.max_frame());
        let mut dials = JoinSet::new();
        for &nb in neighbours.iter().filter(|&&nb| nb > rank) {
            let (addr, me) = (
                spec.members[nb as usize].addr,
                hello(group, rank, nb, spec.token, &name, ours),
            );
            let max = listener.max_frame();
            dials.spawn(async move { (nb, link::dial(addr, &me, max, deadline).await) });
        }
        let mut waiting: BTreeSet<u32> = neighbours.iter().copied().collect();
        let mut links: Vec<(u32, Opened)> = Vec::new();
        let join_err = |nb: u32, reason: LinkError| FabricError::Join {
            group,
            rank: nb,
            member: spec.members[nb as usize].to_string(),
            timeout: spec.connect_timeout,
            reason,
        };
        while let Some(&first) = waiting.first() {
            tokio::select! {
                Some(r) = dials.join_next() => match r {
                    Ok((nb, Ok(opened))) => {
                        waiting.remove(&nb);
                        links.push((nb, opened));
                    }
                    Ok((nb, Err(e))) => return Err(join_err(nb, e)),
                    Err(e) => return Err(join_err(first, LinkError::Dialer(e.to_string()))),
                },
                Some(mut inc) = incoming.recv() => {
                    let (src, stats) = (inc.hello.src, listener.stats());
                    if inc.token != spec.token {
                        let why = format_args!("group {group}: refused a link claiming rank {src} ({}): wrong group token", inc.name);
                        stats.refuse(Refusal::WrongToken, inc.from, &why);
                        continue;
                    }
                    if inc.hello.dst != rank || src >= rank || !neighbours.contains(&src) {
                        let why = format_args!("group {group}: refused a link from rank {src} ({}) to rank {}", inc.name, inc.hello.dst);
                        stats.refuse(Refusal::WrongRank, inc.from, &why);
                        continue;
                    }
                    let answer = hello(group, rank, src, spec.token, &name, ours);
                    if link::send_hello(&mut inc.writer, &answer).await.is_ok() {
                        // A dialer whose attempt waited too long for our
                        // answer dials again: its newest link is the one
                        // it uses.
                        links.retain(|(nb, _)| *nb != src);
                        waiting.remove(&src);
                        links.push((src, (inc.reader, inc.writer, inc.chunk_size)));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(join_err(first, LinkError::NotLinked));
                }
            }
        }
        let (inbox_tx, inbox) = mpsc::channel(INBOX);
        let shared = Arc::new(FabricState {
            group,
            rank,
            ttl: n.min(u16::MAX as u32) as u16,
            max_frame: listener.max_frame(),
            link_budget: spec.link_budget.max(1),
            members: spec.members,
            router: Mutex::new(router),
            links: Mutex::default(),
            dedup: Mutex::default(),
            next_seq: AtomicU64::new(1),
            inbox: inbox_tx,
            delivered: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let (mut readers, mut writers) = (Vec::new(), Vec::new());
        let max_frame = listener.max_frame();
        for (nb, (rd, wr, theirs)) in links {
            let size = link::agree(ours, theirs);
            let (tx, rx) = mpsc::unbounded_channel();
            let budget = Arc::new(Semaphore::new(shared.link_budget));
            shared
                .links
                .lock()
                .expect("links lock")
                .insert(nb, LinkTx { tx, budget });
            // A message takes at most `ttl` + 1 links, rerouted or not.
            let passed = super::outq::max_passed(u32::from(shared.ttl) + 1);
            let w = link::write_loop(rx, sched.clone(), wr, size, passed);
            writers.push(tokio::spawn(w));
            readers.push(tokio::spawn(link::read_loop(
                shared.clone(),
                nb,
                rd,
                size,
                max_frame,
            )));
        }
        Ok(Fabric {
            shared,
            inbox,
            readers,
            writers,
        })
    }

    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    pub fn size(&self) -> u32 {
        self.shared.n()
    }

    pub fn group(&self) -> u32 {
        self.shared.group
    }

    pub fn member(&self, rank: u32) -> &Member {
        &self.shared.members[rank as usize]
    }

    /// Neighbours with a live link, ascending.
    pub fn links(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .shared
            .links
            .lock()
            .expect("links lock")
            .keys()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    pub fn stats(&self) -> FabricStats {
        let s = &self.shared;
        FabricStats {
            delivered: s.delivered.load(Ordering::Relaxed),
            forwarded: s.forwarded.load(Ordering::Relaxed),
            duplicates: s.duplicates.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
        }
    }

    /// Largest chunk of data one message can carry.
    pub fn max_chunk(&self) -> usize {
        self.shared.max_frame as usize
            - corefarm_smp::peer::PEER_HEADER_LEN
            - corefarm_smp::peer::COLL_HEADER_LEN
    }

    /// Sends a collective chunk to `dst` (routed); waits while the first
    /// link's budget of this node's own bytes is used up.
    pub async fn send(&self, dst: u32, coll: CollHeader, data: Bytes) -> Result<(), FabricError> {
        if data.len() > self.max_chunk() {
            return Err(FabricError::TooLarge {
                size: data.len(),
                max: self.shared.max_frame,
            });
        }
        let s = &self.shared;
        let link = s.next_hop(dst)?;
        let frame = s
            .message(
                PeerKind::Collective,
                dst,
                PeerBody::Collective { coll, data },
            )
            .to_frame()
            .expect("a chunk under the frame limit encodes");
        let want = frame.wire_len().min(s.link_budget) as u32;
        let permit = link.budget.acquire_many_owned(want).await.ok();
        link.tx
            .send(Queued::new(dst, frame, permit))
            .map_err(|_| FabricError::NoRoute {
                rank: dst,
                member: s.members[dst as usize].to_string(),
            })
    }

    /// Tells every other member that a collective failed because of `culprit`.
    pub fn abort(&self, culprit: u32, coll_seq: u32, reason: &str) {
        self.shared.flood_abort(culprit, coll_seq, reason);
    }

    /// Next event; `None` only once the fabric is shutting down.
    pub async fn recv(&mut self) -> Option<Event> {
        self.inbox.recv().await
    }

    /// An event already waiting, if any.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.inbox.try_recv().ok()
    }

    /// Sends a raw peer message on the link to a neighbour (tests of
    /// duplicate rejection and of misbehaving peers use this).
    #[doc(hidden)]
    pub fn send_raw(&self, neighbour: u32, m: &PeerMsg) -> Result<(), FabricError> {
        let link = self
            .shared
            .links
            .lock()
            .expect("links lock")
            .get(&neighbour)
            .cloned();
        let member = || self.member(neighbour).to_string();
        let link = link.ok_or_else(|| FabricError::NoRoute {
            rank: neighbour,
            member: member(),
        })?;
        let frame = m
            .to_frame()
            .map_err(|e| FabricError::Listen(e.to_string()))?;
        link.tx
            .send(Queued::new(m.header.dst, frame, None))
            .map_err(|_| FabricError::NoRoute {
                rank: neighbour,
                member: member(),
            })
    }

    /// A message as this node would send it next (with its next sequence number).
    #[doc(hidden)]
    pub fn next_message(&self, dst: u32, coll: CollHeader, data: Bytes) -> PeerMsg {
        self.shared.message(
            PeerKind::Collective,
            dst,
            PeerBody::Collective { coll, data },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use corefarm_smp::{MsgType, PeerMsg};

    use super::*;
    use crate::peer::Topology;

    /// A dialer whose attempt was answered too late for it dials again:
    /// the member still joining takes the new link in place of the
    /// abandoned one, rather than refusing it and keeping a dead link.
    /// Each step waits for the one before: rank 2 joins only once rank 1
    /// has linked, after rank 0's second attempt.
    #[tokio::test]
    async fn a_rank_that_dials_again_while_the_group_forms_replaces_its_link() {
        let l = PeerListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr();
        let members = (0..3)
            .map(|i| Member {
                name: format!("n{i}"),
                addr,
            })
            .collect();
        let spec = GroupSpec::new(12, 2, members, Topology::FullMesh).with_token(0x77);
        let deadline = Instant::now() + Duration::from_secs(60);
        let dial = |src: u32| {
            let me = hello(12, src, 2, 0x77, "n", 0);
            async move { link::dial(addr, &me, 1 << 16, deadline).await }
        };
        let (two, second) = tokio::join!(Fabric::join(&l, spec), async {
            // Rank 2's first poll registered the group.
            let first = dial(0).await.expect("first attempt answered");
            drop(first);
            let second = dial(0).await.expect("second attempt answered");
            dial(1).await.expect("rank 1 linked");
            second
        });
        let two = two.expect("rank 2 joined");
        assert_eq!(two.links(), vec![0, 1]);
        // What rank 2 sends rank 0 goes over the second link.
        two.send(0, CollHeader::bcast(3), Bytes::from_static(b"abc"))
            .await
            .unwrap();
        let (mut rd, _wr, _) = second;
        let f = tokio::time::timeout(Duration::from_secs(60), rd.read_frame())
            .await
            .expect("a frame on the second link")
            .unwrap()
            .unwrap();
        assert_eq!(f.ty, MsgType::Peer);
        match PeerMsg::parse(f.payload).unwrap().body {
            PeerBody::Collective { data, .. } => assert_eq!(&data[..], b"abc"),
            other => panic!("{other:?}"),
        }
    }
}
