//! One connection to the server: the receiving task (this module) and the
//! sending task it spawns ([`crate::sender`]). The session ends when the
//! server closes, sends something the node cannot accept, `stop` is
//! cancelled — or the sending task ends, since a node that cannot answer
//! must not keep taking work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::auth::{AuthChallenge, AuthResponse};
use corefarm_smp::codec::{FrameReader, Read, ReadError, ReadVectored};
use corefarm_smp::group::{GroupCmd, GroupCtl, GroupReply};
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{
    hello::features, ConfigurationResponse, Data, ErrorCode, ErrorMsg, Hello, MsgType, DATA_ID_LEN,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use crate::configure::{self, Configured, Kept, Outcome};
use crate::group::{GroupHandle, MemberEnv};
use crate::guard::MemoryGuard;
use crate::handlers::{Job, Outgoing};
use crate::inbound::Inbound;
use crate::metrics::NodeStats;
use crate::notes::NoteLink;
use crate::peer::PeerListener;
use crate::sender::{self, Chunking, SendError};
use crate::{NodeError, NodeOptions};

mod chunked;

/// How long results queued when the session ends may take to reach the server.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs a session over a connected socket.
pub async fn run(
    stream: TcpStream,
    opts: &NodeOptions,
    stop: CancellationToken,
) -> Result<(), NodeError> {
    run_with(stream, opts, stop, None).await
}

/// [`run`] with the node's peer port, through which the session's groups link.
pub async fn run_with(
    stream: TcpStream,
    opts: &NodeOptions,
    stop: CancellationToken,
    peer: Option<Arc<PeerListener>>,
) -> Result<(), NodeError> {
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    run_io_with(rd, wr, opts, stop, peer).await
}

/// Runs a session over any byte streams (the server's messages come from
/// `rd`, the node's go to `wr`); [`run`] is this over a TCP socket.
pub async fn run_io<R, W>(
    rd: R,
    wr: W,
    opts: &NodeOptions,
    stop: CancellationToken,
) -> Result<(), NodeError>
where
    R: AsyncRead + ReadVectored + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    run_io_with(rd, wr, opts, stop, None).await
}

/// [`run_io`] with a peer port for groups. The hello advertises the peer
/// port of `opts.peer_listen` (as `run` binds it), or else `peer`'s address.
pub async fn run_io_with<R, W>(
    rd: R,
    wr: W,
    opts: &NodeOptions,
    stop: CancellationToken,
    peer: Option<Arc<PeerListener>>,
) -> Result<(), NodeError>
where
    R: AsyncRead + ReadVectored + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve(rd, wr, opts, stop, peer, &mut None, &mut false).await
}

