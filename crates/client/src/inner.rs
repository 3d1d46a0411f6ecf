//! The connection shared by `Client`, `Sender` and `Receiver`: writes on the
//! caller's thread, waits on the state the reader thread keeps.

use std::io;
use std::net::Shutdown;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::{write_data_borrowed, write_frame};
use corefarm_smp::hello::features;
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{ClusterStatus, Configuration, ErrorMsg, Hello};

use crate::error::Failure;
use crate::pending::{Pending, Slot};
use crate::reader::{self, Event, Rendezvous, State};
use crate::{ClientError, Output, Result};

#[derive(Debug, Default)]
pub(crate) struct ConfigureTiming {
    pub since: Option<Instant>,
    pub took: Option<Duration>,
}

impl ConfigureTiming {
    fn answered(&mut self, ok: bool) {
        if let (true, Some(t)) = (ok, self.since) {
            let d = t.elapsed();
            // Recent programming times count most; one outlier does not rule.
            self.took = Some(self.took.map_or(d, |m| (m * 3 + d) / 4));
        }
        self.since = None;
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub addr: String,
    pub writer: Mutex<crate::tls::SendHalf>,
    pub shared: Arc<Rendezvous>,
    pub server_hello: Option<Hello>,
    pub credit_mode: bool,
    /// The chunk size agreed in the hello (`ClientOptions::chunks`).
    pub chunk_size: Option<u32>,
    /// Turns at the socket for chunks, most urgent class first.
    pub gate: crate::chunked::Gate,
    /// Chunks written so far (a test hook's signal).
    pub chunks_written: std::sync::atomic::AtomicU64,
    /// `ClientOptions::io_timeout`, changeable while connected
    /// ([`Client::set_io_timeout`](crate::Client::set_io_timeout)).
    pub io_timeout: IoTimeout,
    pub configure_lock: Mutex<()>,
    pub status_lock: Mutex<()>,
    /// The last configuration the server accepted (for co-working).
    pub configuration: Mutex<Option<Configuration>>,
    /// A co-working call's configuration request is on its way: later
    /// calls do not queue more behind it (each would program nodes for a
    /// function whose call may be over by then).
    #[cfg(feature = "cowork")]
    pub cowork_configuring: std::sync::atomic::AtomicBool,
    /// When the configuration on its way was sent, and how long accepted
    /// ones took (a moving average): when co-working expects the next.
    pub configure_timing: Mutex<ConfigureTiming>,
    /// The reader threads: one per connection (resuming adds one each time).
    pub reader: Mutex<Vec<JoinHandle<()>>>,
    /// How to resume after a lost server (`None`: resuming off).
    pub resume: Option<crate::resume::Resume>,
    /// `State::link` of the socket in `writer`, changed with it under the
    /// writer's lock: a write meant for a lost connection is skipped (the
    /// resume sends that message again) instead of reaching the new one.
    pub link: std::sync::atomic::AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A data body: shared (`Bytes`, may outlive the call) or borrowed.
pub(crate) enum Body<'a> {
    Shared(Bytes),
    Borrowed(&'a [u8]),
}

impl Body<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Body::Shared(b) => b,
            Body::Borrowed(b) => b,
        }
    }

    /// The body kept for a resend. A shared body is kept by reference. A
    /// borrowed one is copied: the caller's memory is only lent for the
    /// call, and the resend may come much later. The copy is made only
    /// while resuming is on; callers who cannot afford it pass `Bytes`,
    /// or turn resuming off.
    fn kept(&self) -> Bytes {
        match self {
            Body::Shared(b) => b.clone(),
            Body::Borrowed(b) => Bytes::copy_from_slice(b),
        }
    }
}

/// Who gets a data message's result.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `recv` (any caller).
    Recv,
    /// A `Pending` returned to the submitter; with a generation, only while
    /// no configuration has been sent since that one (`State::generation`).
    Pending(Option<u64>),
}

/// What to do without credit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreditWait {
    Block,
    /// Return `Ok(None)` instead of waiting.
    NoWait,
}

/// A limit that every waiting thread reads and any thread may change: a
/// duration in nanoseconds, `u64::MAX` for none.
#[derive(Debug)]
pub(crate) struct IoTimeout(std::sync::atomic::AtomicU64);

impl IoTimeout {
    pub fn new(t: Option<Duration>) -> IoTimeout {
        let limit = IoTimeout(Default::default());
        limit.set(t);
        limit
    }

