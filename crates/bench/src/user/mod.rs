//! The benchmarking user of seed 000 §4.2.2.
//!
//! It connects to a server's user port, sends the benchmarking configuration
//! (zero cores, 4-byte "bitstream" = processing delay per input) and then
//! runs two loops on two threads: the sender streams data messages, as fast
//! as it can or paced by absolute deadlines, and the receiver matches every
//! result with what was sent. Each input starts with 16 bytes the nodes echo
//! into its output:
//!
//! ```text
//! 0..8   send timestamp, ns since the process epoch (u64 LE)
//! 8..12  message id (u32 LE)
//! 12..16 index of the input inside its message (u32 LE)
//! ```
//!
//! so latency is measured from the echoed timestamp, and an output whose
//! first 16 bytes are not exactly those of its input counts as corrupted.
//! The protocol is spoken directly over `corefarm_smp::blocking` so that the
//! measurement contains nothing but the socket and the framing.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use corefarm_client::tls::{RecvHalf, SendHalf};
use corefarm_smp::blocking::{write_data_borrowed, FrameReader};
use corefarm_smp::codec::ReadError;
use corefarm_smp::hello::features;
use corefarm_smp::{
    BenchmarkConfig, ConfigurationResponse, Credit, Data, ErrorMsg, Frame, Hello, MsgType,
    BENCH_ECHO_LEN, DEFAULT_MAX_MESSAGE,
};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::now_ns;
use crate::stats::{bits_per_second, human_bps, human_size, LatencyHistogram, LatencySummary};

mod loops;
mod report;
mod resume;
mod state;
#[cfg(test)]
mod tests;

use loops::{recv_loop, send_loop, Ended};
use report::{build_report, print_progress, Progress};
use state::{check_result, is_timeout, stamp, InFlight, RunState, Window};

/// Most error descriptions kept in a report; the counters hold the totals.
const MAX_ERROR_SAMPLES: usize = 20;
/// How often blocked loops wake up to look at the clock and the stop flags.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct UserBenchOptions {
    /// The server's user port, or several separated by commas: the first
    /// that answers is used, the others are where a lost session resumes.
    pub server: String,
    /// How long to try to resume the session after its server was lost
    /// (`None`: the run fails with the server, as a seed-format one does).
    pub reconnect_timeout: Option<Duration>,
    pub input_size: u32,
    pub output_size: u32,
    /// Simulated processing delay per input, microseconds.
    pub delay_us: u32,
    /// Inputs per data message.
    pub count: u32,
    /// Measured time, after the warm-up.
    pub duration: Duration,
    /// Time at the start whose results are left out of every statistic.
    pub warmup: Duration,
    /// Messages per second, paced by absolute deadlines; `None` = as fast as possible.
    pub rate_hz: Option<f64>,
    /// Nodes asked for in the hello (`None` = every free node).
    pub nodes: Option<u32>,
    /// Seed-only behaviour: no hello, no extensions.
    pub legacy: bool,
    /// SO_SNDBUF for the user's socket (`None`: the kernel's autotuning).
    /// A user without credit has nothing else bounding the data it has
    /// written but the server has not read yet; Linux grows the send buffer
    /// to several MiB, which at a node-bound rate is tens of milliseconds of
    /// queueing that only the sender can remove.
    pub send_buffer: Option<usize>,
    /// How long results may still arrive after the sender stopped.
    pub drain_timeout: Duration,
    pub connect_timeout: Duration,
    /// One progress line per second on stderr.
    pub progress: bool,
    /// Processes (the server) whose CPU time is sampled at the start and the
    /// end of the measurement window; reported in `cpu`.
    pub cpu_watch: Vec<crate::cpu::CpuTarget>,
    /// The user secret of a server with an auth file (docs/operations.md).
    pub secret: Option<corefarm_smp::auth::Secret>,
    /// The user (tenant) to act for, a `[users.<name>]` of the server's
    /// auth file; `None`: the anonymous tenant.
    pub user: Option<String>,
    /// TLS to the user port (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<corefarm_smp::tls::ClientTls>,
}

impl Default for UserBenchOptions {
    fn default() -> Self {
        UserBenchOptions {
            server: "127.0.0.1:9999".into(),
            reconnect_timeout: Some(Duration::from_secs(30)),
            input_size: 32768,
            output_size: 16384,
            delay_us: 0,
            count: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            rate_hz: None,
            nodes: None,
            legacy: false,
            send_buffer: None,
            drain_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            progress: false,
            cpu_watch: Vec::new(),
            secret: None,
            user: None,
            tls: None,
        }
    }
}

