//! The SMP echo benchmark of seed 000 §4.2.1: a server that sends every
//! message straight back, and clients that stream fixed-size data messages
//! at it and count what returns. It measures what the framing and the
//! loopback TCP stack can carry, the ceiling for any corefarm server.
//!
//! Both sides decode many frames per read and write many frames per
//! `writev`, and payloads are shared `Bytes` that are never copied after the
//! kernel put them in memory.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes};
use corefarm_smp::codec::Decoder;
use corefarm_smp::{MsgType, OutFrame, DEFAULT_MAX_MESSAGE};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::cpu::{CpuTarget, CpuUse, CpuWatch};
use crate::stats::{bits_per_second, human_bps, human_size};

/// Slices per `writev`: enough to batch dozens of small frames per syscall.
const IOV_BATCH: usize = 64;
/// Bytes a client keeps in flight per connection; bounded so that the end of
/// a run drains quickly and memory stays flat even for huge messages.
const WINDOW_BYTES: usize = 4 << 20;

/// Writes every frame in `frames` with gathered writes, popping them as they
/// complete. A frame is only put in a batch if both its slices fit, so bytes
/// always leave in order.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &mut VecDeque<OutFrame>,
) -> io::Result<()> {
    while !frames.is_empty() {
        let written = {
            let mut slices = [IoSlice::new(&[]); IOV_BATCH];
            let mut k = 0;
            for f in frames.iter() {
                if IOV_BATCH - k < 2 {
                    break;
                }
                k += f.chunks_vectored(&mut slices[k..]);
            }
            w.write_vectored(&slices[..k]).await?
        };
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut n = written;
        while n > 0 {
            let f = frames.front_mut().expect("wrote no more than queued");
            let r = f.remaining();
            if n >= r {
                n -= r;
                frames.pop_front();
            } else {
                f.advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}

/// Serves echo connections forever on `listener`.
pub async fn serve(listener: TcpListener) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            // A peer that sends garbage or disconnects only ends its own connection.
            let _ = echo_connection(stream).await;
        });
    }
}

async fn echo_connection(stream: TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    // Bounded: when the peer stops reading its echoes, we stop reading its
    // messages, and TCP pushes back on it.
    let (tx, mut rx) = mpsc::channel::<Vec<OutFrame>>(16);
    let writer = tokio::spawn(async move {
        let mut queue = VecDeque::new();
        while let Some(batch) = rx.recv().await {
            queue.extend(batch);
            while let Ok(more) = rx.try_recv() {
                queue.extend(more);
            }
            write_frames(&mut wr, &mut queue).await?;
        }
        wr.shutdown().await?;
        io::Result::Ok(())
    });
    let mut dec = Decoder::new(DEFAULT_MAX_MESSAGE);
    loop {
        if rd.read_buf(dec.buffer()).await? == 0 {
            break;
        }
        let mut batch = Vec::new();
        while let Some(f) = dec.decode()? {
            batch.push(OutFrame::new(f.ty, f.payload)?);
        }
        if !batch.is_empty() && tx.send(batch).await.is_err() {
            break;
        }
    }
    drop(tx);
    writer.await??;
    Ok(())
}

/// Parameters of an echo client run.
#[derive(Debug, Clone)]
pub struct EchoOptions {
    /// Echo server; `None` starts one in-process on 127.0.0.1:0.
    pub addr: Option<String>,
    /// Data bytes per message (after the 4-byte id).
    pub size: usize,
    /// Concurrent client connections.
    pub clients: usize,
    /// Measured time, after the warm-up.
    pub duration: Duration,
    pub warmup: Duration,
    /// Compare every echoed byte with what was sent.
    pub verify: bool,
    /// Processes (the echo server) whose CPU time is sampled at the start
    /// and the end of the measurement window; reported in `cpu`.
    pub cpu_watch: Vec<CpuTarget>,
}

impl Default for EchoOptions {
    fn default() -> Self {
        EchoOptions {
            addr: None,
            size: 1024,
            clients: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_millis(500),
            verify: true,
            cpu_watch: Vec::new(),
        }
    }
}

/// Result of an echo run (`corefarm bench echo --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EchoReport {
    pub benchmark: String,
    pub size: usize,
    pub clients: usize,
    /// Length of the measurement window in seconds.
    pub window_s: f64,
    /// Messages and payload bytes echoed back inside the window, all clients.
    pub messages: u64,
    pub bytes: u64,
    /// Echoed payload bits per second (one direction), all clients together.
    pub throughput_bps: f64,
    pub messages_per_s: f64,
    /// Messages over the whole run, warm-up and drain included.
    pub total_messages: u64,
    /// Echoes that were wrong (bad id, size or content) or never came back.
    pub errors: u64,
    #[serde(default)]
    pub error_samples: Vec<String>,
    /// CPU of the `cpu_watch` processes inside the window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu: Vec<CpuUse>,
}

