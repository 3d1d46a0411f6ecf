//! Groups: a hello user with the `group` feature asks for N nodes
//! that it drives as one group. The server keeps the control plane only:
//!
//! 1. `open` (0x18): N free nodes with a peer port are claimed from the
//!    pool all at once (gang allocation, [`crate::pool::Pool::claim_exclusive`])
//!    and held for the group's lifetime; each is told to `join` with the
//!    member list (rank r = `members[r]`) and links to its neighbours; once
//!    every one answered `joined`, the user gets `opened`.
//! 2. Commands (0x19) are relayed to the ranks they target, unchanged and in
//!    the order they came (every member sees collectives in the same
//!    order); replies (0x1A) are relayed back once checked to come from the
//!    rank they name. Collective data moves between the nodes, not here.
//! 3. The group ends on `close`, when the user leaves, or when a member
//!    fails: a lost node, a node blamed by another, or a misbehaving one.
//!    Every command still waiting for that node is answered with a failure
//!    naming it, the user gets `closed` with the reason, and the members
//!    are told to `leave`. Members of a cleanly closed group go back to the
//!    pool; after a failure they are disconnected instead (they reconnect
//!    with nothing left over: no stale reply can reach their next owner).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::tls::ReadHalf;
use corefarm_smp::codec::{FrameReader, ReadError};
use corefarm_smp::group::{GroupCmd, GroupCtl, GroupMember, GroupReply, ALL_RANKS, NO_CULPRIT};
use corefarm_smp::{ErrorCode, ErrorMsg, Frame, MsgType, OutFrame, ProtocolError};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::events::EventMap;
use tokio_util::sync::CancellationToken;

use crate::accounts::Account;
use crate::nodeconn::{NodeConn, NodeEvent};
use crate::sink::{Sent, Sink};
use crate::userconn::USER_QUEUE;
use crate::ServerState;