/// What `corefarm bench user --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserReport {
    /// Always "user".
    pub benchmark: String,
    /// False if any result was missing, corrupted or failed, or nothing was measured.
    pub ok: bool,
    /// Descriptions of what went wrong (first few).
    pub errors: Vec<String>,
    pub server: String,
    pub config: RunConfig,
    pub session: Session,
    /// Length of the measurement window, seconds.
    pub window_s: f64,
    pub counts: Counts,
    pub throughput: Throughput,
    /// Round trip per message sent inside the window.
    pub latency: LatencySummary,
    /// CPU of the `cpu_watch` processes inside the window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu: Vec<crate::cpu::CpuUse>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunConfig {
    pub input_size: u32,
    pub output_size: u32,
    pub delay_us: u32,
    pub count: u32,
    /// Data bytes per input message (count × input size).
    pub message_bytes: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rate_hz: Option<f64>,
    pub nodes_requested: Option<u32>,
    pub legacy: bool,
}

/// What was negotiated with the server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Session {
    pub hello: bool,
    /// Nodes the server says it assigned (hello only).
    pub nodes: Option<u32>,
    pub features: Vec<String>,
    /// Whether sending was paced by server credits.
    pub credit: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Over the whole run (warm-up included).
    pub sent_messages: u64,
    pub sent_inputs: u64,
    pub received_messages: u64,
    pub received_outputs: u64,
    /// Results received inside the measurement window.
    pub window_messages: u64,
    /// Sent but never answered before the drain timeout.
    pub missing: u64,
    /// Answered with the wrong size, an unknown id or a lost timestamp.
    pub corrupted: u64,
    /// Answered with an error message.
    pub failed: u64,
    /// Times the session was resumed after losing its server.
    #[serde(default)]
    pub resumes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Throughput {
    /// Input payload bits per second whose results came back in the window
    /// (the seed's "throughput": data processed per second).
    pub input_bps: f64,
    /// Output payload bits per second received in the window.
    pub output_bps: f64,
    /// Input payload bits per second sent in the window (offered load).
    pub offered_input_bps: f64,
    /// Results per second received in the window.
    pub messages_per_s: f64,
    pub inputs_per_s: f64,
    /// Messages per second sent in the window.
    pub send_rate_hz: f64,
}

/// Reads the next frame during the handshake, failing on silence or close.
fn handshake_frame(r: &mut FrameReader<RecvHalf>, what: &str) -> Result<Frame> {
    match r.read_frame() {
        Ok(Some(f)) => Ok(f),
        Ok(None) => bail!("server closed the connection while waiting for {what}"),
        Err(e) if is_timeout(&e) => bail!("no {what} from the server in time"),
        Err(e) => Err(anyhow!(e)).context(format!("waiting for {what}")),
    }
}

pub(crate) fn validate(o: &UserBenchOptions) -> Result<()> {
    if (o.input_size as usize) < BENCH_ECHO_LEN || (o.output_size as usize) < BENCH_ECHO_LEN {
        bail!("the benchmarking configuration needs input and output sizes of at least {BENCH_ECHO_LEN} bytes");
    }
    if o.count == 0 {
        bail!("--count must be at least 1");
    }
    let msg = o.input_size as u64 * o.count as u64 + 4;
    let out = o.output_size as u64 * o.count as u64 + 4;
    if msg.max(out) > DEFAULT_MAX_MESSAGE as u64 {
        bail!(
            "a message of {} inputs of {} bytes exceeds the SMP limit of {} bytes",
            o.count,
            o.input_size,
            DEFAULT_MAX_MESSAGE
        );
    }
    if let Some(r) = o.rate_hz {
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate-hz must be a positive number");
        }
    }
    if o.duration.is_zero() {
        bail!("--duration must be positive");
    }
    Ok(())
}