impl EchoReport {
    /// The report for a reader: a line on throughput, then the CPU lines.
    pub fn summary(&self) -> String {
        format!(
            "echo {} x {} client(s): {} ({:.0} msg/s) over {:.1} s, {} errors\n{}",
            human_size(self.size as u64),
            self.clients,
            human_bps(self.throughput_bps),
            self.messages_per_s,
            self.window_s,
            self.errors,
            crate::cpu::summary(&self.cpu, self.bytes as f64 / self.window_s)
        )
    }
}

/// Serves echoes on `listen` until Ctrl-C, on a runtime of its own;
/// `listening` hears the bound address first.
pub fn serve_until_interrupted(listen: &str, listening: impl FnOnce(SocketAddr)) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let l = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        listening(l.local_addr()?);
        tokio::select! {
            r = serve(l) => r.context("echo server")?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

/// The clients' counters over the measurement window, and the samples of what
/// went wrong.
struct Tally {
    window_start: Instant,
    window_end: Instant,
    stop: AtomicBool,
    messages: AtomicU64,
    bytes: AtomicU64,
    total: AtomicU64,
    errors: AtomicU64,
    samples: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() < 10 {
            s.push(what);
        }
    }
}

/// Runs the echo clients (and, without an address, the server) on a fresh
/// multi-threaded runtime.
pub fn run(opts: &EchoOptions) -> Result<EchoReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(opts))
}

pub async fn run_async(opts: &EchoOptions) -> Result<EchoReport> {
    if opts.clients == 0 {
        bail!("need at least one client");
    }
    if opts.size + 4 > DEFAULT_MAX_MESSAGE as usize {
        bail!(
            "size {} exceeds the SMP message limit of {} bytes",
            opts.size,
            DEFAULT_MAX_MESSAGE - 4
        );
    }
    let (addr, server) = match &opts.addr {
        Some(a) => (
            tokio::net::lookup_host(a)
                .await?
                .next()
                .with_context(|| format!("cannot resolve {a}"))?,
            None,
        ),
        None => {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            let a = l.local_addr()?;
            (a, Some(tokio::spawn(serve(l))))
        }
    };
    let result = run_clients(addr, opts).await;
    if let Some(s) = server {
        s.abort();
    }
    result
}

async fn run_clients(addr: SocketAddr, opts: &EchoOptions) -> Result<EchoReport> {
    let mut data = vec![0u8; opts.size];
    rand::thread_rng().fill_bytes(&mut data);
    let payload = Bytes::from(data);
    let start = Instant::now();
    let tally = Arc::new(Tally {
        window_start: start + opts.warmup,
        window_end: start + opts.warmup + opts.duration,
        stop: AtomicBool::new(false),
        messages: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        total: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        samples: Default::default(),
    });
    let cpu = CpuWatch::start(&opts.cpu_watch, tally.window_start, tally.window_end);
    let mut conns = Vec::new();
    for _ in 0..opts.clients {
        let s = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to echo server {addr}"))?;
        s.set_nodelay(true)?;
        conns.push(s);
    }
    let mut tasks = Vec::new();
    for s in conns {
        tasks.push(tokio::spawn(client(
            s,
            payload.clone(),
            opts.verify,
            tally.clone(),
        )));
    }
    tokio::time::sleep_until((tally.window_end).into()).await;
    tally.stop.store(true, Ordering::Relaxed);
    // Outstanding echoes are bounded by the window, so the drain is short;
    // a server that stopped answering turns into an error, not a hang.
    let drain = Duration::from_secs(10) + opts.duration;
    for t in tasks {
        match tokio::time::timeout(drain, t).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tally.error(format!("client failed: {e:#}")),
            Ok(Err(e)) => tally.error(format!("client task panicked: {e}")),
            Err(_) => tally.error("echoes still missing after the drain timeout".into()),
        }
    }
    // The sampler took its last reading at the window's end, before the drain.
    let cpu = cpu.finish().unwrap_or_else(|e| {
        tally.error(e.to_string());
        Vec::new()
    });
    let window = opts.duration.as_secs_f64();
    let messages = tally.messages.load(Ordering::Relaxed);
    let bytes = tally.bytes.load(Ordering::Relaxed);
    let samples = tally
        .samples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(EchoReport {
        benchmark: "echo".into(),
        size: opts.size,
        clients: opts.clients,
        window_s: window,
        messages,
        bytes,
        throughput_bps: bits_per_second(bytes, window),
        messages_per_s: messages as f64 / window,
        total_messages: tally.total.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        error_samples: samples,
        cpu,
    })
}