    pub fn get(&self) -> Option<Duration> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    pub fn set(&self, t: Option<Duration>) {
        // Longer than 584 years is no limit.
        let n = t.map_or(u64::MAX, |t| {
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
        });
        self.0.store(n, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Inner {
    fn deadline(&self) -> Option<Instant> {
        self.io_timeout
            .get()
            .and_then(|t| Instant::now().checked_add(t))
    }

    /// See [`Client::wait_for_credit`](crate::Client::wait_for_credit).
    pub fn wait_for_credit(&self, class: u8, timeout: Duration) -> Result<bool> {
        if !self.credit_mode && self.resume.is_none() {
            return Ok(true);
        }
        // A timeout too long for the clock waits without one.
        let deadline = Instant::now().checked_add(timeout);
        let kept = crate::chunked::kept_credit(self.chunk_size, class);
        let mut st = self.shared.lock();
        loop {
            if let Some(f) = &st.failed {
                return Err(f.to_error("while waiting for credit"));
            }
            if !st.resuming && (!self.credit_mode || st.credit > kept) {
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(false);
            }
            st.credit_waiters += 1;
            self.shared.cond.notify_all();
            let cond = &self.shared.cond;
            st = match left {
                Some(l) => {
                    cond.wait_timeout(st, l)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => cond.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
            st.credit_waiters -= 1;
        }
    }

    /// Sends one data message in priority `class`. `id: None` takes the
    /// next automatic id. Returns the id used and, for `Route::Pending`,
    /// its handle; `None` when `wait` is `NoWait` and there is no credit.
    pub fn send_data(
        &self,
        id: Option<u32>,
        body: Body<'_>,
        route: Route,
        wait: CreditWait,
        class: u8,
    ) -> Result<Option<(u32, Option<Pending>)>> {
        let len = body.as_slice().len();
        if class >= corefarm_smp::stream::CLASSES {
            return Err(ClientError::InvalidInput(format!(
                "priority {class}: classes are 0 (most urgent) to {}",
                corefarm_smp::stream::CLASSES - 1
            )));
        }
        if class != DEFAULT_CLASS && self.chunk_size.is_none() {
            // Classes are carried by chunks: without them every message
            // would go out as class 4, which the caller did not ask for.
            return Err(ClientError::InvalidInput(format!(
                "priority {class} needs the chunks feature, which this connection did not \
                 agree: connect with chunks (ClientOptions::chunks; chunks=True in Python)"
            )));
        }
        let registered = {
            let mut st = self.shared.lock();
            if let Some(f) = &st.failed {
                return Err(f.to_error("before this data could be sent"));
            }
            if let Route::Pending(Some(g)) = route {
                if st.generation != g {
                    return Err(ClientError::Usage(
                        "the client was configured again while this map ran: \
                         its remaining inputs were not sent (the new function \
                         would have computed them)"
                            .into(),
                    ));
                }
            }
            let (input_size, _) = st.sizes.ok_or(ClientError::NotConfigured)?;
            if len == 0 || !len.is_multiple_of(input_size as usize) {
                return Err(ClientError::InvalidInput(format!(
                    "{len} bytes is not a whole, non-zero number of {input_size}-byte inputs"
                )));
            }
            let max = self
                .server_hello
                .as_ref()
                .and_then(|h| h.max_message)
                .unwrap_or(u32::MAX) as usize;
            if len + corefarm_smp::DATA_ID_LEN > max {
                return Err(ClientError::InvalidInput(format!(
                    "a data message of {len} bytes exceeds the server's limit of {max} bytes"
                )));
            }
            // While a lost server is being replaced nothing new is sent:
            // the new connection first gets the configuration and the
            // messages that were never answered.
            // That wait is bounded by `reconnect_timeout`, not `io_timeout`,
            // whose limit starts afresh once the server is back.
            if self.credit_mode || st.resuming {
                let mut deadline = self.deadline();
                let kept = crate::chunked::kept_credit(self.chunk_size, class);
                while st.resuming || (self.credit_mode && st.credit <= kept) {
                    if let Some(f) = &st.failed {
                        return Err(f.to_error("while waiting for credit"));
                    }
                    if wait == CreditWait::NoWait {
                        return Ok(None);
                    }
                    st.credit_waiters += 1;
                    self.shared.cond.notify_all();
                    let resuming = st.resuming;
                    let limit = if resuming { None } else { deadline };
                    let r = self.wait(st, limit, "waiting for credit from the server");
                    if resuming {
                        deadline = self.deadline();
                    }
                    st = match r {
                        Ok(mut st) => {
                            st.credit_waiters -= 1;
                            st
                        }
                        Err(e) => {
                            self.shared.lock().credit_waiters -= 1;
                            return Err(e);
                        }
                    };
                }
            }
            let chosen = id.is_some();
            let id = match id {
                Some(id) if st.claims.contains_key(&id) => {
                    return Err(ClientError::Usage(format!(
                        "id {id} is already in flight for a pending result; \
                         its answer could not be told apart"
                    )))
                }
                Some(id) if matches!(route, Route::Pending(_)) && st.chosen.contains_key(&id) => {
                    return Err(ClientError::Usage(format!(
                        "id {id} is already in flight for recv(); \
                         its answer could not be told apart"
                    )))
                }
                Some(id) => id,
                None => next_free_id(&mut st),
            };
            if self.credit_mode {
                st.credit -= 1;
            }
            // Registered before the data is written, so that the result
            // cannot arrive ahead of its route.
            let pending = match route {
                Route::Recv => {
                    st.unclaimed += 1;
                    if chosen {
                        *st.chosen.entry(id).or_default() += 1;
                    }
                    None
                }
                Route::Pending(_) => {
                    let slot = Slot::new(id);
                    st.claims.insert(id, slot.clone());
                    Some(Pending::new(slot))
                }
            };
            if let Some(k) = st.kept.as_mut() {
                k.keep(id, class, body.kept());
            }
            (id, pending, st.link)
        };
        let (id, pending, link) = registered;
        if let Err(e) = self.write_data(id, class, body.as_slice(), link) {
            return match self.resume {
                // Kept: the resume sends it again.
                Some(_) => {
                    self.lost_on_write(link);
                    Ok(Some((id, pending)))
                }
                None => Err(self.write_failed(e, "while sending data")),
            };
        }
        Ok(Some((id, pending)))
    }

    /// Writes one data message, as chunks when its class or size asks for
    /// them, to connection `link`; nothing once that one was replaced.
    pub fn write_data(&self, id: u32, class: u8, body: &[u8], link: u64) -> io::Result<()> {
        let writer = || {
            let w = lock(&self.writer);
            let current = self.resume.is_none()
                || self.link.load(std::sync::atomic::Ordering::Acquire) == link;
            current.then_some(w)
        };
        match self.chunk_size {
            Some(size) if class != DEFAULT_CLASS || body.len() > size as usize => {
                crate::chunked::send(&self.gate, id, class, body, size, |f| {
                    let Some(mut w) = writer() else {
                        return Ok(());
                    };
                    crate::chunked::write_buf(&mut *w, f)?;
                    self.chunks_written
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(())
                })
            }
            Some(_) => {
                // Whole, but in its turn: urgent chunks of other threads first.
                let _turn = self.gate.turn(class);
                writer().map_or(Ok(()), |mut w| write_data_borrowed(&mut *w, id, body))
            }
            None => writer().map_or(Ok(()), |mut w| write_data_borrowed(&mut *w, id, body)),
        }
    }

    /// A write to connection `link` failed with resuming on: half a frame
    /// may be on the wire, so that connection is shut, which its reader
    /// sees and reports as lost (a newer connection is left alone).
    pub fn lost_on_write(&self, link: u64) {
        let w = lock(&self.writer);
        if self.link.load(std::sync::atomic::Ordering::Acquire) == link {
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    /// Waits on the state condvar until notified or `deadline`.
    pub fn wait<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        during: &'static str,
    ) -> Result<MutexGuard<'a, State>> {
        let cond = &self.shared.cond;
        match deadline {
            None => Ok(cond.wait(st).unwrap_or_else(|p| p.into_inner())),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::Timeout {
                        after: self.io_timeout.get().unwrap_or_default(),
                        during,
                    });
                }
                Ok(cond
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0)
            }
        }
    }

    /// A write that failed part-way leaves half a frame on the wire, so the
    /// connection is closed; if the reader thread already knows why the
    /// server went away, that is the better message.
    fn write_failed(&self, e: io::Error, during: &'static str) -> ClientError {
        if let Some(f) = &self.shared.lock().failed {
            return f.to_error(during);
        }
        let err = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout {
                after: self.io_timeout.get().unwrap_or_default(),
                during: "sending to the server (it is not reading)",
            },
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                ClientError::Closed { during }
            }
            _ => ClientError::Io {
                during,
                source: io::Error::new(e.kind(), e.to_string()),
            },
        };
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
        self.shared.fail(Failure::Io(e.kind(), e.to_string()));
        err
    }