impl UserReport {
    /// The report for a reader: configuration, throughput, latency,
    /// message counts, then the CPU lines.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let t = &self.throughput;
        let l = &self.latency;
        let k = &self.counts;
        format!(
            "{} inputs of {} per message -> {} outputs, delay {} us, {}{}\n\
             throughput: in {}  out {}  ({:.0} msg/s, {:.0} inputs/s; offered {})\n\
             latency ms: avg {:.3}  min {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  ({} samples)\n\
             messages: sent {}  received {}  missing {}  corrupted {}  failed {}{}\n{}",
            c.count,
            human_size(c.input_size as u64),
            human_size(c.output_size as u64),
            c.delay_us,
            match c.rate_hz {
                Some(hz) => format!("{hz} msg/s"),
                None => "unthrottled".into(),
            },
            match self.session.nodes {
                Some(n) => format!(", {n} node(s)"),
                None => String::new(),
            },
            human_bps(t.input_bps),
            human_bps(t.output_bps),
            t.messages_per_s,
            t.inputs_per_s,
            human_bps(t.offered_input_bps),
            l.avg_ms,
            l.min_ms,
            l.p50_ms,
            l.p90_ms,
            l.p99_ms,
            l.max_ms,
            l.samples,
            k.sent_messages,
            k.received_messages,
            k.missing,
            k.corrupted,
            k.failed,
            match k.resumes {
                0 => String::new(),
                n => format!("  resumes {n}"),
            },
            crate::cpu::summary(&self.cpu, (t.input_bps + t.output_bps) / 8.0)
        )
    }
}