/// [`run_io_with`] with the function the node holds from an earlier
/// session (`kept`), which a configuration identical to it reuses; the
/// function loaded when the session ends is left there for the next.
///
/// When the server goes away (the connection ends or breaks, or the
/// sending task fails) the session's work is dropped, deterministically:
/// the results not yet written are discarded, the queued inputs are
/// dropped, an input a core is running finishes and its result is
/// discarded, and the cores are kept. Nothing is finished to be delivered
/// later: the user's session resends every unanswered input itself, and a
/// result written on a new connection would carry an id that the new
/// server (or the new session of the same server) matches to nothing.
/// Only when `stop` ends the session are the queued inputs finished and
/// their results flushed (the server is still there to take them).
///
/// `answered` is set when the server answered the node's hello: the
/// session reached a live server, whatever ended it.
pub async fn serve<R, W>(
    rd: R,
    wr: W,
    opts: &NodeOptions,
    stop: CancellationToken,
    peer: Option<Arc<PeerListener>>,
    kept: &mut Option<Kept>,
    answered: &mut bool,
) -> Result<(), NodeError>
where
    R: AsyncRead + ReadVectored + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = FrameReader::new(rd, opts.max_message);
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Outgoing>();
    let negotiated = Arc::new(AtomicBool::new(false));
    let chunking = Arc::new(Chunking::default());
    // `ended` is cancelled when `stop` is, or when the sending task ends in
    // any way (returns, panics, is aborted): its drop guard lives in the task.
    let ended = stop.child_token();
    let stats = opts.telemetry.as_ref().map(|t| t.node(&opts.name));
    let notes = Arc::new(NoteLink::with_stats(stats.clone()));
    let _connected = stats.clone().map(Connected::new);
    let mut sender = tokio::spawn({
        let (guard, negotiated) = (ended.clone().drop_guard(), negotiated.clone());
        let (stats, chunking, notes) = (stats.clone(), chunking.clone(), notes.clone());
        async move {
            let _guard = guard;
            sender::send_loop_chunked(wr, out_rx, negotiated, chunking, notes, stats).await
        }
    });
    let mut s = Session {
        opts,
        out: out_tx,
        negotiated,
        limit: opts.max_message,
        any_length: false,
        guard: MemoryGuard::new(opts.memory_limit),
        state: None,
        kept: kept.take(),
        sent_hello: None,
        greeted: false,
        peer: peer.clone(),
        group: None,
        stats,
        chunking,
        notes,
        inbound: None,
    };
    if opts.hello {
        let mut h = Hello::new("node");
        h.name = Some(opts.name.clone());
        h.features = vec![features::ERROR.into(), features::SPIN_NOTIFY.into()];
        h.targets = corefarm_cores::supported_targets(&opts.load);
        h.max_message = Some(opts.max_message);
        // Advertised once `run` has bound it (a concrete address).
        let bound = peer.as_ref().map(|l| l.local_addr());
        if let Some(a) = opts
            .peer_listen
            .filter(|a| a.port() != 0 && !a.ip().is_unspecified())
            .or(bound)
        {
            h.features.push(features::PEER.into());
            // Group commands may carry a class: the collective's data then
            // rides in it on the peer links.
            h.features.push(features::GROUP_PRIORITY.into());
            h.peer = Some(a.to_string());
        }
        if opts.secret.is_some() {
            h.features.push(features::AUTH.into());
        }
        if opts.chunk_size > 0 {
            h.features.push(features::CHUNKS.into());
            h.chunk_size = Some(opts.chunk_size);
        }
        h.features.push(features::ANY_LENGTH.into());
        s.sent_hello = Some(h.encode());
        s.queue(Outgoing::Frame(h.to_frame()));
    }

    let mut sender_end = None;
    let result = loop {
        // The sending task is watched while reading, waiting for memory,
        // loading cores or draining the old configuration's queue: if it
        // ends, nothing the node does from here on can reach the server.
        let step = tokio::select! {
            _ = ended.cancelled() => {
                if stop.is_cancelled() {
                    break Ok(());
                }
                let end = (&mut sender).await;
                let e = sender_error(&end);
                sender_end = Some(end);
                break Err(e);
            }
            step = s.step(&mut reader) => step,
        };
        if let Some(end) = step {
            break end;
        }
    };

    // Leaving the group frees its buffers and closes its links.
    s.group = None;
    let Session {
        out,
        state,
        kept: held,
        greeted,
        ..
    } = s;
    *answered = greeted;
    drop(out);
    let stopping = stop.is_cancelled() && result.is_ok();
    let server_gone =
        !stopping && (sender_end.is_some() || matches!(result, Ok(()) | Err(NodeError::Io(_))));
    if server_gone {
        // The queued inputs go first (no core starts one of them from
        // here on), then nothing more is written: the results queued for
        // the old connection, and what the running inputs produce, are
        // dropped with the sending task's queue.
        if let Some(st) = &state {
            let n = st.workers.drop_queued();
            tracing::debug!(node = %opts.name, "server gone: {n} queued input message(s) dropped");
        }
        if sender_end.is_none() {
            sender.abort();
            sender_end = Some((&mut sender).await);
        }
    }
    // Stopping, the handlers finish the queued work; otherwise the queue
    // is dropped and only the running inputs finish. Either way the cores
    // are kept for a configuration identical to theirs.
    *kept = match state {
        Some(st) => tokio::task::spawn_blocking(move || st.wind_down(stopping))
            .await
            .ok()
            .flatten(),
        None => held,
    };
    if server_gone {
        tracing::debug!(
            node = %opts.name,
            "server gone: unsent results dropped, cores kept: {}",
            kept.is_some()
        );
        return result;
    }
    // Give the sending task a moment to flush what is queued: results and
    // a final error.
    let end = match sender_end {
        Some(end) => end,
        None => match tokio::time::timeout(FLUSH_TIMEOUT, &mut sender).await {
            Ok(end) => end,
            Err(_) => {
                sender.abort();
                tracing::warn!(node = %opts.name, "results not flushed within {FLUSH_TIMEOUT:?}; dropped");
                return result;
            }
        },
    };
    match &end {
        Ok(Ok(sent)) => {
            tracing::info!(node = %opts.name, "{sent} result message(s) sent in this session")
        }
        _ if result.is_ok() => return Err(sender_error(&end)),
        _ => {}
    }
    result
}