/// How often a user waiting for enough free nodes looks again.
const CLAIM_POLL: Duration = Duration::from_millis(50);
/// How long a group waits before it is refused for asking more nodes than
/// are connected: the members of a group just torn down reconnect (a
/// node's first retry comes after 50 ms) and count again by then.
const RETURN_GRACE: Duration = Duration::from_secs(1);
/// Commands relayed and not yet answered before the user is no longer read.
const MAX_PENDING: usize = 64;
/// How long members may take to link to each other (their own bound is 10 s).
const JOIN_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a group session ended (the caller logs it); `Ok` when the user
/// left or the server stopped.
pub(crate) type End = Result<(), GroupEnd>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum GroupEnd {
    /// The user was told why, with this code (see `Session::fail`).
    #[error("{reason}")]
    Told { code: ErrorCode, reason: String },
    #[error("user connection closed")]
    Closed,
    #[error("read failed: {0}")]
    Read(std::io::Error),
    /// A frame (to the user or a member) could not be built.
    #[error("{0}")]
    Frame(#[from] ProtocolError),
}

struct Member {
    conn: NodeConn,
    label: String,
    /// It agreed `group-priority`: commands reach it with their class.
    classes: bool,
}

struct Live {
    id: u32,
    members: Vec<Member>,
    events: EventMap<u32, UnboundedReceiverStream<NodeEvent>>,
    /// Commands relayed and not yet answered by every rank they target.
    pending: HashMap<u32, (String, BTreeSet<u32>)>,
    /// Members lost while no command waited for them: the next command
    /// fails naming them and ends the group.
    lost: Vec<(u32, String)>,
    /// Collectives relayed to each rank: a member blamed for missing a call
    /// it was never sent is not at fault, the user is ([`Session::user_at_fault`]).
    collectives: Vec<u64>,
    /// When its members were taken: a group holds them whole until it
    /// closes, and its user's account is charged that node time.
    opened: Instant,
}

/// Serves a group user from its hello on, until it leaves or `stop`.
/// `account`: the user's (tenant's), when the server names users.
pub(crate) async fn serve(
    shared: &Arc<ServerState>,
    user: u64,
    account: Option<Arc<Account>>,
    reader: &mut FrameReader<ReadHalf>,
    out: &Arc<Sink>,
    stop: &CancellationToken,
) -> End {
    let mut s = Session {
        shared: shared.clone(),
        user,
        account,
        out: out.clone(),
        live: None,
    };
    let r = s.run(reader, stop).await;
    let reason = r.as_ref().err().map(ToString::to_string);
    s.teardown(
        reason.as_deref().unwrap_or("the user left"),
        reason.is_some(),
    )
    .await;
    r
}

struct Session {
    shared: Arc<ServerState>,
    user: u64,
    account: Option<Arc<Account>>,
    out: Arc<Sink>,
    live: Option<Live>,
}

impl Session {
    fn pending(&self) -> usize {
        self.live.as_ref().map_or(0, |l| l.pending.len())
    }

    async fn send(&self, f: OutFrame) -> End {
        // Back-pressure as for any user: wait while the user is not reading.
        self.out.room(USER_QUEUE).await;
        match self.out.send(f, false) {
            Sent::Closed => Err(GroupEnd::Closed),
            Sent::Written | Sent::Queued => Ok(()),
        }
    }

    async fn fail(&self, code: ErrorCode, reason: String) -> End {
        let _ = self
            .send(ErrorMsg::new(ErrorMsg::NO_ID, code, reason.clone()).to_frame())
            .await;
        Err(GroupEnd::Told { code, reason })
    }

    async fn run(&mut self, reader: &mut FrameReader<ReadHalf>, stop: &CancellationToken) -> End {
        // With MAX_PENDING commands out, one more frame is read and held if
        // it is a command: a `close` or the end of the connection behind a
        // full window is still seen (the group ends, its nodes go back).
        let mut held: Option<Frame> = None;
        // Before its group opens, a group user holds a place and nothing
        // else: like any unconfigured user, it must say something at least
        // every `--user-idle-timeout`.
        let idle = self.shared.opts.user_idle_timeout;
        let mut last = Instant::now();
        loop {
            if held.is_some() && self.pending() < MAX_PENDING {
                let f = held.take().expect("checked");
                self.on_user(f).await?;
                continue;
            }
            let readable = held.is_none();
            // A message begun is left to the read deadlines.
            let unopened = self.live.is_none() && reader.begun_type().is_none();
            let node_ev = async {
                match self.live.as_mut() {
                    Some(l) if !l.events.is_empty() => l.events.next().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                Some((rank, ev)) = node_ev => self.on_node(rank, ev).await?,
                _ = tokio::time::sleep_until(last + idle), if unopened => {
                    self.shared.metrics.error(crate::metrics::ErrorKind::Idle);
                    let reason = format!(
                        "no group opened for {idle:?} after the hello (--user-idle-timeout): \
                         a group user holds a place until it opens its group"
                    );
                    return self.fail(ErrorCode::Timeout, reason).await;
                }
                // Commands wait in the nodes' memory: a user that sends more
                // than this many ahead of the replies waits in TCP instead.
                r = reader.read_frame(), if readable => {
                    last = Instant::now();
                    match r {
                        Ok(Some(f)) if f.ty == MsgType::GroupCmd && self.pending() >= MAX_PENDING => {
                            held = Some(f);
                        }
                        Ok(Some(f)) => self.on_user(f).await?,
                        Ok(None) => return Ok(()),
                        Err(ReadError::Io(e)) => return Err(GroupEnd::Read(e)),
                        Err(ReadError::Protocol(e)) => return self.fail(e.code(), e.to_string()).await,
                    }
                }
            }
        }
    }

    async fn on_user(&mut self, f: Frame) -> End {
        match f.ty {
            MsgType::GroupCtl => match GroupCtl::decode(&f.payload) {
                Ok(GroupCtl::Open { nodes, topology }) if self.live.is_none() => {
                    self.open(nodes, topology.unwrap_or_else(|| "mesh".into()))
                        .await
                }
                Ok(GroupCtl::Close) if self.live.is_some() => {
                    self.teardown("closed by the user", false).await;
                    Ok(())
                }
                Ok(c) => {
                    let reason = format!("unexpected group control {c:?}");
                    self.fail(ErrorCode::UnexpectedMessage, reason).await
                }
                Err(e) => self.fail(e.code(), e.to_string()).await,
            },
            MsgType::GroupCmd => {
                let Some(live) = self.live.as_mut() else {
                    let reason = "group command before a group was opened".to_string();
                    return self.fail(ErrorCode::UnexpectedMessage, reason).await;
                };
                let c = match GroupCmd::parse(f.payload.clone()) {
                    Ok(c) => c,
                    Err(e) => return self.fail(e.code(), e.to_string()).await,
                };
                if !live.lost.is_empty() {
                    let reason = live
                        .lost
                        .iter()
                        .map(|(_, r)| r.as_str())
                        .collect::<Vec<_>>()
                        .join("; ");
                    let culprit = live.lost[0].0;
                    let r =
                        GroupReply::failed(c.seq, culprit, ErrorCode::NoNodes, culprit, &reason);
                    self.send(r.to_frame()?).await?;
                    self.teardown(&reason, true).await;
                    return Ok(());
                }
                let n = live.members.len() as u32;
                let targets: BTreeSet<u32> = if c.target == ALL_RANKS {
                    (0..n).collect()
                } else if c.target < n {
                    [c.target].into()
                } else {
                    let reason = format!("{}: rank {} in a group of {n}", c.label(), c.target);
                    let r = GroupReply::failed(
                        c.seq,
                        c.target,
                        ErrorCode::Malformed,
                        NO_CULPRIT,
                        &reason,
                    );
                    return self.send(r.to_frame()?).await;
                };
                if live.pending.contains_key(&c.seq) {
                    let reason = format!("{}: that sequence number is still in use", c.label());
                    return self.fail(ErrorCode::Malformed, reason).await;
                }
                // A node that predates classes would refuse the command
                // byte with one: it gets the command in the default class
                // (one copy, only when the class is not the default).
                let plain = targets
                    .iter()
                    .any(|&r| !live.members[r as usize].classes)
                    .then(|| GroupCmd::without_class(&f.payload))
                    .flatten();
                for &r in &targets {
                    let m = &live.members[r as usize];
                    let payload = match &plain {
                        Some(p) if !m.classes => p.clone(),
                        _ => f.payload.clone(),
                    };
                    let frame = OutFrame::new(MsgType::GroupCmd, payload)?;
                    // A closed connection shows up as a node event next.
                    m.conn.send(frame);
                }
                if c.cmd.is_collective() {
                    for &r in &targets {
                        live.collectives[r as usize] += 1;
                    }
                }
                live.pending.insert(c.seq, (c.label(), targets));
                Ok(())
            }
            other => {
                let reason = format!("unexpected {} message from a group user", other.name());
                self.fail(ErrorCode::UnexpectedMessage, reason).await
            }
        }
    }

    /// Claims the nodes (waiting up to `--node-wait` for enough free ones),
    /// has them join, and answers `opened`.
    /// The user's `max_nodes` less the nodes its other sessions hold, if
    /// that is fewer than `n`: a group takes all its members or none.
    fn over_limit(&self, n: u32) -> Option<String> {
        let a = self.account.as_ref()?;
        let max = a.tenant.limits.max_nodes?;
        let held = self.shared.registry.nodes_held_by(a, self.user) as u32;
        let left = max.saturating_sub(held);
        (n > left).then(|| {
            format!(
                "a group of {n} nodes: user {:?} is at its node limit (max_nodes = {max}, \
                 {held} held by its other sessions); ask for at most {left}, end one of \
                 them, or ask the operator for a larger limit",
                a.name()
            )
        })
    }

    async fn open(&mut self, n: u32, topology: String) -> End {
        if let Some(reason) = self.over_limit(n) {
            return self.fail(ErrorCode::NoNodes, reason).await;
        }
        let wait = self.shared.opts.node_wait;
        let began = Instant::now();
        let (deadline, grace) = (began + wait, wait.min(RETURN_GRACE));
        let fit = |c: &NodeConn| c.entry.info().peer.is_some();
        let conns = loop {
            // Shared mode: the scheduler holds the nodes and lends them.
            let why = match self.shared.sched.get() {
                Some(h) => {
                    match tokio::time::timeout_at(deadline, h.lend(self.user, n as usize)).await {
                        Ok(Ok(c)) => break c,
                        Ok(Err(why)) => why.to_string(),
                        Err(_) => "the promised nodes were still busy".into(),
                    }
                }
                None => match self.shared.pool.claim_exclusive(self.user, n as usize, fit) {
                    Some(c) => break c,
                    None => format!("{} free in all", self.shared.pool.free_count()),
                },
            };
            // Waiting helps only while enough nodes that can join are busy
            // (or, shared, lent to another group); with fewer connected at
            // all, say so now rather than after `--node-wait`. After a
            // grace, not at once: the members of a group just torn down are
            // reconnecting.
            if Instant::now() >= began + grace {
                let reg = &self.shared.registry;
                let able = reg.count_nodes(|e| e.info().peer.is_some());
                if able < n as usize {
                    let reason = format!(
                        "a group of {n} nodes: only {able} of the {} nodes connected can join \
                         a group (those with a peer port); ask for at most {able}",
                        reg.node_count()
                    );
                    return self.fail(ErrorCode::NoNodes, reason).await;
                }
            }
            if Instant::now() >= deadline {
                let reason = format!(
                    "a group of {n} nodes: fewer free nodes with a peer port within {wait:?} \
                     ({why})"
                );
                return self.fail(ErrorCode::NoNodes, reason).await;
            }
            tokio::time::sleep(CLAIM_POLL).await;
        };
        let id = (self.shared.next_id() & u32::MAX as u64) as u32;
        // From the OS's generator: only the members and this user learn it,
        // and every peer link and direct connection must show it.
        let token = rand::random::<u64>();
        let mut members = Vec::new();
        let mut list = Vec::new();
        let mut events = EventMap::new();
        for (r, mut conn) in conns.into_iter().enumerate() {
            let info = conn.entry.info();
            let ev = std::mem::replace(&mut conn.events, mpsc::unbounded_channel().1);
            events.insert(r as u32, UnboundedReceiverStream::new(ev));
            list.push(GroupMember {
                rank: r as u32,
                name: info.name.unwrap_or_else(|| format!("node-{}", conn.id)),
                peer: info.peer.unwrap_or_default(),
            });
            members.push(Member {
                label: conn.label(),
                classes: info.group_priority,
                conn,
            });
        }
        for (r, m) in members.iter().enumerate() {
            let join = GroupCtl::Join {
                group: id,
                rank: r as u32,
                members: list.clone(),
                topology: topology.clone(),
                token,
            };
            m.conn.send(join.to_frame());
        }
        self.live = Some(Live {
            id,
            members,
            events,
            pending: HashMap::new(),
            lost: Vec::new(),
            collectives: vec![0; n as usize],
            opened: Instant::now(),
        });
        tracing::info!(
            user = self.user,
            group = id,
            "group of {n}: members joining ({topology})"
        );
        let live = self.live.as_mut().expect("just set");
        let mut waiting: BTreeSet<u32> = (0..n).collect();
        let deadline = Instant::now() + JOIN_TIMEOUT;
        while let Some(&first) = waiting.first() {
            let ev = tokio::select! {
                ev = live.events.next() => ev,
                _ = tokio::time::sleep_until(deadline) => None,
            };
            let problem = match ev {
                Some((r, NodeEvent::Frame(f, _))) if f.ty == MsgType::GroupCtl => {
                    match GroupCtl::decode(&f.payload) {
                        Ok(GroupCtl::Joined { group, error: None }) if group == id => {
                            waiting.remove(&r);
                            continue;
                        }
                        Ok(GroupCtl::Joined { error: Some(e), .. }) => {
                            (r, format!("cannot join: {e}"))
                        }
                        other => (r, format!("answered the join with {other:?}")),
                    }
                }
                Some((r, NodeEvent::Closed(reason))) => (r, format!("lost: {reason}")),
                Some((r, NodeEvent::Frame(f, _))) => {
                    (r, format!("sent a {} message while joining", f.ty.name()))
                }
                Some((_, NodeEvent::Written(_))) => continue,
                None => (first, format!("did not join within {JOIN_TIMEOUT:?}")),
            };
            let (r, why) = problem;
            let reason = format!(
                "group of {n}: rank {r} ({}) {why}",
                live.members[r as usize].label
            );
            self.teardown(&reason, true).await;
            return self.fail(ErrorCode::NoNodes, reason).await;
        }
        tracing::info!(user = self.user, group = id, "group of {n} open");
        self.send(
            GroupCtl::Opened {
                group: id,
                members: list,
                token,
            }
            .to_frame(),
        )
        .await
    }

    async fn on_node(&mut self, rank: u32, ev: NodeEvent) -> End {
        let live = self.live.as_mut().expect("events only while live");
        let f = match ev {
            NodeEvent::Written(_) => return Ok(()),
            NodeEvent::Closed(reason) => {
                return self.member_failed(rank, &format!("lost: {reason}")).await
            }
            NodeEvent::Frame(f, _permit) => f,
        };
        match f.ty {
            MsgType::GroupReply => {
                let r = match GroupReply::parse(f.payload.clone()) {
                    Ok(r) if r.rank == rank => r,
                    Ok(r) => {
                        let why = format!("sent a reply in the name of rank {}", r.rank);
                        return self.member_failed(rank, &why).await;
                    }
                    Err(e) => {
                        return self
                            .member_failed(rank, &format!("sent a bad reply: {e}"))
                            .await
                    }
                };
                let known = match live.pending.get_mut(&r.seq) {
                    Some((op, left)) => {
                        let op = op.clone();
                        let was = left.remove(&rank);
                        if left.is_empty() {
                            live.pending.remove(&r.seq);
                        }
                        was.then_some(op)
                    }
                    None => None,
                };
                let Some(op) = known else {
                    let why = format!("answered command #{} it was not given", r.seq);
                    return self.member_failed(rank, &why).await;
                };
                if let Some(reason) = self.user_at_fault(rank, &op, &r) {
                    // The reply would name an innocent member: the user is
                    // told what it did instead, and the group (whose
                    // members no longer agree on the collectives run) ends.
                    let reply =
                        GroupReply::failed(r.seq, rank, ErrorCode::Malformed, NO_CULPRIT, &reason);
                    self.send(reply.to_frame()?).await?;
                    tracing::warn!(user = self.user, "group ended by its user: {reason}");
                    self.teardown(&reason, true).await;
                    return Ok(());
                }
                let frame = OutFrame::new(MsgType::GroupReply, f.payload)?;
                self.send(frame).await?;
                if r.status != 0 && r.culprit != NO_CULPRIT {
                    // A collective failed: the group cannot run another.
                    // Commands still waiting on the culprit fail naming it
                    // before the group closes, whichever news came first.
                    let live = self.live.as_ref().expect("live");
                    if (r.culprit as usize) < live.members.len() {
                        let why = format!("failed: {}", r.reason());
                        return self.end_naming(r.culprit, &why).await;
                    }
                    let reason = format!("an unknown rank {} failed: {}", r.culprit, r.reason());
                    self.teardown(&reason, true).await;
                }
                Ok(())
            }
            MsgType::Error => {
                let why =
                    ErrorMsg::parse(&f.payload).map_or_else(|e| e.to_string(), |e| e.to_string());
                self.member_failed(rank, &format!("reported an error: {why}"))
                    .await
            }
            other => {
                self.member_failed(rank, &format!("sent a {} message", other.name()))
                    .await
            }
        }
    }

    /// A collective that failed on `rank` naming a member that was sent
    /// fewer collectives than `rank`: that member could not have joined the
    /// call, because the user never sent it (a collective must reach every
    /// rank). The reason to tell the user, or `None` if the blame stands.
    fn user_at_fault(&self, rank: u32, op: &str, r: &GroupReply) -> Option<String> {
        let live = self.live.as_ref()?;
        let (given, to) = (&live.collectives, r.culprit as usize);
        if r.status == 0 || r.culprit == NO_CULPRIT || to >= given.len() {
            return None;
        }
        let (sent, missed) = (given[rank as usize], given[to]);
        (missed < sent).then(|| {
            format!(
                "{op} was sent to rank {rank} but not to rank {}: a collective must be sent \
                 to every rank of the group (rank {rank} was sent {sent} collective(s), \
                 rank {} {missed}); the group ends",
                r.culprit, r.culprit
            )
        })
    }

    /// A member is lost or misbehaved: every command waiting on it fails
    /// naming it, and the group ends.
    async fn member_failed(&mut self, rank: u32, why: &str) -> End {
        let live = self.live.as_mut().expect("live");
        let label = live.members[rank as usize].label.clone();
        if !live.pending.values().any(|(_, left)| left.contains(&rank)) {
            // Nothing waits for it: the others keep their buffers and direct
            // connections until the user's next command, which fails.
            let reason = format!("rank {rank} ({label}) {why}");
            tracing::warn!(user = self.user, "group member lost: {reason}");
            live.events.remove(&rank);
            live.members[rank as usize].conn.close();
            live.lost.push((rank, reason.clone()));
            let id = live.id;
            return self
                .send(
                    GroupCtl::Lost {
                        group: id,
                        rank,
                        reason,
                    }
                    .to_frame(),
                )
                .await;
        }
        self.end_naming(rank, why).await
    }

    /// Every command waiting on `rank` fails naming it, then the group ends.
    async fn end_naming(&mut self, rank: u32, why: &str) -> End {
        let live = self.live.as_mut().expect("live");
        let label = live.members[rank as usize].label.clone();
        let mut waiting: Vec<(u32, String)> = live
            .pending
            .iter()
            .filter(|(_, (_, left))| left.contains(&rank))
            .map(|(s, (l, _))| (*s, l.clone()))
            .collect();
        waiting.sort();
        // The client prefixes the operation; the reason names the member.
        for (seq, _) in &waiting {
            let reason = format!("rank {rank} ({label}) {why}");
            let r = GroupReply::failed(*seq, rank, ErrorCode::Timeout, rank, &reason);
            self.send(r.to_frame()?).await?;
        }
        let ops: Vec<&str> = waiting.iter().map(|(_, l)| l.as_str()).collect();
        let during = if ops.is_empty() {
            String::new()
        } else {
            format!(" during {}", ops.join(", "))
        };
        let reason = format!("rank {rank} ({label}){during} {why}");
        tracing::warn!(user = self.user, "group member failed: {reason}");
        self.teardown(&reason, true).await;
        Ok(())
    }

    /// Ends the live group, if any: members leave; after a failure (or with
    /// commands outstanding) they are disconnected rather than pooled.
    async fn teardown(&mut self, reason: &str, failed: bool) {
        let Some(mut live) = self.live.take() else {
            return;
        };
        let dirty = failed || !live.pending.is_empty();
        if let Some(a) = &self.account {
            a.node_time(live.opened.elapsed() * live.members.len() as u32);
        }
        let mut back = Vec::new();
        for (r, mut m) in live.members.into_iter().enumerate() {
            m.conn.send(GroupCtl::Leave { group: live.id }.to_frame());
            if dirty {
                m.conn.close();
            } else if let Some(ev) = live.events.remove(&(r as u32)) {
                m.conn.events = ev.into_inner();
                back.push(m.conn);
            }
        }
        self.shared.pool.release(back);
        tracing::info!(user = self.user, group = live.id, "group closed: {reason}");
        let closed = GroupCtl::Closed {
            group: live.id,
            reason: failed.then(|| reason.to_string()),
        };
        let _ = self.send(closed.to_frame()).await;
    }
}
