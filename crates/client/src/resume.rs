//! Surviving a lost server: when the connection breaks (end of stream, a
//! read or write error, or a server that has no node left for this user),
//! the reader thread of that connection becomes the resumer. It connects
//! to the next address of the list (round-robin from the one after the
//! lost one, backing off 50 ms, doubling, at most 2 s between attempts),
//! runs the hello (and the authentication) again, sends the last accepted
//! configuration again, then every data message not yet answered under its
//! original id, oldest first, within the new server's credit. Meanwhile new
//! submissions and configurations wait, and results, `Pending`s and `map`s
//! simply wait longer: each id is answered once (see [`Kept::answered`]).
//!
//! A server that refuses the configuration the lost one had accepted (no
//! node for this user, or nodes that cannot run the function) is not the
//! one to resume on: the next address is tried. Resuming gives up once
//! `reconnect_timeout` has passed since the last server that took the
//! session, failing every waiter with [`ClientError::ServerLost`], which
//! says how many data messages were left unanswered.

use std::collections::{HashMap, VecDeque};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::write_frame;
use corefarm_smp::hello::features;
use corefarm_smp::{Configuration, ErrorCode, ErrorMsg};

use crate::error::Failure;
use crate::inner::{lock, Inner};
use crate::reader::State;
use crate::{ClientError, ClientOptions, Result};

/// Pause after the first failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// "a:1,b:2" (spaces allowed) as a list; at least one address.
pub(crate) fn addresses(list: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if addrs.is_empty() {
        return Err(ClientError::InvalidInput(format!(
            "no server address in {list:?} (host:port, or several separated by commas)"
        )));
    }
    Ok(addrs)
}

/// How a client resumes: the addresses, which one is in use, its options.
#[derive(Debug)]
pub(crate) struct Resume {
    addrs: Vec<String>,
    current: AtomicUsize,
    timeout: Duration,
    opts: ClientOptions,
    resumes: AtomicU64,
}

impl Resume {
    pub fn new(addrs: Vec<String>, current: usize, timeout: Duration, opts: ClientOptions) -> Self {
        Resume {
            addrs,
            current: AtomicUsize::new(current),
            timeout,
            opts,
            resumes: AtomicU64::new(0),
        }
    }

    pub fn current_addr(&self) -> String {
        self.addrs[self.current.load(Ordering::Relaxed)].clone()
    }

    pub fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Relaxed)
    }
}

/// Data messages sent and not yet answered, with what it takes to send
/// them again. Ids are usually unique; a caller may put one id on several
/// `recv` messages at once, each kept and answered in turn.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    seq: u64,
    len: usize,
    by_id: HashMap<u32, Entry>,
}

#[derive(Debug)]
struct Entry {
    first: Message,
    /// Further messages under the same id (no allocation while empty).
    more: VecDeque<Message>,
}

#[derive(Debug)]
struct Message {
    /// Send order, so that a resend keeps it.
    seq: u64,
    class: u8,
    body: Bytes,
}

impl Kept {
    pub fn keep(&mut self, id: u32, class: u8, body: Bytes) {
        self.seq += 1;
        self.len += 1;
        let m = Message {
            seq: self.seq,
            class,
            body,
        };
        match self.by_id.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().more.push_back(m),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Entry {
                    first: m,
                    more: VecDeque::new(),
                });
            }
        }
    }

    /// Records an answer for `id`: false if none was expected, i.e. a
    /// duplicate (sent again after a lost server, or hedged), dropped.
    pub fn answered(&mut self, id: u32) -> bool {
        let std::collections::hash_map::Entry::Occupied(mut e) = self.by_id.entry(id) else {
            return false;
        };
        match e.get_mut().more.pop_front() {
            Some(next) => e.get_mut().first = next,
            None => {
                e.remove();
            }
        }
        self.len -= 1;
        true
    }

    /// Data messages not answered yet.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Every message not answered, in the order it was first sent.
    fn snapshot(&self) -> Vec<(u32, u8, Bytes)> {
        let mut all: Vec<(u64, u32, u8, Bytes)> = Vec::with_capacity(self.len);
        for (&id, e) in &self.by_id {
            for m in std::iter::once(&e.first).chain(&e.more) {
                all.push((m.seq, id, m.class, m.body.clone()));
            }
        }
        all.sort_unstable_by_key(|m| m.0);
        all.into_iter().map(|(_, id, c, b)| (id, c, b)).collect()
    }
}