fn sender_error(end: &Result<Result<u64, SendError>, JoinError>) -> NodeError {
    match end {
        Ok(Err(SendError::Io(e))) => NodeError::Io(std::io::Error::new(e.kind(), e.to_string())),
        Ok(Err(e @ SendError::Closed { .. })) => NodeError::Session(e.to_string()),
        Ok(Ok(_)) => NodeError::Session("the sending task ended early".into()),
        Err(e) => NodeError::Session(format!("the sending task failed: {e}")),
    }
}

/// The receiving task's state.
struct Session<'a> {
    opts: &'a NodeOptions,
    out: mpsc::UnboundedSender<Outgoing>,
    /// The server accepts error messages (it said so in its hello).
    negotiated: Arc<AtomicBool>,
    /// Largest payload on this link: ours, or the server's if smaller.
    limit: u32,
    /// The server takes handler results of any length (`any-length`).
    any_length: bool,
    guard: MemoryGuard,
    state: Option<Configured>,
    /// The function an earlier session left loaded, until a configuration
    /// reuses or replaces it.
    kept: Option<Kept>,
    /// The hello exactly as sent: an authentication answer covers it.
    sent_hello: Option<Vec<u8>>,
    /// The server's hello has arrived: an error before it is a refusal.
    greeted: bool,
    /// The node's peer port (groups need one).
    peer: Option<Arc<PeerListener>>,
    /// The group this node is a member of, if any.
    group: Option<GroupHandle>,
    stats: Option<Arc<NodeStats>>,
    /// Chunk size and result classes, shared with the sending task.
    chunking: Arc<Chunking>,
    /// Whether handler notifications go to the server, shared with the sending task.
    notes: Arc<NoteLink>,
    /// Chunked messages being received; `Some` once the server agreed to
    /// chunks in its hello (a chunk before that is an unexpected message).
    inbound: Option<Inbound>,
}

/// Marks the node manager connected for as long as the session runs.
struct Connected(Arc<NodeStats>);

impl Connected {
    fn new(s: Arc<NodeStats>) -> Self {
        s.connected(true);
        Connected(s)
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected(false);
    }
}

/// `None`: carry on; `Some(r)`: the session ends with `r`.
type Step = Option<Result<(), NodeError>>;