    pub fn configure(&self, cfg: &Configuration) -> Result<()> {
        let _one_at_a_time = lock(&self.configure_lock);
        let mut first = true;
        let mut moves = crate::resume::Moves::default();
        // One pass per connection: a server lost while this configuration
        // was on its way gets it again on the resumed connection (after the
        // one in force, which the resume sends first).
        'link: loop {
            let (losses, link) = {
                let mut st = self.shared.lock();
                // Bounded by `reconnect_timeout`, not `io_timeout`.
                while st.resuming && st.failed.is_none() {
                    st = self.wait(st, None, "waiting for the server to be resumed")?;
                }
                if let Some(f) = &st.failed {
                    return Err(f.to_error("before the configuration could be sent"));
                }
                st.configs_unanswered += 1;
                if std::mem::take(&mut first) {
                    st.generation += 1;
                }
                st.config_reply = None;
                st.config_errors.clear();
                st.pending_sizes = Some((cfg.input_size, cfg.output_size));
                (st.losses, st.link)
            };
            let deadline = self.deadline();
            let frame = cfg.to_frame().map_err(|e| {
                self.shared.lock().configs_unanswered -= 1;
                ClientError::InvalidInput(e.to_string())
            })?;
            lock(&self.configure_timing).since = Some(Instant::now());
            let sent = {
                let mut w = lock(&self.writer);
                match self.resume.is_none()
                    || self.link.load(std::sync::atomic::Ordering::Acquire) == link
                {
                    true => write_frame(&mut *w, frame),
                    false => Ok(()),
                }
            };
            if let Err(e) = sent {
                if self.resume.is_none() {
                    self.shared.lock().configs_unanswered -= 1;
                    lock(&self.configure_timing).answered(false);
                    return Err(self.write_failed(e, "while sending the configuration"));
                }
                self.lost_on_write(link);
            }
            let mut st = self.shared.lock();
            loop {
                if st.config_reply.is_none() && st.losses != losses && st.failed.is_none() {
                    lock(&self.configure_timing).answered(false);
                    drop(st);
                    continue 'link;
                }
                if let Some(r) = st.config_reply.take() {
                    lock(&self.configure_timing).answered(r.ok());
                    let errors: Vec<ErrorMsg> = st.config_errors.drain(..).collect();
                    if !r.ok() {
                        drop(st);
                        if crate::resume::move_on_without_nodes(self, link, &errors, &mut moves) {
                            continue 'link;
                        }
                        st = self.shared.lock();
                    }
                    return if r.ok() {
                        st.warnings = errors.into_iter().map(|e| e.reason).collect();
                        *lock(&self.configuration) = Some(cfg.clone());
                        Ok(())
                    } else {
                        let reasons: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                        let reason = (!reasons.is_empty()).then(|| reasons.join("; "));
                        Err(ClientError::Configuration {
                            status: Some(r.status),
                            reason,
                        })
                    };
                }
                if let Some(f) = st.failed.clone() {
                    st.configs_unanswered = 0;
                    lock(&self.configure_timing).answered(false);
                    // The server explained before it hung up: that is the error.
                    if !st.config_errors.is_empty() {
                        let reasons: Vec<String> =
                            st.config_errors.drain(..).map(|e| e.to_string()).collect();
                        return Err(ClientError::Configuration {
                            status: None,
                            reason: Some(reasons.join("; ")),
                        });
                    }
                    return Err(f.to_error("while waiting for the configuration response"));
                }
                st = self
                    .wait(st, deadline, "waiting for the configuration response")
                    .inspect_err(|_| lock(&self.configure_timing).answered(false))?;
            }
        }
    }

    pub fn status(&self) -> Result<ClusterStatus> {
        self.status_query(&corefarm_smp::StatusQuery::all())
    }

    pub fn status_query(&self, q: &corefarm_smp::StatusQuery) -> Result<ClusterStatus> {
        if !self
            .server_hello
            .as_ref()
            .is_some_and(|h| h.has(features::STATUS))
        {
            return Err(ClientError::Unsupported(
                "the status extension (connect with a hello to a server that offers it)",
            ));
        }
        // One request at a time: the answer to ours is the next one.
        let _one_at_a_time = lock(&self.status_lock);
        let (mine, losses, link) = {
            let mut st = self.shared.lock();
            if let Some(f) = &st.failed {
                return Err(f.to_error("before the status request could be sent"));
            }
            // An observer asks again rather than wait out a resume.
            if st.resuming {
                return Err(ClientError::Closed {
                    during: "(the session is being resumed on a new connection)",
                });
            }
            st.status_sent += 1;
            (st.status_sent, st.losses, st.link)
        };
        let sent = {
            let mut w = lock(&self.writer);
            match self.resume.is_none()
                || self.link.load(std::sync::atomic::Ordering::Acquire) == link
            {
                true => write_frame(&mut *w, q.to_frame()),
                // Lost meanwhile: the wait below sees it.
                false => Ok(()),
            }
        };
        if let Err(e) = sent {
            if self.resume.is_none() {
                return Err(self.write_failed(e, "while asking for the status"));
            }
            self.lost_on_write(link);
        }
        let deadline = self.deadline();
        let mut st = self.shared.lock();
        loop {
            // An earlier request that timed out may still be answered first.
            if st.status_received >= mine {
                let reply = st
                    .status_reply
                    .take()
                    .ok_or_else(|| match st.losses != losses {
                        // Lost with its connection (which is being resumed):
                        // asking again may succeed.
                        true => ClientError::Closed {
                            during: "while waiting for the status",
                        },
                        false => ClientError::Unexpected("a status answer went missing".into()),
                    })?;
                return reply.map_err(ClientError::Protocol);
            }
            if let Some(f) = &st.failed {
                return Err(f.to_error("while waiting for the status"));
            }
            st = self.wait(st, deadline, "waiting for the status")?;
        }
    }

    pub fn recv(&self, timeout: Option<Duration>) -> Result<Output> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.shared.lock();
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return match ev {
                    Event::Data(o) => Ok(o),
                    Event::Error(e) => Err(ClientError::Server(e)),
                };
            }
            if let Some(f) = &st.failed {
                return Err(f.to_error("while waiting for results"));
            }
            // Waiting could only end if another thread submitted: say so
            // rather than hang (see the crate docs on recv and map).
            // Results nobody waits for any more (a dropped map or Pending)
            // do not count: they are discarded on arrival.
            let claimed = match st.unclaimed {
                0 => st.claims.values().filter(|s| !s.abandoned()).count(),
                _ => 0,
            };
            if claimed > 0 {
                return Err(ClientError::Usage(format!(
                    "recv() only returns results of submit(); the {claimed} data message(s) in \
                     flight belong to map() or to Pending handles and are returned there"
                )));
            }
            st.receivers_waiting += 1;
            self.shared.cond.notify_all();
            let results = &self.shared.results;
            let timed_out;
            (st, timed_out) = match deadline {
                None => (results.wait(st).unwrap_or_else(|p| p.into_inner()), false),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    let (st, r) = results
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner());
                    (st, r.timed_out())
                }
            };
            st.receivers_waiting -= 1;
            if timed_out && st.queue.is_empty() && st.failed.is_none() {
                return Err(ClientError::Timeout {
                    after: timeout.unwrap_or_default(),
                    during: "waiting for a result",
                });
            }
        }
    }

    pub fn close(&self) {
        self.shared.lock().closing = true;
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
        self.shared.fail(Failure::ClosedLocally);
    }
}

