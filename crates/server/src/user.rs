//! The per-user handler (seed 000 §3.3.1): one task that owns the user's
//! connection, its nodes and every piece of routing state.
//!
//! States: Initial → Nodes Configuration → Data Routing, and back to Nodes
//! Configuration on a new configuration once no data is in flight. Events come
//! from the user socket, from the nodes (results, responses, write
//! completions, disconnects), from the pool (nodes joining) and from a timer.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::codec::{write_batch, FrameReader, ReadError};
use corefarm_smp::{
    hello::features, Configuration, ConfigurationResponse, Credit, Data, ErrorCode, ErrorMsg,
    Frame, Hello, MsgType, OutFrame,
};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};
use tokio_util::sync::CancellationToken;

use crate::dispatch::{Load, Order};
use crate::nodeconn::{NodeConn, NodeEvent};
use crate::pool::{Control, Waiter};
use crate::Shared;

/// Results queued for the user's socket. Small: when the user stops reading,
/// back-pressure reaches the nodes after a few messages.
const USER_QUEUE: usize = 32;

/// A data message accepted from the user and not yet answered.
struct Pending {
    user_id: u32,
    data: Bytes,
    count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Assigned but not configured yet (before the user's first configuration).
    Idle,
    Configuring {
        deadline: Instant,
    },
    Ready,
}

struct NodeState {
    conn_id: u64,
    label: String,
    tx: NodeConn,
    slot: Slot,
    in_flight: HashMap<u32, Pending>,
    sent: u64,
    written: u64,
    last_progress: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Initial,
    Configuring,
    Routing,
}

/// Why the session ends. Logged with the user's address.
enum End {
    Closed,
    Error(String),
}

struct Handler {
    shared: Arc<Shared>,
    user: u64,
    peer: SocketAddr,
    reader: FrameReader<OwnedReadHalf>,
    out: mpsc::Sender<OutFrame>,
    /// Features agreed in the hello; `None` for a seed-format user.
    hello: Option<Hello>,
    want: Option<u32>,
    phase: Phase,
    cfg: Option<Configuration>,
    cfg_frame: Option<OutFrame>,
    /// A new configuration waiting for the data counter to reach zero.
    next_cfg: Option<(Configuration, Bytes)>,
    nodes: HashMap<u64, NodeState>,
    order: Order,
    events: StreamMap<u64, UnboundedReceiverStream<NodeEvent>>,
    redispatch: VecDeque<Pending>,
    next_internal: u32,
    /// Data messages received and not yet answered (the seed's data counter).
    outstanding: u64,
    /// Credits granted to the user and not yet used.
    credit: u64,
    /// Reasons nodes gave for refusing the current configuration.
    refusals: Vec<String>,
}

pub(crate) async fn run(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let user = shared.next_id();
    let (rd, mut wr) = stream.into_split();
    let (out, mut out_rx) = mpsc::channel::<OutFrame>(USER_QUEUE);
    let io_timeout = shared.opts.io_timeout;
    let writer_stop = stop.clone();
    let writer = tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            let write = write_batch(&mut wr, f, || out_rx.try_recv().ok());
            match tokio::time::timeout(io_timeout, write).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::info!(user = %peer, "write to user failed: {e}");
                    break;
                }
                Err(_) => {
                    tracing::warn!(user = %peer, "user stopped reading for {io_timeout:?}; closing");
                    break;
                }
            }
        }
        writer_stop.cancel();
    });
    let (ctl_tx, mut ctl_rx) = mpsc::unbounded_channel::<Control>();
    let mut h = Handler {
        reader: FrameReader::new(rd, shared.opts.max_message),
        shared,
        user,
        peer,
        out,
        hello: None,
        want: None,
        phase: Phase::Initial,
        cfg: None,
        cfg_frame: None,
        next_cfg: None,
        nodes: HashMap::new(),
        order: Order::default(),
        events: StreamMap::new(),
        redispatch: VecDeque::new(),
        next_internal: 0,
        outstanding: 0,
        credit: 0,
        refusals: Vec::new(),
    };
    let end = h.main_loop(&stop, &mut ctl_rx, ctl_tx).await;
    match &end {
        End::Closed => tracing::info!(user = %peer, "user session ended"),
        End::Error(e) => tracing::warn!(user = %peer, "user session ended: {e}"),
    }
    h.release_nodes();
    drop(h);
    // The writer flushes what is queued (e.g. a final error) then exits.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