impl Session<'_> {
    /// Reads and handles one message.
    async fn step<R: AsyncRead + ReadVectored + Unpin>(
        &mut self,
        reader: &mut FrameReader<R>,
    ) -> Step {
        // Chunks of messages for the cores are read into their buffers.
        let read = match self.inbound.as_mut() {
            Some(inb) => reader.read_placing(inb).await,
            None => reader.read_frame().await.map(|f| f.map(Read::Frame)),
        };
        let frame = match read {
            Ok(Some(Read::Frame(f))) => f,
            Ok(Some(Read::Placed { whole: None, .. })) => return None,
            Ok(Some(Read::Placed {
                whole: Some(step), ..
            })) => return self.chunk_step(step).await,
            Ok(None) => return Some(Ok(())),
            Err(ReadError::Io(e)) => return Some(Err(NodeError::Io(e))),
            Err(ReadError::Protocol(e)) => {
                self.error(ErrorMsg::NO_ID, e.code(), e.to_string());
                return Some(Err(NodeError::Protocol(e)));
            }
        };
        match frame.ty {
            MsgType::Hello => match Hello::decode(&frame.payload) {
                Ok(h) => {
                    tracing::debug!(node = %self.opts.name, "server hello: {h:?}");
                    self.greeted = true;
                    self.negotiated
                        .store(h.has(features::ERROR), Ordering::Relaxed);
                    self.notes.set_agreed(h.has(features::SPIN_NOTIFY));
                    if let Some(m) = h.max_message {
                        self.limit = self.opts.max_message.min(m);
                    }
                    self.any_length = h.has(features::ANY_LENGTH);
                    let ours = self.opts.chunk_size;
                    if ours > 0 && h.has(features::CHUNKS) {
                        let size = h.chunk_size.unwrap_or(ours).clamp(1, ours);
                        self.chunking.set_size(size);
                        self.inbound.get_or_insert_with(|| Inbound::new(size));
                    }
                    None
                }
                Err(e) => self.malformed(e),
            },
            MsgType::AuthChallenge => self.authenticate(&frame.payload),
            MsgType::Configuration => {
                self.configure(frame.payload).await;
                None
            }
            MsgType::Data => self.data(frame.payload).await,
            MsgType::Chunk if self.inbound.is_some() => self.chunk(frame.payload).await,
            MsgType::GroupCtl => match GroupCtl::decode(&frame.payload) {
                Ok(c) => {
                    self.group_ctl(c);
                    None
                }
                Err(e) => self.malformed(e),
            },
            MsgType::GroupCmd => match GroupCmd::parse(frame.payload) {
                Ok(c) => {
                    self.group_cmd(c);
                    None
                }
                Err(e) => self.malformed(e),
            },
            MsgType::Error => match ErrorMsg::parse(&frame.payload) {
                // Sent in place of the hello's answer (at the user port,
                // say): the session ends with the server's reason.
                Ok(e) if !self.greeted && self.sent_hello.is_some() => {
                    Some(Err(NodeError::Refused {
                        code: e.code().unwrap_or(ErrorCode::Internal),
                        reason: e.reason,
                    }))
                }
                Ok(e) => {
                    tracing::warn!(node = %self.opts.name, "server reports: {e}");
                    None
                }
                Err(e) => self.malformed(e),
            },
            other => {
                let reason = format!("unexpected {} message from the server", other.name());
                self.error(
                    ErrorMsg::NO_ID,
                    ErrorCode::UnexpectedMessage,
                    reason.clone(),
                );
                Some(Err(NodeError::Session(reason)))
            }
        }
    }

    /// Answers the server's challenge with the node secret (the server sends
    /// its hello only once the answer checks out).
    fn authenticate(&mut self, payload: &[u8]) -> Step {
        let (Some(secret), Some(hello)) = (&self.opts.secret, &self.sent_hello) else {
            return Some(Err(NodeError::NoSecret));
        };
        match AuthChallenge::parse(payload) {
            Ok(ch) => {
                let answer = AuthResponse::answer(secret, &ch, "node", hello);
                self.queue(Outgoing::Frame(answer.to_frame()));
                None
            }
            Err(e) => self.malformed(e),
        }
    }

    /// A configuration stops the current core handlers once they have
    /// finished the queued work (its results go out before the response),
    /// then loads the new one. A refused configuration leaves the node
    /// unconfigured; the session goes on.
    async fn configure(&mut self, payload: Bytes) {
        // A server sends a configuration only once its messages are back,
        // but one that does not must not leave chunks of a message begun
        // under the old configuration to be finished under the new one (or
        // none): those messages fail here, and a lane stream they feed
        // ends, so the lane can stop.
        let abandoned = self.inbound.as_mut().map(Inbound::abandon);
        for id in abandoned.into_iter().flatten() {
            self.queue(Outgoing::Failed {
                id,
                code: ErrorCode::UnexpectedMessage,
                reason: format!(
                    "a configuration arrived while message {id} was still arriving: \
                     the message is dropped"
                ),
                reservation: None,
            });
        }
        // The old handlers finish their queue first; their cores come back
        // for a configuration identical to theirs.
        let kept = match self.state.take() {
            Some(old) => tokio::task::spawn_blocking(move || old.wind_down(true))
                .await
                .ok()
                .flatten(),
            None => self.kept.take(),
        };
        let started = std::time::Instant::now();
        let (limit, any_length) = (self.limit, self.any_length);
        let r = configure::configure(payload, self.opts, limit, any_length, &self.out, kept).await;
        if let Some(s) = &self.stats {
            match &r {
                Ok((c, Outcome::Reused)) => s.reused(&c.cfg),
                Ok((c, Outcome::Loaded)) => s.configured(Some(&c.cfg), started.elapsed()),
                Err(_) => s.configured(None, started.elapsed()),
            }
        }
        match r {
            Ok((c, outcome)) => {
                let what = configure::describe(&c.cfg);
                match outcome {
                    Outcome::Loaded => tracing::info!(node = %self.opts.name, "configured: {what}"),
                    Outcome::Reused => tracing::debug!(
                        node = %self.opts.name,
                        digest = %hex::encode(&c.digest[..6]),
                        "configuration identical to the loaded one, answered without loading: {what}"
                    ),
                }
                self.state = Some(c);
                self.queue(Outgoing::Frame(
                    ConfigurationResponse { status: 0 }.to_frame(),
                ));
            }
            Err(why) => {
                let reason = why.to_string();
                let clipped = ErrorMsg::clip(&reason);
                tracing::warn!(node = %self.opts.name, "configuration refused: {clipped}");
                self.error(ErrorMsg::NO_ID, why.code(), reason);
                let status = ConfigurationResponse::FAILED;
                self.queue(Outgoing::Frame(ConfigurationResponse { status }.to_frame()));
            }
        }
    }

    /// Validates a data message, waits until the memory guard has room for
    /// its input and output, and hands it to the core handlers.
    async fn data(&mut self, payload: Bytes) -> Step {
        let Some(cfg) = self.state.as_ref().map(|s| &s.cfg) else {
            let reason = "data message before any configuration";
            self.error(ErrorMsg::NO_ID, ErrorCode::NotConfigured, reason);
            return Some(Err(NodeError::Session(reason.into())));
        };
        let output_size = cfg.output_size as u64;
        let counted = cfg.count_inputs(payload.len().saturating_sub(DATA_ID_LEN));
        let data = match Data::parse(payload) {
            Ok(d) => d,
            Err(e) => return self.malformed(e),
        };
        let count = match counted {
            Ok(n) => n as u64,
            Err(e) => {
                self.error(data.id, e.code(), e.to_string());
                return Some(Err(NodeError::Protocol(e)));
            }
        };
        // Inputs are bounded by the read limit, but many small inputs may
        // ask for a result no frame can carry: that input fails, the
        // session goes on.
        let out_len = count * output_size;
        if out_len + DATA_ID_LEN as u64 > self.limit as u64 {
            self.queue(Outgoing::Failed {
                id: data.id,
                code: ErrorCode::TooLarge,
                reason: format!(
                    "{count} outputs of {output_size} bytes ({out_len} bytes) do not fit the \
                     message limit of {} bytes",
                    self.limit
                ),
                reservation: None,
            });
            return None;
        }
        let reservation = self.guard.reserve(data.data.len() + out_len as usize).await;
        self.submit(Job {
            id: data.id,
            // A data frame carries no class: a peer without chunks, or a
            // message the server left in the default class.
            class: DEFAULT_CLASS,
            data: data.data,
            count: count as usize,
            reservation,
            queued: std::time::Instant::now(),
        })
        .await
    }

    /// Hands a whole message to the core handlers (or the handler lane).
    async fn submit(&mut self, job: Job) -> Step {
        let st = self
            .state
            .as_mut()
            .expect("configured: checked by the caller");
        if !st.workers.submit(job).await {
            return Some(Err(NodeError::Session("the core handlers stopped".into())));
        }
        if let Some(s) = &self.stats {
            s.job();
        }
        None
    }

    /// `join` starts a member task (replacing any earlier group: the server
    /// only sends a node to one group at a time); `leave` drops it.
    fn group_ctl(&mut self, c: GroupCtl) {
        match c {
            GroupCtl::Join {
                group,
                rank,
                members,
                topology,
                token,
            } => {
                self.group = None;
                let Some(listener) = self.peer.clone() else {
                    let error = Some("this node has no peer port (--peer-listen)".to_string());
                    self.queue(Outgoing::Frame(
                        GroupCtl::Joined { group, error }.to_frame(),
                    ));
                    return;
                };
                let env = MemberEnv {
                    opts: self.opts.clone(),
                    guard: self.guard.clone(),
                    limit: self.limit,
                    listener,
                    out: self.out.clone(),
                };
                self.group = Some(GroupHandle::start(
                    group, rank, members, &topology, token, env,
                ));
            }
            GroupCtl::Leave { group } => {
                if self.group.as_ref().is_some_and(|g| g.group == group) {
                    tracing::info!(node = %self.opts.name, group, "left group");
                    self.group = None;
                }
            }
            other => tracing::warn!(node = %self.opts.name, "ignored group control {other:?}"),
        }
    }

    fn group_cmd(&mut self, c: GroupCmd) {
        let (seq, label) = (c.seq, c.label());
        let live = self.group.as_ref().is_some_and(|g| g.submit(c));
        if !live {
            let reason = format!("{label}: this node is not in a group");
            let r = GroupReply::failed(
                seq,
                u32::MAX,
                ErrorCode::UnexpectedMessage,
                u32::MAX,
                &reason,
            );
            if let Ok(f) = r.to_frame() {
                self.queue(Outgoing::Frame(f));
            }
        }
    }

    fn queue(&self, o: Outgoing) {
        // A closed queue means the sending task ended; the session loop
        // notices that and ends the session.
        let _ = self.out.send(o);
    }

    /// Tells a server that negotiated error messages why (others have no way
    /// to hear it).
    fn error(&self, id: u32, code: ErrorCode, reason: impl Into<String>) {
        if self.negotiated.load(Ordering::Relaxed) {
            self.queue(Outgoing::Frame(ErrorMsg::new(id, code, reason).to_frame()));
        }
    }

    fn malformed(&self, e: corefarm_smp::ProtocolError) -> Step {
        self.error(ErrorMsg::NO_ID, e.code(), e.to_string());
        Some(Err(NodeError::Protocol(e)))
    }
}