/// The next automatic id: not the NO_ID marker (ambiguous in the server's
/// error messages) and not one a `Pending` still waits for (after a wrap).
fn next_free_id(st: &mut State) -> u32 {
    loop {
        let id = st.next_id;
        st.next_id = st.next_id.wrapping_add(1);
        if id != ErrorMsg::NO_ID
            && !st.claims.contains_key(&id)
            && (st.chosen.is_empty() || !st.chosen.contains_key(&id))
        {
            return id;
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
        // The readers see end-of-stream after the shutdown and exit. The
        // last handle may be dropped by a reader thread that resumed the
        // connection: it does not wait for itself.
        let me = std::thread::current().id();
        for h in std::mem::take(&mut *lock(&self.reader)) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

/// Starts the reader thread for connection `link`. When the connection
/// fails, the thread resumes the session if it can (see [`crate::resume`])
/// and otherwise fails it.
pub(crate) fn spawn_reader(
    inner: &Arc<Inner>,
    reader: corefarm_smp::blocking::FrameReader<crate::tls::RecvHalf>,
    link: u64,
    chunks: Option<corefarm_smp::stream::Reassembler>,
) -> io::Result<()> {
    let (shared, credit_mode) = (inner.shared.clone(), inner.credit_mode);
    // Weak: the client closes once its user lets go, readers or not.
    let weak = Arc::downgrade(inner);
    let h = std::thread::Builder::new()
        .name("corefarm-client-reader".into())
        .spawn(move || {
            let f = reader::run(reader, &shared, credit_mode, chunks);
            let resumed = weak
                .upgrade()
                .is_some_and(|inner| crate::resume::on_lost(&inner, link, &f));
            if !resumed {
                shared.fail(f);
            }
        })?;
    lock(&inner.reader).push(h);
    Ok(())
}