impl Handler {
    async fn main_loop(
        &mut self,
        stop: &CancellationToken,
        ctl_rx: &mut mpsc::UnboundedReceiver<Control>,
        ctl_tx: mpsc::UnboundedSender<Control>,
    ) -> End {
        let mut ctl_tx = Some(ctl_tx);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let idle_deadline = Instant::now() + self.shared.opts.idle_timeout;
        loop {
            if let Err(e) = self.pump().await {
                return e;
            }
            let read_user = self.wants_user_input();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return End::Closed,
                Some((id, ev)) = self.events.next(), if !self.events.is_empty() => {
                    if let Err(e) = self.on_node_event(id, ev).await { return e; }
                }
                Some(c) = ctl_rx.recv() => match c {
                    Control::NodeJoined(conn) => self.adopt(conn),
                },
                _ = tick.tick() => {
                    if self.phase == Phase::Initial && self.cfg.is_none() && Instant::now() > idle_deadline {
                        return End::Error(format!("no configuration within {:?}", self.shared.opts.idle_timeout));
                    }
                    self.check_timeouts();
                }
                r = self.reader.read_frame(), if read_user => {
                    let frame = match r {
                        Ok(Some(f)) => f,
                        Ok(None) => return End::Closed,
                        Err(ReadError::Io(e)) => return End::Error(format!("read failed: {e}")),
                        Err(ReadError::Protocol(e)) => {
                            return self.fail_user(ErrorMsg::NO_ID, e.code(), e.to_string()).await;
                        }
                    };
                    if let Err(e) = self.on_user_frame(frame, &mut ctl_tx).await { return e; }
                }
            }
        }
    }

    /// Reads from the user only when the message could be acted on at once;
    /// otherwise the data waits in the user's socket (TCP back-pressure).
    fn wants_user_input(&mut self) -> bool {
        match self.phase {
            Phase::Initial => true,
            Phase::Configuring => false,
            Phase::Routing => {
                self.next_cfg.is_none()
                    && self.redispatch.is_empty()
                    && self.pick_node(false).is_some()
            }
        }
    }

    fn pick_node(&mut self, commit: bool) -> Option<u64> {
        let (policy, credit) = (self.shared.opts.policy, self.shared.opts.credit.max(1));
        let nodes = &self.nodes;
        let load = |id: u64| {
            nodes
                .get(&id)
                .filter(|n| n.slot == Slot::Ready)
                .map(|n| Load {
                    unwritten: n.sent.saturating_sub(n.written),
                    in_flight: n.in_flight.len(),
                })
        };
        if commit {
            self.order.pick(policy, credit, load)
        } else {
            self.order.peek(policy, credit, load).map(|(_, id)| id)
        }
    }

    async fn send_user(&mut self, f: OutFrame) -> Result<(), End> {
        self.out
            .send(f)
            .await
            .map_err(|_| End::Error("user connection closed".into()))
    }

    async fn send_error(
        &mut self,
        id: u32,
        code: ErrorCode,
        reason: impl Into<String>,
    ) -> Result<(), End> {
        if self.hello.as_ref().is_some_and(|h| h.has(features::ERROR)) {
            self.send_user(ErrorMsg::new(id, code, reason).to_frame())
                .await
        } else {
            Ok(())
        }
    }

    /// Reports a fatal error to the user (as the protocol allows) and ends the session.
    async fn fail_user(&mut self, id: u32, code: ErrorCode, reason: String) -> End {
        tracing::warn!(user = %self.peer, "{reason}");
        if self.hello.is_some() {
            let _ = self.send_error(id, code, reason.clone()).await;
        } else if self.phase == Phase::Initial {
            // A seed user only understands a negative configuration response.
            let _ = self
                .send_user(
                    ConfigurationResponse {
                        status: ConfigurationResponse::FAILED,
                    }
                    .to_frame(),
                )
                .await;
        }
        End::Error(reason)
    }

    async fn on_user_frame(
        &mut self,
        frame: Frame,
        ctl_tx: &mut Option<mpsc::UnboundedSender<Control>>,
    ) -> Result<(), End> {
        match frame.ty {
            MsgType::Hello
                if self.phase == Phase::Initial && self.hello.is_none() && self.cfg.is_none() =>
            {
                let h = match Hello::decode(&frame.payload) {
                    Ok(h) if h.role == "user" => h,
                    Ok(h) => {
                        return Err(self
                            .fail_user(
                                ErrorMsg::NO_ID,
                                ErrorCode::Malformed,
                                format!("hello with role {:?} on the user port", h.role),
                            )
                            .await)
                    }
                    Err(e) => {
                        return Err(self
                            .fail_user(ErrorMsg::NO_ID, ErrorCode::Malformed, e.to_string())
                            .await)
                    }
                };
                self.want = h.nodes.filter(|&n| n > 0);
                let mut agreed = Hello::new("server");
                agreed.features = [features::ERROR, features::CREDIT]
                    .iter()
                    .filter(|f| h.has(f))
                    .map(|f| f.to_string())
                    .collect();
                self.hello = Some(agreed.clone());
                self.take_nodes(ctl_tx).await;
                agreed.nodes = Some(self.nodes.len() as u32);
                agreed.max_message = Some(self.shared.opts.max_message);
                self.send_user(agreed.to_frame()).await
            }
            MsgType::Configuration if self.phase != Phase::Configuring => {
                let payload = frame.payload.clone();
                let cfg = match Configuration::parse(frame.payload) {
                    Ok(c) => c,
                    Err(e) => {
                        return Err(self
                            .fail_user(
                                ErrorMsg::NO_ID,
                                e.code(),
                                format!("invalid configuration: {e}"),
                            )
                            .await)
                    }
                };
                tracing::info!(user = %self.peer, "configuration: input {} B, output {} B, {} cores, {} bytes of bitstream",
                    cfg.input_size, cfg.output_size, cfg.cores.len(), cfg.bitstream.len());
                if self.phase == Phase::Initial {
                    if ctl_tx.is_some() {
                        self.take_nodes(ctl_tx).await;
                    }
                    self.start_configuring(cfg, payload).await
                } else {
                    // Seed §3.3.1.3: wait until no data is in flight, then reconfigure.
                    self.next_cfg = Some((cfg, payload));
                    Ok(())
                }
            }
            MsgType::Data if self.phase == Phase::Routing => {
                let d = match Data::parse(frame.payload) {
                    Ok(d) => d,
                    Err(e) => {
                        return Err(self
                            .fail_user(ErrorMsg::NO_ID, e.code(), e.to_string())
                            .await)
                    }
                };
                let cfg = self.cfg.as_ref().expect("routing implies a configuration");
                let count = match cfg.count_inputs(d.data.len()) {
                    Ok(n) => n,
                    Err(e) => {
                        return Err(self
                            .fail_user(d.id, e.code(), format!("data id {}: {e}", d.id))
                            .await)
                    }
                };
                if self.credit_mode() {
                    if self.credit == 0 {
                        return Err(self
                            .fail_user(
                                d.id,
                                ErrorCode::UnexpectedMessage,
                                "data message sent without credit".into(),
                            )
                            .await);
                    }
                    self.credit -= 1;
                }
                self.outstanding += 1;
                self.dispatch(Pending {
                    user_id: d.id,
                    data: d.data,
                    count,
                });
                Ok(())
            }
            MsgType::Data => {
                let reason = "data message before a successful configuration".to_string();
                Err(self
                    .fail_user(ErrorMsg::NO_ID, ErrorCode::NotConfigured, reason)
                    .await)
            }
            other => {
                let reason = format!("unexpected {} message from the user", other.name());
                Err(self
                    .fail_user(ErrorMsg::NO_ID, ErrorCode::UnexpectedMessage, reason)
                    .await)
            }
        }
    }

    fn credit_mode(&self) -> bool {
        self.hello.as_ref().is_some_and(|h| h.has(features::CREDIT))
    }

    /// Assigns free nodes to this user (waiting a little if none are free),
    /// and registers the user for nodes that join later.
    async fn take_nodes(&mut self, ctl_tx: &mut Option<mpsc::UnboundedSender<Control>>) {
        let Some(tx) = ctl_tx.take() else { return };
        let deadline = tokio::time::Instant::now() + self.shared.opts.node_wait;
        loop {
            let missing = self.want.map(|w| w.saturating_sub(self.nodes.len() as u32));
            if missing != Some(0) {
                let changed = self.shared.pool.changed.clone();
                let notified = changed.notified();
                for conn in self.shared.pool.take(missing) {
                    self.adopt(conn);
                }
                let enough = match self.want {
                    Some(w) => self.nodes.len() as u32 >= w,
                    None => !self.nodes.is_empty(),
                };
                if !enough && tokio::time::Instant::now() < deadline {
                    let _ = tokio::time::timeout_at(deadline, notified).await;
                    continue;
                }
            }
            break;
        }
        self.shared.pool.register(Waiter {
            user: self.user,
            tx,
            want: self.want,
            have: self.nodes.len() as u32,
            refused: Default::default(),
        });
        tracing::info!(user = %self.peer, "assigned {} node(s)", self.nodes.len());
    }

    fn adopt(&mut self, mut conn: NodeConn) {
        if conn.is_closed() {
            return;
        }
        let events = std::mem::replace(&mut conn.events, mpsc::unbounded_channel().1);
        self.events
            .insert(conn.id, UnboundedReceiverStream::new(events));
        let id = conn.id;
        let label = conn.label();
        let mut st = NodeState {
            conn_id: id,
            label,
            tx: conn,
            slot: Slot::Idle,
            in_flight: HashMap::new(),
            sent: 0,
            written: 0,
            last_progress: Instant::now(),
        };
        self.order.add(id);
        // A node joining a configured user is configured at once and joins the rotation.
        if let Some(f) = &self.cfg_frame {
            if st.tx.send(f.clone()) {
                st.sent += 1;
                st.slot = Slot::Configuring {
                    deadline: Instant::now() + self.shared.opts.config_timeout,
                };
            }
        }
        tracing::info!(user = %self.peer, node = %st.label, "node assigned");
        self.nodes.insert(id, st);
    }

    async fn start_configuring(&mut self, cfg: Configuration, payload: Bytes) -> Result<(), End> {
        self.phase = Phase::Configuring;
        self.refusals.clear();
        self.cfg = Some(cfg);
        // The payload arrived within --max-message, so it always fits a frame.
        let frame = match OutFrame::new(MsgType::Configuration, payload) {
            Ok(f) => f,
            Err(e) => {
                return Err(self
                    .fail_user(ErrorMsg::NO_ID, e.code(), e.to_string())
                    .await)
            }
        };
        self.cfg_frame = Some(frame.clone());
        let deadline = Instant::now() + self.shared.opts.config_timeout;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let n = self.nodes.get_mut(&id).expect("listed");
            if n.tx.send(frame.clone()) {
                n.sent += 1;
                n.slot = Slot::Configuring { deadline };
            } else {
                self.drop_node(id, "connection closed before configuration");
            }
        }
        self.finish_configuring_if_done().await
    }

    async fn finish_configuring_if_done(&mut self) -> Result<(), End> {
        if self.phase != Phase::Configuring
            || self
                .nodes
                .values()
                .any(|n| matches!(n.slot, Slot::Configuring { .. }))
        {
            return Ok(());
        }
        let ready = self
            .nodes
            .values()
            .filter(|n| n.slot == Slot::Ready)
            .count();
        if ready > 0 {
            tracing::info!(user = %self.peer, "configured {ready} node(s)");
            self.phase = Phase::Routing;
            for r in std::mem::take(&mut self.refusals) {
                self.send_error(
                    ErrorMsg::NO_ID,
                    ErrorCode::ConfigurationFailed,
                    format!("node dropped: {r}"),
                )
                .await?;
            }
            self.send_user(
                ConfigurationResponse {
                    status: ConfigurationResponse::OK,
                }
                .to_frame(),
            )
            .await
        } else {
            let why = if self.refusals.is_empty() {
                "no free node is connected to the server".to_string()
            } else {
                format!("no node could be configured: {}", self.refusals.join("; "))
            };
            tracing::warn!(user = %self.peer, "configuration failed: {why}");
            self.phase = Phase::Initial;
            self.cfg = None;
            self.cfg_frame = None;
            self.send_error(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, why)
                .await?;
            self.send_user(
                ConfigurationResponse {
                    status: ConfigurationResponse::FAILED,
                }
                .to_frame(),
            )
            .await
        }
    }

    fn dispatch(&mut self, p: Pending) {
        let Some(id) = self.pick_node(true) else {
            self.redispatch.push_back(p);
            return;
        };
        let internal = self.next_internal;
        self.next_internal = self.next_internal.wrapping_add(1);
        let n = self.nodes.get_mut(&id).expect("picked node exists");
        // The data arrived in a frame within --max-message, so it fits one again.
        let Ok(frame) = OutFrame::data(internal, p.data.clone()) else {
            self.redispatch.push_back(p);
            return;
        };
        if n.in_flight.is_empty() {
            n.last_progress = Instant::now();
        }
        n.in_flight.insert(internal, p);
        if n.tx.send(frame) {
            n.sent += 1;
        }
        // On a failed send the node's Closed event follows and re-dispatches.
    }

    /// Housekeeping after every event: re-dispatch, reconfigure, grant credit.
    async fn pump(&mut self) -> Result<(), End> {
        if self.phase == Phase::Routing {
            while !self.redispatch.is_empty() && self.pick_node(false).is_some() {
                let p = self.redispatch.pop_front().expect("non-empty");
                self.dispatch(p);
            }
            if self.next_cfg.is_some() && self.outstanding == 0 {
                let (cfg, payload) = self.next_cfg.take().expect("checked");
                tracing::info!(user = %self.peer, "reconfiguring");
                return self.start_configuring(cfg, payload).await;
            }
            if self.credit_mode() && self.next_cfg.is_none() {
                let ready = self
                    .nodes
                    .values()
                    .filter(|n| n.slot == Slot::Ready)
                    .count() as u64;
                let window = self
                    .shared
                    .opts
                    .user_window
                    .map_or(ready * self.shared.opts.credit.max(1) as u64, |w| w as u64)
                    .max(1);
                let used = self.outstanding + self.credit;
                if used < window {
                    let grant = (window - used) as u32;
                    self.credit += grant as u64;
                    self.send_user(Credit { messages: grant }.to_frame())
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn on_node_event(&mut self, id: u64, ev: NodeEvent) -> Result<(), End> {
        match ev {
            NodeEvent::Written(count) => {
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.written += count;
                }
                Ok(())
            }
            NodeEvent::Closed(reason) => self.lose_node(id, &reason).await,
            NodeEvent::Frame(f, _permit) => self.on_node_frame(id, f).await,
        }
    }

    async fn on_node_frame(&mut self, id: u64, f: Frame) -> Result<(), End> {
        let Some(n) = self.nodes.get_mut(&id) else {
            return Ok(());
        };
        match (f.ty, n.slot) {
            (MsgType::Data, Slot::Ready) => {
                let d = match Data::parse(f.payload) {
                    Ok(d) => d,
                    Err(e) => return self.lose_node(id, &format!("bad data message: {e}")).await,
                };
                let Some(p) = n.in_flight.remove(&d.id) else {
                    return self
                        .lose_node(id, &format!("result for unknown id {}", d.id))
                        .await;
                };
                let cfg = self.cfg.as_ref().expect("ready implies configured");
                let expect = p.count as usize * cfg.output_size as usize;
                if d.data.len() != expect {
                    let reason = format!(
                        "result of {} bytes for {} input(s), expected {expect}",
                        d.data.len(),
                        p.count
                    );
                    n.in_flight.insert(d.id, p);
                    return self.lose_node(id, &reason).await;
                }
                n.last_progress = Instant::now();
                self.outstanding -= 1;
                // A result of the configured size always fits (checked at configuration).
                match OutFrame::data(p.user_id, d.data) {
                    Ok(f) => self.send_user(f).await,
                    Err(e) => Err(self.fail_user(p.user_id, e.code(), e.to_string()).await),
                }
            }
            (MsgType::ConfigurationResponse, Slot::Configuring { .. }) => {
                let ok = ConfigurationResponse::parse(&f.payload)
                    .map(|r| r.ok())
                    .unwrap_or(false);
                if ok {
                    n.slot = Slot::Ready;
                    tracing::info!(user = %self.peer, node = %n.label, "node configured");
                } else {
                    let reason = format!("{} refused the configuration", n.label);
                    tracing::warn!(user = %self.peer, "{reason}");
                    self.refusals.push(reason);
                    let user = self.user;
                    self.shared.pool.update(user, |w| {
                        w.refused.insert(id);
                        w.have = w.have.saturating_sub(1);
                    });
                    self.release_node(id);
                }
                self.finish_configuring_if_done().await
            }
            (MsgType::Error, _) => {
                let e = match ErrorMsg::parse(&f.payload) {
                    Ok(e) => e,
                    Err(e) => return self.lose_node(id, &format!("bad error message: {e}")).await,
                };
                if let Some(p) = n.in_flight.remove(&e.id) {
                    // A core failed on this input: the user hears about it by id.
                    n.last_progress = Instant::now();
                    self.outstanding -= 1;
                    let reason = format!("node {} failed on this input: {}", n.label, e.reason);
                    if self.hello.is_some() {
                        self.send_error(p.user_id, ErrorCode::CoreFailure, reason)
                            .await
                    } else {
                        Err(self
                            .fail_user(p.user_id, ErrorCode::CoreFailure, reason)
                            .await)
                    }
                } else {
                    tracing::warn!(user = %self.peer, node = %n.label, "node reports: {e}");
                    if matches!(n.slot, Slot::Configuring { .. }) {
                        self.refusals.push(format!("{}: {}", n.label, e.reason));
                    }
                    Ok(())
                }
            }
            (ty, slot) => {
                let reason = format!(
                    "unexpected {} message from node in state {slot:?}",
                    ty.name()
                );
                self.lose_node(id, &reason).await
            }
        }
    }

    /// Takes a failed node out of rotation; everything it had in flight goes
    /// to the remaining nodes, so each result still arrives exactly once.
    async fn lose_node(&mut self, id: u64, reason: &str) -> Result<(), End> {
        let Some(n) = self.drop_node(id, reason) else {
            return Ok(());
        };
        if matches!(n.slot, Slot::Configuring { .. }) {
            self.refusals.push(format!("{}: {reason}", n.label));
        }
        let mut moved: Vec<(u32, Pending)> = n.in_flight.into_iter().collect();
        moved.sort_by_key(|(k, _)| *k);
        for (_, p) in moved.into_iter().rev() {
            self.redispatch.push_front(p);
        }
        self.finish_configuring_if_done().await?;
        let alive = self
            .nodes
            .values()
            .any(|n| matches!(n.slot, Slot::Ready | Slot::Configuring { .. }));
        if self.phase == Phase::Routing && !alive {
            let reason = format!("no node left to process data (last one lost: {reason})");
            let pending: Vec<u32> = self.redispatch.drain(..).map(|p| p.user_id).collect();
            for uid in pending {
                self.send_error(uid, ErrorCode::NoNodes, reason.clone())
                    .await?;
            }
            return Err(self
                .fail_user(ErrorMsg::NO_ID, ErrorCode::NoNodes, reason)
                .await);
        }
        Ok(())
    }

    fn drop_node(&mut self, id: u64, reason: &str) -> Option<NodeState> {
        let n = self.nodes.remove(&id)?;
        self.order.remove(id);
        self.events.remove(&id);
        tracing::warn!(user = %self.peer, node = %n.label, "node dropped: {reason}");
        n.tx.close();
        let user = self.user;
        self.shared
            .pool
            .update(user, |w| w.have = w.have.saturating_sub(1));
        Some(n)
    }

    /// Returns a healthy, idle node to the pool.
    fn release_node(&mut self, id: u64) {
        let Some(mut n) = self.nodes.remove(&id) else {
            return;
        };
        self.order.remove(id);
        let writes_done = self.shared.opts.policy == crate::Policy::Credit || n.sent == n.written;
        let idle = n.in_flight.is_empty() && writes_done && !n.tx.is_closed();
        match self.events.remove(&id) {
            Some(stream) if idle => {
                n.tx.events = stream.into_inner();
                self.shared.pool.add(n.tx);
            }
            _ => n.tx.close(),
        }
    }

    fn check_timeouts(&mut self) {
        let now = Instant::now();
        let node_timeout = self.shared.opts.node_timeout;
        let expired: Vec<(u64, String)> = self
            .nodes
            .values()
            .filter_map(|n| match n.slot {
                Slot::Configuring { deadline } if now > deadline => Some((
                    n.conn_id,
                    format!(
                        "no configuration response within {:?}",
                        self.shared.opts.config_timeout
                    ),
                )),
                Slot::Ready
                    if !n.in_flight.is_empty()
                        && now.duration_since(n.last_progress) > node_timeout =>
                {
                    Some((
                        n.conn_id,
                        format!(
                            "no result for {node_timeout:?} with {} message(s) in flight",
                            n.in_flight.len()
                        ),
                    ))
                }
                _ => None,
            })
            .collect();
        for (id, reason) in expired {
            // Synthesise a close; the next loop turn handles it like any other loss.
            if let Some(n) = self.nodes.get(&id) {
                tracing::warn!(user = %self.peer, node = %n.label, "{reason}");
                n.tx.close();
            }
        }
    }

    fn release_nodes(&mut self) {
        self.shared.pool.unregister(self.user);
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let busy = self.nodes.get(&id).is_some_and(|n| {
                !n.in_flight.is_empty() || matches!(n.slot, Slot::Configuring { .. })
            });
            if busy {
                // Work in flight for a departed user: reset the node by closing
                // it; its node manager reconnects with a clean state.
                if let Some(n) = self.nodes.remove(&id) {
                    n.tx.close();
                }
            } else {
                self.release_node(id);
            }
        }
    }
}
