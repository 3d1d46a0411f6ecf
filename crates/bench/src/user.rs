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
use crate::stats::{bits_per_second, human_bps, LatencyHistogram, LatencySummary};

/// Most error descriptions kept in a report; the counters hold the totals.
const MAX_ERROR_SAMPLES: usize = 20;
/// How often blocked loops wake up to look at the clock and the stop flags.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct UserBenchOptions {
    /// The server's user port.
    pub server: String,
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
    /// TLS to the user port (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<corefarm_smp::tls::ClientTls>,
}

impl Default for UserBenchOptions {
    fn default() -> Self {
        UserBenchOptions {
            server: "127.0.0.1:9999".into(),
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

struct InFlight {
    ts: u64,
    count: u32,
}

/// State shared by the sending loop, the receiving loop and the monitor.
struct Shared {
    inflight: Mutex<HashMap<u32, InFlight>>,
    credits: Mutex<u64>,
    credit_cv: Condvar,
    /// Set once the sender has left its loop.
    sender_done: AtomicBool,
    /// Set to make every loop return now.
    abort: AtomicBool,
    sent_msgs: AtomicU64,
    sent_inputs: AtomicU64,
    window_sent_msgs: AtomicU64,
    recv_msgs: AtomicU64,
    recv_outputs: AtomicU64,
    recv_in_bytes: AtomicU64,
    recv_out_bytes: AtomicU64,
    window_msgs: AtomicU64,
    window_in_bytes: AtomicU64,
    window_out_bytes: AtomicU64,
    /// Latency sum/count since the last progress line.
    tick_lat_ns: AtomicU64,
    tick_lat_n: AtomicU64,
    corrupted: AtomicU64,
    failed: AtomicU64,
    errors: Mutex<Vec<String>>,
    /// Every result (or per-message error) returns one credit to the sender:
    /// a local window instead of server credit.
    local_credit: bool,
}

impl Shared {
    fn return_credit(&self) {
        if self.local_credit {
            *self.credits.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            self.credit_cv.notify_one();
        }
    }

    fn error(&self, e: String) {
        let mut v = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < MAX_ERROR_SAMPLES {
            v.push(e);
        }
    }

    fn corrupt(&self, e: String) {
        self.corrupted.fetch_add(1, Ordering::Relaxed);
        self.error(e);
    }
}

/// Clock points of a run, in `now_ns()` nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: u64,
    end: u64,
}

impl Window {
    fn contains(&self, t: u64) -> bool {
        t >= self.start && t < self.end
    }
}

/// Writes the 16-byte tag of input `index` of message `id`.
fn stamp(input: &mut [u8], ts: u64, id: u32, index: u32) {
    input[..8].copy_from_slice(&ts.to_le_bytes());
    input[8..12].copy_from_slice(&id.to_le_bytes());
    input[12..16].copy_from_slice(&index.to_le_bytes());
}

/// Checks one result against what was sent. Returns a description of the
/// first problem, if any.
fn check_result(data: &[u8], id: u32, sent: &InFlight, output_size: u32) -> Option<String> {
    let want = sent.count as usize * output_size as usize;
    if data.len() != want {
        return Some(format!(
            "result {id}: {} bytes, expected {} outputs of {} bytes",
            data.len(),
            sent.count,
            output_size
        ));
    }
    let mut tag = [0u8; BENCH_ECHO_LEN];
    for (i, out) in data.chunks_exact(output_size as usize).enumerate() {
        stamp(&mut tag, sent.ts, id, i as u32);
        if out[..BENCH_ECHO_LEN] != tag {
            return Some(format!(
                "result {id}: output {i} does not carry its input's timestamp"
            ));
        }
    }
    None
}

fn is_timeout(e: &ReadError) -> bool {
    matches!(e, ReadError::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
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

/// Runs the benchmarking user against a server. Connection and configuration
/// failures are errors; problems with results are reported in
/// [`UserReport::ok`] and [`UserReport::errors`].
pub fn run(o: &UserBenchOptions) -> Result<UserReport> {
    validate(o)?;
    now_ns(); // pin the epoch before any timestamp is taken
    let addr = o
        .server
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", o.server))?
        .next()
        .with_context(|| format!("{} resolves to no address", o.server))?;
    let stream = TcpStream::connect_timeout(&addr, o.connect_timeout)
        .with_context(|| format!("connecting to the server at {addr}"))?;
    stream.set_nodelay(true)?;
    if let Some(b) = o.send_buffer {
        socket2::SockRef::from(&stream)
            .set_send_buffer_size(b)
            .context("setting --send-buffer")?;
    }
    let (stream, rd) =
        corefarm_client::tls::split(o.tls.as_ref(), &o.server, stream, Some(o.connect_timeout))
            .map_err(|e| anyhow::anyhow!("TLS with the server at {}: {e}", o.server))?;
    stream.tcp().set_read_timeout(Some(o.connect_timeout))?;
    let mut reader = FrameReader::new(rd, DEFAULT_MAX_MESSAGE);
    let mut writer = stream.try_clone()?;

    let mut session = Session::default();
    if !o.legacy {
        let mut h = Hello::new("user");
        h.name = Some("corefarm-bench".into());
        h.features = vec![features::ERROR.into(), features::CREDIT.into()];
        h.nodes = o.nodes;
        if o.secret.is_some() {
            h.features.push(features::AUTH.into());
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
        },
    )
}

/// What differs between the users of [`measure`].
pub(crate) struct Measure {
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
}

/// The measured part of a run, on a configured connection: the sender and
/// receiver threads, the monitor, the report.
pub(crate) fn measure<R: std::io::Read + Send + 'static>(
    stream: impl Into<SendHalf>,
    mut reader: FrameReader<R>,
    o: &UserBenchOptions,
    m: Measure,
) -> Result<UserReport> {
    let Measure {
        benchmark,
        peer,
        session,
        initial_credit,
        window: local_window,
    } = m;
    let stream: SendHalf = stream.into();
    let mut writer = stream.try_clone()?;
    let initial_credit = initial_credit + local_window.map_or(0, u64::from);
    // From here on the receiver wakes up regularly to check the clock.
    stream.tcp().set_read_timeout(Some(POLL))?;

    let shared = Arc::new(Shared {
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

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let sender = {
        let credit = session.credit || local_window.is_some();
        let (sh, o) = (shared.clone(), o.clone());
        thread::Builder::new()
            .name("bench-send".into())
            .spawn(move || {
                let r = send_loop(&mut writer, &o, credit, t0, window, &sh);
                sh.sender_done.store(true, Ordering::Release);
                let _ = done_tx.send(());
                r
            })?
    };
    let receiver = {
        let (sh, o) = (shared.clone(), o.clone());
        thread::Builder::new()
            .name("bench-recv".into())
            .spawn(move || {
                let mut hist = LatencyHistogram::new();
                if let Err(e) = recv_loop(&mut reader, &o, window, &sh, &mut hist) {
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
    let send_deadline = Instant::now() + o.warmup + o.duration + o.drain_timeout;
    let drain_deadline = send_deadline; // the drain is bounded from the end of the window
    let mut sender_finished = false;
    loop {
        let now = Instant::now();
        if o.progress && now >= next_tick {
            last = print_progress(&shared, last, started.elapsed());
            next_tick += Duration::from_secs(1);
        }
        if !sender_finished {
            match done_rx.recv_timeout(POLL.min(next_tick.saturating_duration_since(now))) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => sender_finished = true,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if !sender_finished && Instant::now() >= send_deadline {
                shared.error("the sender was still blocked at the end of the drain timeout (is the server reading?)".into());
                break;
            }
            if shared.abort.load(Ordering::Acquire) {
                break;
            }
            continue;
        }
        let outstanding = shared
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        if outstanding == 0 || shared.abort.load(Ordering::Acquire) {
            break;
        }
        if Instant::now() >= drain_deadline {
            shared.error(format!(
                "{outstanding} results still missing after the {:.1} s drain timeout",
                o.drain_timeout.as_secs_f64()
            ));
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    shared.abort.store(true, Ordering::Release);
    shared.credit_cv.notify_all();
    // Unblocks a sender stuck in write() and the receiver's read().
    let _ = stream.shutdown(Shutdown::Both);
    match sender.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => shared.error(format!("sending: {e:#}")),
        Err(_) => shared.error("the sending thread panicked".into()),
    }
    let lat = receiver.join().unwrap_or_else(|_| {
        shared.error("the receiving thread panicked".into());
        LatencyHistogram::new()
    });
    let mut rep = build_report(o, session, window, &shared, lat);
    rep.benchmark = benchmark.into();
    rep.server = peer;
    match cpu.finish() {
        Ok(c) => rep.cpu = c,
        Err(e) => {
            rep.errors.push(e);
            rep.ok = false;
        }
    }
    Ok(rep)
}

fn send_loop(
    w: &mut SendHalf,
    o: &UserBenchOptions,
    credit: bool,
    t0: u64,
    win: Window,
    sh: &Shared,
) -> Result<()> {
    let in_size = o.input_size as usize;
    // One buffer for the whole run: random once, then only the 16-byte tags
    // change, so generating inputs costs almost nothing.
    let mut buf = vec![0u8; in_size * o.count as usize];
    rand::thread_rng().fill_bytes(&mut buf);
    let period_ns = o.rate_hz.map(|hz| 1e9 / hz);
    let mut id: u32 = 0;
    let mut k: u64 = 0;
    loop {
        if sh.abort.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = now_ns();
        if let Some(p) = period_ns {
            // Absolute deadlines: a late send is followed by an early one, so
            // the average rate is exact even though sleeps overshoot.
            let deadline = t0 + (k as f64 * p) as u64;
            if deadline >= win.end {
                return Ok(());
            }
            if deadline > now {
                thread::sleep(Duration::from_nanos(deadline - now));
            }
        } else if now >= win.end {
            return Ok(());
        }
        if credit {
            let mut c = sh.credits.lock().unwrap_or_else(|p| p.into_inner());
            while *c == 0 {
                if sh.abort.load(Ordering::Acquire) || now_ns() >= win.end {
                    return Ok(());
                }
                c = sh
                    .credit_cv
                    .wait_timeout(c, POLL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *c -= 1;
        }
        let ts = now_ns();
        for (i, input) in buf.chunks_exact_mut(in_size).enumerate() {
            stamp(input, ts, id, i as u32);
        }
        // Registered before the write: the result may come back before
        // write() returns.
        sh.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, InFlight { ts, count: o.count });
        sh.sent_msgs.fetch_add(1, Ordering::Relaxed);
        sh.sent_inputs.fetch_add(o.count as u64, Ordering::Relaxed);
        if win.contains(ts) {
            sh.window_sent_msgs.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = write_data_borrowed(w, id, &buf) {
            if sh.abort.load(Ordering::Acquire) {
                return Ok(());
            }
            return Err(e).context("writing a data message");
        }
        id = id.wrapping_add(1);
        k += 1;
    }
}

fn recv_loop<R: std::io::Read>(
    r: &mut FrameReader<R>,
    o: &UserBenchOptions,
    win: Window,
    sh: &Shared,
    hist: &mut LatencyHistogram,
) -> Result<()> {
    let done = || {
        sh.sender_done.load(Ordering::Acquire)
            && sh
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    };
    loop {
        let f = match r.read_frame() {
            Ok(Some(f)) => f,
            Ok(None) if done() => return Ok(()),
            Ok(None) => bail!("the server closed the connection"),
            Err(e) if is_timeout(&e) => {
                if sh.abort.load(Ordering::Acquire) || done() {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match f.ty {
            MsgType::Data => {
                let now = now_ns();
                let d = match Data::parse(f.payload) {
                    Ok(d) => d,
                    Err(e) => {
                        sh.corrupt(format!("malformed result: {e}"));
                        continue;
                    }
                };
                let sent = sh
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&d.id);
                let Some(sent) = sent else {
                    sh.corrupt(format!("result with unknown or repeated id {}", d.id));
                    continue;
                };
                sh.return_credit();
                let (in_bytes, out_bytes) =
                    (sent.count as u64 * o.input_size as u64, d.data.len() as u64);
                sh.recv_msgs.fetch_add(1, Ordering::Relaxed);
                sh.recv_outputs.fetch_add(
                    d.data.len() as u64 / o.output_size as u64,
                    Ordering::Relaxed,
                );
                sh.recv_in_bytes.fetch_add(in_bytes, Ordering::Relaxed);
                sh.recv_out_bytes.fetch_add(out_bytes, Ordering::Relaxed);
                if let Some(e) = check_result(&d.data, d.id, &sent, o.output_size) {
                    sh.corrupt(e);
                    continue;
                }
                let lat = now.saturating_sub(sent.ts);
                sh.tick_lat_ns.fetch_add(lat, Ordering::Relaxed);
                sh.tick_lat_n.fetch_add(1, Ordering::Relaxed);
                if win.contains(sent.ts) {
                    hist.record(lat);
                }
                if win.contains(now) {
                    sh.window_msgs.fetch_add(1, Ordering::Relaxed);
                    sh.window_in_bytes.fetch_add(in_bytes, Ordering::Relaxed);
                    sh.window_out_bytes.fetch_add(out_bytes, Ordering::Relaxed);
                }
            }
            MsgType::Credit => match Credit::parse(&f.payload) {
                Ok(c) => {
                    *sh.credits.lock().unwrap_or_else(|p| p.into_inner()) += c.messages as u64;
                    sh.credit_cv.notify_one();
                }
                Err(e) => sh.corrupt(format!("malformed credit: {e}")),
            },
            MsgType::Error => {
                let e = ErrorMsg::parse(&f.payload)
                    .map_err(|e| anyhow!("malformed error message: {e}"))?;
                if e.id == ErrorMsg::NO_ID {
                    bail!("server error: {e}");
                }
                if sh
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&e.id)
                    .is_some()
                {
                    sh.return_credit();
                }
                sh.failed.fetch_add(1, Ordering::Relaxed);
                sh.error(format!("server error: {e}"));
            }
            t => sh.corrupt(format!("unexpected {} message from the server", t.name())),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    sent: u64,
    recv: u64,
    in_bytes: u64,
    out_bytes: u64,
    at: Duration,
}

fn print_progress(sh: &Shared, last: Progress, at: Duration) -> Progress {
    let now = Progress {
        sent: sh.sent_msgs.load(Ordering::Relaxed),
        recv: sh.recv_msgs.load(Ordering::Relaxed),
        in_bytes: sh.recv_in_bytes.load(Ordering::Relaxed),
        out_bytes: sh.recv_out_bytes.load(Ordering::Relaxed),
        at,
    };
    let dt = (now.at - last.at).as_secs_f64().max(1e-9);
    let n = sh.tick_lat_n.swap(0, Ordering::Relaxed);
    let lat = sh.tick_lat_ns.swap(0, Ordering::Relaxed);
    let inflight = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).len();
    eprintln!(
        "[{:>4.0} s] sent {:.0} msg/s, done {:.0} msg/s, in {}, out {}, latency {}, in flight {}",
        at.as_secs_f64(),
        (now.sent - last.sent) as f64 / dt,
        (now.recv - last.recv) as f64 / dt,
        human_bps(bits_per_second(now.in_bytes - last.in_bytes, dt)),
        human_bps(bits_per_second(now.out_bytes - last.out_bytes, dt)),
        if n > 0 {
            format!("{:.2} ms", lat as f64 / n as f64 / 1e6)
        } else {
            "-".into()
        },
        inflight
    );
    now
}

fn build_report(
    o: &UserBenchOptions,
    session: Session,
    win: Window,
    sh: &Shared,
    lat: LatencyHistogram,
) -> UserReport {
    let secs = (win.end - win.start) as f64 / 1e9;
    let missing = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counts = Counts {
        sent_messages: ld(&sh.sent_msgs),
        sent_inputs: ld(&sh.sent_inputs),
        received_messages: ld(&sh.recv_msgs),
        received_outputs: ld(&sh.recv_outputs),
        window_messages: ld(&sh.window_msgs),
        missing,
        corrupted: ld(&sh.corrupted),
        failed: ld(&sh.failed),
    };
    let msg_bytes = o.input_size as u64 * o.count as u64;
    let throughput = Throughput {
        input_bps: bits_per_second(ld(&sh.window_in_bytes), secs),
        output_bps: bits_per_second(ld(&sh.window_out_bytes), secs),
        offered_input_bps: bits_per_second(ld(&sh.window_sent_msgs) * msg_bytes, secs),
        messages_per_s: counts.window_messages as f64 / secs,
        inputs_per_s: (counts.window_messages * o.count as u64) as f64 / secs,
        send_rate_hz: ld(&sh.window_sent_msgs) as f64 / secs,
    };
    let mut errors = sh.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if missing > 0 && !errors.iter().any(|e| e.contains("missing")) {
        errors.push(format!("{missing} results never came back"));
    }
    if counts.window_messages == 0 {
        errors.push("no result arrived inside the measurement window".into());
    }
    let ok = errors.is_empty() && missing == 0 && counts.corrupted == 0 && counts.failed == 0;
    UserReport {
        benchmark: "user".into(),
        ok,
        errors,
        server: o.server.clone(),
        config: RunConfig {
            input_size: o.input_size,
            output_size: o.output_size,
            delay_us: o.delay_us,
            count: o.count,
            message_bytes: msg_bytes,
            duration_s: o.duration.as_secs_f64(),
            warmup_s: o.warmup.as_secs_f64(),
            rate_hz: o.rate_hz,
            nodes_requested: o.nodes,
            legacy: o.legacy,
        },
        session,
        window_s: secs,
        counts,
        throughput,
        latency: lat.summary(),
        cpu: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_check_accepts_echoed_tags_only() {
        let sent = InFlight {
            ts: 123_456_789,
            count: 3,
        };
        let mut out = vec![0xAAu8; 3 * 20];
        for (i, o) in out.chunks_exact_mut(20).enumerate() {
            stamp(o, sent.ts, 7, i as u32);
        }
        assert_eq!(check_result(&out, 7, &sent, 20), None);
        // Wrong size.
        assert!(check_result(&out[..40], 7, &sent, 20)
            .unwrap()
            .contains("expected 3 outputs"));
        // Timestamp of the second output not echoed.
        let mut bad = out.clone();
        bad[20] ^= 1;
        assert!(check_result(&bad, 7, &sent, 20)
            .unwrap()
            .contains("output 1"));
        // Outputs swapped between messages (ids differ).
        assert!(check_result(&out, 8, &sent, 20).is_some());
    }

    #[test]
    fn options_are_validated() {
        let mut o = UserBenchOptions {
            input_size: 8,
            ..Default::default()
        };
        assert!(validate(&o).is_err());
        o.input_size = 16;
        assert!(validate(&o).is_ok());
        o.count = 0;
        assert!(validate(&o).is_err());
        o.count = 1 << 20;
        o.input_size = 1 << 10;
        assert!(validate(&o).unwrap_err().to_string().contains("SMP limit"));
        o.count = 1;
        o.rate_hz = Some(0.0);
        assert!(validate(&o).is_err());
    }
}