/// Whether this error from the server means it has no node left for the
/// user, so that a resuming client should move to another server: a
/// per-message no-nodes error, or a session-wide one outside a
/// configuration (there, no-nodes only warns of fewer nodes than asked).
pub(crate) fn moves_on(st: &State, e: &ErrorMsg) -> bool {
    st.kept.is_some()
        && e.code() == Some(ErrorCode::NoNodes)
        && (e.id != ErrorMsg::NO_ID || st.configs_unanswered == 0)
}

/// A first configuration that a server refused at once because no node
/// is connected to it (`moves-on`; after a failover, a restarted server
/// holds none): the client leaves that server for its next address, as a
/// resumed session does, until `reconnect_timeout` after the first
/// refusal. After each round of every address it pauses, doubling, so
/// servers that all lack nodes are not hammered. Returns
/// whether the caller should send its configuration again.
pub(crate) fn move_on_without_nodes(
    inner: &Inner,
    link: u64,
    errors: &[ErrorMsg],
    moves: &mut Moves,
) -> bool {
    let Some(r) = &inner.resume else {
        return false;
    };
    if r.addrs.len() < 2 || !errors.iter().any(|e| e.code() == Some(ErrorCode::NoNodes)) {
        return false;
    }
    let since = *moves.since.get_or_insert_with(Instant::now);
    let Some(left) = r
        .timeout
        .checked_sub(since.elapsed())
        .filter(|l| !l.is_zero())
    else {
        return false;
    };
    moves.count += 1;
    if moves.count.is_multiple_of(r.addrs.len()) {
        pause(inner, moves.backoff.min(left));
        moves.backoff = (moves.backoff * 2).min(MAX_BACKOFF);
    }
    inner.lost_on_write(link);
    true
}

/// How far one configuration has moved on from servers without nodes.
#[derive(Debug)]
pub(crate) struct Moves {
    since: Option<Instant>,
    count: usize,
    backoff: Duration,
}

impl Default for Moves {
    fn default() -> Self {
        Moves {
            since: None,
            count: 0,
            backoff: FIRST_BACKOFF,
        }
    }
}

/// Called by the reader of connection `link` when it ends with `f`.
/// Returns false when the session is not resumed (resuming off, a failure
/// that a new connection would not cure, or the client closing): the
/// caller then fails it. Otherwise resumes it on this thread, or leaves
/// that to the resume already under way.
pub(crate) fn on_lost(inner: &Arc<Inner>, link: u64, f: &Failure) -> bool {
    let Some(r) = &inner.resume else {
        return false;
    };
    if !f.retryable() {
        return false;
    }
    let mut st = inner.shared.lock();
    if st.failed.is_some() || st.closing {
        return false;
    }
    if st.link != link {
        // A connection that was replaced already.
        return true;
    }
    st.losses += 1;
    // What the lost server granted or owed dies with it; an answer that
    // arrived before the loss stays for its waiter.
    st.credit = 0;
    if st.configs_unanswered > 0 {
        st.configs_unanswered = 0;
        st.config_errors.clear();
    }
    if st.status_received < st.status_sent {
        // Requests that will never be answered: their waiters find no
        // answer and the loss, and fail (see `Inner::status`).
        st.status_received = st.status_sent;
        st.status_reply = None;
    }
    let under_way = std::mem::replace(&mut st.resuming, true);
    drop(st);
    inner.shared.cond.notify_all();
    // A server without nodes leaves the connection open: shut it.
    inner.lost_on_write(link);
    if !under_way {
        resume(inner, r);
    }
    true
}

/// Why one attempt did not resume the session.
struct Missed {
    error: ClientError,
    /// The server took the configuration before the connection was lost
    /// again: a working server, so the clock starts over.
    configured: bool,
}

fn missed(error: ClientError) -> Missed {
    Missed {
        error,
        configured: false,
    }
}