/// One connection: a sending task limited by a window of in-flight
/// messages, and this task receiving and checking the echoes.
async fn client(stream: TcpStream, payload: Bytes, verify: bool, sh: Arc<Tally>) -> Result<()> {
    let (rd, mut wr) = stream.into_split();
    let window = (WINDOW_BYTES / (payload.len() + 12)).clamp(2, 1024);
    let credit = Arc::new(Semaphore::new(window));
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let (credit, sent, sh, payload) =
            (credit.clone(), sent.clone(), sh.clone(), payload.clone());
        tokio::spawn(async move {
            let mut queue = VecDeque::new();
            let mut id: u32 = 0;
            while !sh.stop.load(Ordering::Relaxed) {
                credit.acquire().await?.forget();
                let mut n = 1;
                // Take whatever else the window allows, to batch the writev.
                while n < IOV_BATCH / 2 {
                    match credit.try_acquire() {
                        Ok(p) => p.forget(),
                        Err(_) => break,
                    }
                    n += 1;
                }
                for _ in 0..n {
                    queue.push_back(OutFrame::data(id, payload.clone())?);
                    id = id.wrapping_add(1);
                }
                sent.fetch_add(n as u64, Ordering::Release);
                write_frames(&mut wr, &mut queue).await?;
            }
            anyhow::Ok(())
        })
    };
    let received = receive_echoes(rd, &payload, verify, &credit, &sent, &sh).await;
    sender.abort();
    received
}

async fn receive_echoes<R: AsyncRead + Unpin>(
    mut rd: R,
    payload: &Bytes,
    verify: bool,
    credit: &Semaphore,
    sent: &AtomicU64,
    sh: &Tally,
) -> Result<()> {
    let mut dec = Decoder::new(DEFAULT_MAX_MESSAGE);
    let mut expect: u32 = 0;
    let mut got: u64 = 0;
    loop {
        // Done once the sender has stopped and every message it sent is back.
        if sh.stop.load(Ordering::Relaxed) && got >= sent.load(Ordering::Acquire) {
            return Ok(());
        }
        let read = tokio::time::timeout(Duration::from_millis(100), rd.read_buf(dec.buffer()));
        match read.await {
            Err(_) => continue,
            Ok(Ok(0)) => {
                let missing = sent.load(Ordering::Acquire) - got;
                if missing > 0 {
                    bail!("server closed the connection with {missing} echoes missing");
                }
                return Ok(());
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
        let now = Instant::now();
        let in_window = now >= sh.window_start && now < sh.window_end;
        let (mut msgs, mut bytes) = (0u64, 0u64);
        while let Some(f) = dec.decode()? {
            got += 1;
            msgs += 1;
            let body = f.payload.len().saturating_sub(4) as u64;
            bytes += body;
            if f.ty != MsgType::Data || f.payload.len() != payload.len() + 4 {
                sh.error(format!(
                    "echo {expect}: got a {} message of {} bytes",
                    f.ty.name(),
                    f.payload.len()
                ));
            } else {
                let id = u32::from_le_bytes(f.payload[..4].try_into().expect("4 bytes"));
                if id != expect {
                    sh.error(format!("expected echo {expect}, got id {id}"));
                } else if verify && f.payload[4..] != payload[..] {
                    sh.error(format!("echo {id}: payload differs from what was sent"));
                }
            }
            expect = expect.wrapping_add(1);
        }
        credit.add_permits(msgs as usize);
        sh.total.fetch_add(msgs, Ordering::Relaxed);
        if in_window {
            sh.messages.fetch_add(msgs, Ordering::Relaxed);
            sh.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_frames_keeps_order_across_partial_writes() {
        // A tiny duplex forces many partial writes through the batching logic.
        let (mut a, b) = tokio::io::duplex(97);
        let reader = tokio::spawn(async move {
            let mut r = corefarm_smp::codec::FrameReader::new(b, 1 << 20);
            let mut out = Vec::new();
            while let Some(f) = r.read_frame().await.unwrap() {
                out.push(f.payload);
            }
            out
        });
        let mut q: VecDeque<OutFrame> = (0..200u32)
            .map(|i| OutFrame::data(i, Bytes::from(vec![i as u8; (i as usize * 7) % 300])).unwrap())
            .collect();
        write_frames(&mut a, &mut q).await.unwrap();
        assert!(q.is_empty());
        drop(a);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), 200);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(&p[..4], &(i as u32).to_le_bytes());
            assert_eq!(p.len(), 4 + (i * 7) % 300);
            assert!(p[4..].iter().all(|&b| b == i as u8));
        }
    }

    /// A server that corrupts one byte of every echo: the client must notice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn corrupted_echoes_are_counted() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (rd, mut wr) = s.into_split();
            let mut r = corefarm_smp::codec::FrameReader::new(rd, 1 << 20);
            while let Ok(Some(f)) = r.read_frame().await {
                let mut p = f.payload.to_vec();
                let last = p.len() - 1;
                p[last] ^= 0xFF;
                let frame = OutFrame::new(f.ty, Bytes::from(p)).unwrap();
                if corefarm_smp::codec::write_frame(&mut wr, frame)
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        let opts = EchoOptions {
            addr: Some(addr.to_string()),
            size: 64,
            clients: 1,
            duration: Duration::from_millis(200),
            warmup: Duration::from_millis(50),
            verify: true,
            cpu_watch: Vec::new(),
        };
        let rep = run_async(&opts).await.unwrap();
        server.abort();
        assert!(rep.total_messages > 0);
        assert_eq!(rep.errors, rep.total_messages);
        assert!(rep.error_samples[0].contains("payload differs"));
    }
}