/// Runs the benchmarking user against a server. Connection and configuration
/// failures are errors; problems with results are reported in
/// [`UserReport::ok`] and [`UserReport::errors`].
pub fn run(o: &UserBenchOptions) -> Result<UserReport> {
    validate(o)?;
    now_ns(); // pin the epoch before any timestamp is taken
    let addrs: Vec<String> = o
        .server
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if addrs.is_empty() {
        bail!("no server address in {:?}", o.server);
    }
    // The first address that answers; its failure is the error if none does.
    let mut first_err = None;
    let mut opened = None;
    for (i, a) in addrs.iter().enumerate() {
        match open_session(o, a) {
            Ok(s) => {
                opened = Some((i, s));
                break;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let Some((index, (stream, reader, session, initial_credit))) = opened else {
        return Err(first_err.expect("an address was tried"));
    };
    // Seed-format sessions are never resumed (docs: nothing to match a
    // resent message's answer to on the server's side).
    let reconnect = match (o.reconnect_timeout, o.legacy) {
        (Some(limit), false) => {
            let o = o.clone();
            Some(resume::reconnector(addrs, index, limit, move |a: &str| {
                open_session(&o, a).map(|(w, r, _, credit)| (w, r, credit))
            }))
        }
        _ => None,
    };
    measure(
        stream,
        reader,
        o,
        Measure {
            benchmark: "user",
            peer: o.server.clone(),
            session,
            initial_credit,
            window: None,
            reconnect,
        },
    )
}

/// Connects to `addr`, runs the hello (unless legacy) and sends the
/// benchmarking configuration: the connection, the session and the credit
/// granted before the configuration's answer.
fn open_session(
    o: &UserBenchOptions,
    server: &str,
) -> Result<(SendHalf, FrameReader<RecvHalf>, Session, u64)> {
    let addr = server
        .to_socket_addrs()
        .with_context(|| format!("resolving {server}"))?
        .next()
        .with_context(|| format!("{server} resolves to no address"))?;
    let stream = TcpStream::connect_timeout(&addr, o.connect_timeout)
        .with_context(|| format!("connecting to the server at {addr}"))?;
    stream.set_nodelay(true)?;
    if let Some(b) = o.send_buffer {
        socket2::SockRef::from(&stream)
            .set_send_buffer_size(b)
            .context("setting --send-buffer")?;
    }
    let (stream, rd) =
        corefarm_client::tls::split(o.tls.as_ref(), server, stream, Some(o.connect_timeout))
            .map_err(|e| anyhow::anyhow!("TLS with the server at {server}: {e}"))?;
    stream.tcp().set_read_timeout(Some(o.connect_timeout))?;
    let mut reader = FrameReader::new(rd, DEFAULT_MAX_MESSAGE);
    let mut writer = stream.try_clone()?;

    let mut session = Session::default();
    if !o.legacy {
        let mut h = Hello::new("user");
        h.name = Some("corefarm-bench".into());
        h.features = vec![features::ERROR.into(), features::CREDIT.into()];
        h.nodes = o.nodes;
        h.user = o.user.clone();
        if o.secret.is_some() {
            h.features.push(features::AUTH.into());
        }
        // With other servers to resume on, a server without nodes answers
        // at once, and the next address is tried.
        if o.reconnect_timeout.is_some() && o.server.contains(',') {
            h.features.push(features::MOVES_ON.into());
        }
        corefarm_smp::blocking::write_frame(&mut writer, h.to_frame())?;
        let mut f = handshake_frame(&mut reader, "the server's hello")?;
        if let (MsgType::AuthChallenge, Some(secret)) = (f.ty, &o.secret) {
            let ch = corefarm_smp::auth::AuthChallenge::parse(&f.payload)?;
            let answer = corefarm_smp::auth::AuthResponse::answer(secret, &ch, "user", &h.encode());
            corefarm_smp::blocking::write_frame(&mut writer, answer.to_frame())?;
            f = handshake_frame(&mut reader, "the server's hello")?;
        }
        match f.ty {
            MsgType::Hello => {
                let sh = Hello::decode(&f.payload)?;
                session.hello = true;
                session.nodes = sh.nodes;
                session.credit = sh.has(features::CREDIT);
                session.features = sh.features;
            }
            MsgType::Error => bail!("server refused the hello: {}", ErrorMsg::parse(&f.payload)?),
            t => bail!("server answered the hello with a {} message", t.name()),
        }
        if let (Some(want), Some(got)) = (o.nodes, session.nodes) {
            if got < want {
                bail!("server assigned {got} of the {want} nodes asked for");
            }
        }
    }

    let cfg = BenchmarkConfig {
        input_size: o.input_size,
        output_size: o.output_size,
        delay_us: o.delay_us,
    };
    corefarm_smp::blocking::write_frame(&mut writer, cfg.to_configuration().to_frame()?)?;
    let mut initial_credit = 0u64;
    let mut reason = None;
    loop {
        let f = handshake_frame(&mut reader, "the configuration response")?;
        match f.ty {
            MsgType::ConfigurationResponse => {
                let r = ConfigurationResponse::parse(&f.payload)?;
                if !r.ok() {
                    bail!(
                        "server rejected the benchmarking configuration (status {}){}",
                        r.status,
                        reason.map(|r| format!(": {r}")).unwrap_or_default()
                    );
                }
                break;
            }
            MsgType::Credit => initial_credit += Credit::parse(&f.payload)?.messages as u64,
            MsgType::Error => reason = Some(ErrorMsg::parse(&f.payload)?.to_string()),
            t => bail!("unexpected {} message during configuration", t.name()),
        }
    }
    Ok((stream, reader, session, initial_credit))
}

/// What differs between the users of [`measure`].
pub(crate) struct Measure<R> {
    /// The report's `benchmark` field.
    pub benchmark: &'static str,
    /// The report's `server` field: who was measured.
    pub peer: String,
    pub session: Session,
    /// Credits granted before the first data message (server credit).
    pub initial_credit: u64,
    /// Local bound on data messages in flight (no server credit): the sender
    /// starts with this many credits and the receiver returns one per result.
    pub window: Option<u32>,
    /// How to resume after a lost server (`None`: a lost server ends the run).
    pub reconnect: Option<resume::Reconnect<R>>,
}

/// The measured part of a run, on a configured connection: the sender and
/// receiver threads, the monitor, the report.
pub(crate) fn measure<R: std::io::Read + Send + 'static>(
    stream: impl Into<SendHalf>,
    mut reader: FrameReader<R>,
    o: &UserBenchOptions,
    m: Measure<R>,
) -> Result<UserReport> {
    let Measure {
        benchmark,
        peer,
        session,
        initial_credit,
        window: local_window,
        reconnect,
    } = m;
    let stream: SendHalf = stream.into();
    let writer = stream.try_clone()?;
    let initial_credit = initial_credit + local_window.map_or(0, u64::from);
    // From here on the receiver wakes up regularly to check the clock.
    stream.tcp().set_read_timeout(Some(POLL))?;

    let run = Arc::new(RunState {
        inflight: Mutex::new(HashMap::new()),
        credits: Mutex::new(initial_credit),
        credit_cv: Condvar::new(),
        sender_done: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        sent_msgs: AtomicU64::new(0),
        sent_inputs: AtomicU64::new(0),
        window_sent_msgs: AtomicU64::new(0),
        recv_msgs: AtomicU64::new(0),
        recv_outputs: AtomicU64::new(0),
        recv_in_bytes: AtomicU64::new(0),
        recv_out_bytes: AtomicU64::new(0),
        window_msgs: AtomicU64::new(0),
        window_in_bytes: AtomicU64::new(0),
        window_out_bytes: AtomicU64::new(0),
        tick_lat_ns: AtomicU64::new(0),
        tick_lat_n: AtomicU64::new(0),
        corrupted: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        local_credit: local_window.is_some(),
        link: Mutex::new(writer),
        link_gen: AtomicU64::new(0),
        resuming: AtomicBool::new(false),
        resumes: AtomicU64::new(0),
    });
    let t0 = now_ns();
    let window = Window {
        start: t0 + o.warmup.as_nanos() as u64,
        end: t0 + (o.warmup + o.duration).as_nanos() as u64,
    };
    let t0_at = Instant::now();
    let cpu = crate::cpu::CpuWatch::start(
        &o.cpu_watch,
        t0_at + o.warmup,
        t0_at + o.warmup + o.duration,
    );

    let paced = session.credit || local_window.is_some();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let sender = {
        let credit = session.credit || local_window.is_some();
        let (sh, o) = (run.clone(), o.clone());
        thread::Builder::new()
            .name("bench-send".into())
            .spawn(move || {
                let r = send_loop(&o, credit, t0, window, &sh);
                sh.sender_done.store(true, Ordering::Release);
                let _ = done_tx.send(());
                r
            })?
    };
    let receiver = {
        let (sh, o) = (run.clone(), o.clone());
        thread::Builder::new()
            .name("bench-recv".into())
            .spawn(move || {
                let mut hist = LatencyHistogram::new();
                let mut reconnect = reconnect;
                let resumable = reconnect.is_some();
                let paced = paced;
                let failed = loop {
                    match recv_loop(&mut reader, &o, window, &sh, &mut hist, resumable) {
                        Ok(Ended::Done) => break None,
                        Ok(Ended::Lost(why)) => match reconnect.as_mut() {
                            Some(r) => match resume::resume(r, &o, &sh, paced) {
                                Ok(new) => reader = new,
                                Err(e) => break Some(e),
                            },
                            None => break Some(anyhow!(why)),
                        },
                        Err(e) => break Some(e),
                    }
                };
                if let Some(e) = failed {
                    // After an abort, errors are just the socket being shut down.
                    if !sh.abort.swap(true, Ordering::AcqRel) {
                        sh.error(format!("receiving: {e:#}"));
                    }
                    sh.credit_cv.notify_all();
                }
                hist
            })?
    };

    // Monitor: progress once per second, then bounded waits for the sender
    // to stop and for the last results to arrive.
    let started = Instant::now();
    let mut last = Progress::default();
    let mut next_tick = started + Duration::from_secs(1);
    let mut send_deadline = Instant::now() + o.warmup + o.duration + o.drain_timeout;
    let mut drain_deadline = send_deadline; // the drain is bounded from the end of the window
    let mut sender_finished = false;
    loop {
        let now = Instant::now();
        // Time spent replacing a lost server is not the drain's: it is
        // bounded by the reconnect timeout, and the drain starts afresh.
        if run.resuming.load(Ordering::Acquire) {
            send_deadline = send_deadline.max(now + o.drain_timeout);
            drain_deadline = drain_deadline.max(now + o.drain_timeout);
        }
        if o.progress && now >= next_tick {
            last = print_progress(&run, last, started.elapsed());
            next_tick += Duration::from_secs(1);
        }
        if !sender_finished {
            match done_rx.recv_timeout(POLL.min(next_tick.saturating_duration_since(now))) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => sender_finished = true,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if !sender_finished && Instant::now() >= send_deadline {
                run.error("the sender was still blocked at the end of the drain timeout (is the server reading?)".into());
                break;
            }
            if run.abort.load(Ordering::Acquire) {
                break;
            }
            continue;
        }
        let outstanding = run.inflight.lock().unwrap_or_else(|p| p.into_inner()).len();
        if outstanding == 0 || run.abort.load(Ordering::Acquire) {
            break;
        }
        if Instant::now() >= drain_deadline {
            run.error(format!(
                "{outstanding} results still missing after the {:.1} s drain timeout",
                o.drain_timeout.as_secs_f64()
            ));
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    run.abort.store(true, Ordering::Release);
    run.credit_cv.notify_all();
    // Unblocks a sender stuck in write() and the receiver's read().
    let _ = stream.shutdown(Shutdown::Both);
    let _ = run
        .link
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .shutdown(Shutdown::Both);
    match sender.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => run.error(format!("sending: {e:#}")),
        Err(_) => run.error("the sending thread panicked".into()),
    }
    let lat = receiver.join().unwrap_or_else(|_| {
        run.error("the receiving thread panicked".into());
        LatencyHistogram::new()
    });
    let mut rep = build_report(o, session, window, &run, lat);
    rep.benchmark = benchmark.into();
    rep.server = peer;
    match cpu.finish() {
        Ok(c) => rep.cpu = c,
        Err(e) => {
            rep.errors.push(e.to_string());
            rep.ok = false;
        }
    }
    Ok(rep)
}