fn resume(inner: &Arc<Inner>, r: &Resume) {
    let mut since = Instant::now();
    let mut last;
    let mut backoff = FIRST_BACKOFF;
    let mut next = (r.current.load(Ordering::Relaxed) + 1) % r.addrs.len();
    loop {
        if inner.shared.lock().failed.is_some() {
            return;
        }
        let deadline = since.checked_add(r.timeout);
        let i = next;
        next = (next + 1) % r.addrs.len();
        match attempt(inner, r, i, deadline) {
            Ok(()) => {
                inner.shared.lock().resuming = false;
                inner.shared.cond.notify_all();
                return;
            }
            Err(m) => {
                if m.configured {
                    since = Instant::now();
                    backoff = FIRST_BACKOFF;
                }
                last = m.error;
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return give_up(inner, since, last);
        }
        // The pause ends early only when the client fails (or closes).
        pause(inner, left.map_or(backoff, |l| l.min(backoff)));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Waits `length`, or less if the client fails (or closes) meanwhile.
fn pause(inner: &Inner, length: Duration) {
    let until = Instant::now() + length;
    let mut st = inner.shared.lock();
    while st.failed.is_none() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        st = inner
            .shared
            .cond
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn give_up(inner: &Inner, since: Instant, last: ClientError) {
    let unanswered = inner.shared.lock().kept.as_ref().map_or(0, Kept::len);
    inner.shared.fail(Failure::Lost {
        unanswered,
        waited: since.elapsed(),
        cause: Arc::new(last),
    });
    let _ = lock(&inner.writer).shutdown(Shutdown::Both);
}

/// One attempt on address `i`: connect, hello, take the connection over,
/// configure, send the unanswered messages again.
fn attempt(
    inner: &Arc<Inner>,
    r: &Resume,
    i: usize,
    deadline: Option<Instant>,
) -> Result<(), Missed> {
    let addr = &r.addrs[i];
    let mut opts = r.opts.clone();
    if let Some(d) = deadline {
        let left = d
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        opts.connect_timeout = Some(opts.connect_timeout.map_or(left, |t| t.min(left)));
    }
    let (mut writer, mut reader) = crate::connect::open_link(addr, &opts).map_err(missed)?;
    let moves_on = r.addrs.len() > 1;
    let hello = crate::connect::handshake(addr, &opts, moves_on, &mut writer, &mut reader)
        .map_err(missed)?;
    let chunk_size = Some(&hello)
        .filter(|h| h.has(features::CHUNKS))
        .and_then(|h| h.chunk_size)
        .filter(|&s| s > 0);
    if hello.has(features::CREDIT) != inner.credit_mode || chunk_size != inner.chunk_size {
        return Err(missed(ClientError::Handshake {
            addr: addr.clone(),
            detail: "it agreed to other extensions (credit, chunks) than the lost server, \
                     so the session cannot move there"
                .into(),
        }));
    }
    if let Some(size) = chunk_size {
        crate::chunked::shallow_send_buffer(writer.tcp(), size);
    }

    // The new connection takes the old one's place.
    let (link, losses) = {
        let mut w = lock(&inner.writer);
        let mut st = inner.shared.lock();
        if st.failed.is_some() {
            let _ = writer.shutdown(Shutdown::Both);
            return Err(missed(ClientError::ClosedLocally));
        }
        st.link += 1;
        st.credit = 0;
        let ids = (st.link, st.losses);
        drop(st);
        *w = writer;
        inner.link.store(ids.0, Ordering::Release);
        ids
    };
    r.current.store(i, Ordering::Relaxed);
    let reassembler = chunk_size.map(|_| crate::chunked::reassembler(opts.max_message));
    crate::inner::spawn_reader(inner, reader, link, reassembler).map_err(|source| {
        inner.lost_on_write(link);
        missed(ClientError::Io {
            during: "starting the reader thread",
            source,
        })
    })?;

    let cfg = lock(&inner.configuration).clone();
    if let Some(cfg) = cfg {
        configure_again(inner, &cfg, link, losses, deadline).map_err(missed)?;
    }
    // Counted once a server has taken the session, before anything it
    // could answer is sent again.
    r.resumes.fetch_add(1, Ordering::Relaxed);
    send_again(inner, link, losses).map_err(|error| Missed {
        error,
        configured: true,
    })
}

/// The connection was lost while resuming on it, or the client failed.
fn check(st: &State, losses: u64, during: &'static str) -> Result<()> {
    if let Some(f) = &st.failed {
        return Err(f.to_error(during));
    }
    if st.losses != losses {
        return Err(ClientError::Closed { during });
    }
    Ok(())
}

/// Sends the configuration in force again and waits for its answer. A
/// function is content-addressed, so a node that still holds it is reused
/// rather than programmed again.
fn configure_again(
    inner: &Inner,
    cfg: &Configuration,
    link: u64,
    losses: u64,
    deadline: Option<Instant>,
) -> Result<()> {
    const DURING: &str = "while configuring the resumed session";
    {
        let mut st = inner.shared.lock();
        check(&st, losses, DURING)?;
        st.configs_unanswered += 1;
        st.config_reply = None;
        st.config_errors.clear();
        st.pending_sizes = Some((cfg.input_size, cfg.output_size));
    }
    let frame = cfg
        .to_frame()
        .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
    let sent = {
        let mut w = lock(&inner.writer);
        match inner.link.load(Ordering::Acquire) == link {
            true => write_frame(&mut *w, frame),
            false => Ok(()),
        }
    };
    if let Err(source) = sent {
        inner.lost_on_write(link);
        return Err(ClientError::Io {
            during: DURING,
            source,
        });
    }
    let mut st = inner.shared.lock();
    loop {
        check(&st, losses, DURING)?;
        if let Some(reply) = st.config_reply.take() {
            let errors: Vec<ErrorMsg> = st.config_errors.drain(..).collect();
            if reply.ok() {
                st.warnings = errors.into_iter().map(|e| e.reason).collect();
                return Ok(());
            }
            drop(st);
            // The lost server ran this function: this one has no node for
            // it (or none that can run it). Another server may.
            inner.lost_on_write(link);
            let reasons: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(ClientError::Configuration {
                status: Some(reply.status),
                reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
            });
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        st = match left {
            Some(l) if l.is_zero() => {
                drop(st);
                inner.lost_on_write(link);
                return Err(ClientError::Timeout {
                    after: inner.resume.as_ref().map_or(l, |r| r.timeout),
                    during: "waiting for the resumed session's configuration",
                });
            }
            Some(l) => {
                inner
                    .shared
                    .cond
                    .wait_timeout(st, l)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => inner
                .shared
                .cond
                .wait(st)
                .unwrap_or_else(|p| p.into_inner()),
        };
    }
}

/// Sends every unanswered message again, oldest first, under its id and
/// within the new server's credit. Results of messages whose `Pending`
/// was dropped would be discarded: those are forgotten instead.
fn send_again(inner: &Inner, link: u64, losses: u64) -> Result<()> {
    const DURING: &str = "while sending unanswered data again";
    let batch = {
        let mut st = inner.shared.lock();
        let st = &mut *st;
        let abandoned: Vec<u32> = st
            .claims
            .iter()
            .filter(|(_, s)| s.abandoned())
            .map(|(&id, _)| id)
            .collect();
        for id in abandoned {
            st.claims.remove(&id);
            if let Some(k) = st.kept.as_mut() {
                k.answered(id);
            }
        }
        st.kept.as_ref().map(Kept::snapshot).unwrap_or_default()
    };
    for (id, class, body) in batch {
        {
            let kept = crate::chunked::kept_credit(inner.chunk_size, class);
            let mut st = inner.shared.lock();
            loop {
                check(&st, losses, DURING)?;
                if !inner.credit_mode || st.credit > kept {
                    break;
                }
                // No limit: the server is working, its credit comes with
                // the results of what was sent before.
                st = inner
                    .shared
                    .cond
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if inner.credit_mode {
                st.credit -= 1;
            }
        }
        if let Err(source) = inner.write_data(id, class, &body, link) {
            inner.lost_on_write(link);
            return Err(ClientError::Io {
                during: DURING,
                source,
            });
        }
    }
    Ok(())
}
