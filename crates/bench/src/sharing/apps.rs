//! The emulated applications, one per variant: each runs its calls in
//! order and returns how many inputs it computed on its own CPU.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ConfigurationResponse, Data, ErrorMsg, Hello, MsgType,
    OutFrame,
};

use super::soft::{spin, SoftCore};
use super::{delay_us, Call};

/// Bytes per input and per output (the benchmarking configuration's minimum).
const SIZE: u32 = 16;

pub(super) fn config(f: u32) -> BenchmarkConfig {
    BenchmarkConfig {
        input_size: SIZE,
        output_size: SIZE,
        delay_us: delay_us(f),
    }
}

/// Splits `inputs` into at most `parts` messages of whole inputs.
pub(super) fn messages(inputs: u32, parts: u32) -> Vec<Bytes> {
    let per = inputs.div_ceil(parts.clamp(1, inputs.max(1)));
    let mut out = Vec::new();
    let mut sent = 0;
    while sent < inputs {
        let n = per.min(inputs - sent);
        out.push(Bytes::from(vec![0u8; (SIZE * n) as usize]));
        sent += n;
    }
    out
}

/// How the software path costs a call: spin iterations per input of `f`.
#[derive(Clone, Copy)]
pub struct Software {
    /// Calibrated iterations per microsecond.
    pub iters_per_us: f64,
    /// Software time per input over node time per input (0: no software path).
    pub speedup: f64,
}

impl Software {
    pub fn iters(&self, f: u32) -> u64 {
        (self.iters_per_us * self.speedup * delay_us(f) as f64).round() as u64
    }

    fn run(&self, f: u32, inputs: u32) -> Result<()> {
        if self.speedup <= 0.0 {
            bail!("function {f} has no software path (--speedup 0)");
        }
        spin(self.iters(f) * inputs as u64);
        Ok(())
    }
}

pub struct Conn {
    pub(super) w: TcpStream,
    r: FrameReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr, nodes: Option<u32>) -> Result<Conn> {
        Conn::open_as(addr, nodes, true)
    }

    /// `errors`: ask for the server's error lines (printed as they come);
    /// a user that retries a refused configuration does without them.
    pub(super) fn open_as(addr: SocketAddr, nodes: Option<u32>, errors: bool) -> Result<Conn> {
        let s = TcpStream::connect(addr).context("connecting to the embedded cluster")?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        s.set_nodelay(true)?;
        let mut c = Conn {
            w: s.try_clone()?,
            r: FrameReader::new(s, 1 << 30),
        };
        let mut h = Hello::new("user");
        h.name = Some("bench sharing".into());
        h.features = vec![features::STATUS.into()];
        if errors {
            h.features.push(features::ERROR.into());
        }
        h.nodes = nodes;
        write_frame(&mut c.w, h.to_frame())?;
        c.next(MsgType::Hello)?;
        Ok(c)
    }

    pub(super) fn next(&mut self, want: MsgType) -> Result<corefarm_smp::Frame> {
        loop {
            let f = self
                .r
                .read_frame()?
                .context("the server closed the connection")?;
            match f.ty {
                t if t == want => return Ok(f),
                MsgType::Error => eprintln!("server: {}", ErrorMsg::parse(&f.payload)?),
                other => bail!("unexpected {} from the server", other.name()),
            }
        }
    }

    pub(super) fn configure(&mut self, f: u32) -> Result<()> {
        if !self.try_configure(&config(f))? {
            bail!("configuration of function {f} refused");
        }
        Ok(())
    }

    /// Configures `cfg`; `false` when the server refused it (in exclusive
    /// mode: no node became free within `--node-wait`).
    pub(super) fn try_configure(&mut self, cfg: &BenchmarkConfig) -> Result<bool> {
        write_frame(&mut self.w, cfg.to_configuration().to_frame()?)?;
        let r = self.next(MsgType::ConfigurationResponse)?;
        Ok(ConfigurationResponse::parse(&r.payload)?.ok())
    }
}

pub fn status(addr: SocketAddr) -> Result<corefarm_smp::ClusterStatus> {
    let mut c = Conn::open(addr, Some(0))?;
    write_frame(&mut c.w, corefarm_smp::ClusterStatus::request_frame())?;
    let f = c.next(MsgType::Status)?;
    Ok(corefarm_smp::ClusterStatus::decode(&f.payload)?)
}

/// Polls the status until `n` nodes are connected (there is no push
/// notification for node arrival; the poll is bounded).
pub fn wait_nodes(addr: SocketAddr, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(addr)?.nodes.len() < n {
        if Instant::now() > deadline {
            bail!("the simulated nodes did not connect");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `exclusive` (`nodes`: this application's share) and `shared`: its calls
/// in order, configuring when the function changes, each call split into
/// `jobs` messages, waiting for all results.
pub fn cluster(addr: SocketAddr, nodes: Option<u32>, calls: &[Call], jobs: u32) -> Result<u64> {
    let mut c = Conn::open(addr, nodes)?;
    let mut current = None;
    for &(f, inputs) in calls {
        if current != Some(f) {
            c.configure(f)?;
            current = Some(f);
        }
        let msgs = messages(inputs, jobs);
        for (id, m) in msgs.iter().enumerate() {
            write_frame(&mut c.w, OutFrame::data(id as u32, m.clone())?)?;
        }
        for _ in 0..msgs.len() {
            Data::parse(c.next(MsgType::Data)?.payload)?;
        }
    }
    Ok(0)
}

/// `software`: every call on this application's CPU.
pub fn software(sw: Software, calls: &[Call]) -> Result<u64> {
    for &(f, inputs) in calls {
        sw.run(f, inputs)?;
    }
    Ok(calls.iter().map(|&(_, n)| n as u64).sum())
}

/// `cowork`: each call through the client's co-working map (seed 002
/// Algorithm 2), the local side being the calibrated software loop on one
/// thread; a call to another function requests its configuration and
/// computes locally until the server has answered. Calls are split into `4 × jobs` messages so the local side has
/// batches finer than the cluster's `jobs` (its C_COWORK_MAX blocks).
/// `backup`: [`CoworkOptions::backup`]; `backups` counts the copies sent.
pub fn cowork(
    addr: SocketAddr,
    sw: Software,
    calls: &[Call],
    jobs: u32,
    backup: bool,
    backups: &AtomicU64,
) -> Result<u64> {
    if sw.speedup <= 0.0 {
        bail!("co-working needs a software path (--speedup > 0)");
    }
    let client = Client::connect(
        &addr.to_string(),
        ClientOptions {
            name: Some("bench sharing cowork".into()),
            ..ClientOptions::default()
        },
    )?;
    let mut coworks: HashMap<u32, Cowork> = HashMap::new();
    let mut local = 0;
    for &(f, inputs) in calls {
        let cfg = config(f).to_configuration();
        let cw = match coworks.entry(f) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Cowork::with_cores(
                &cfg,
                vec![Box::new(SoftCore { iters: sw.iters(f) })],
                CoworkOptions {
                    threads: 1,
                    jobs: jobs as usize,
                    // Computes while the nodes are programmed (Algorithm 2).
                    configure: true,
                    backup,
                    ..CoworkOptions::default()
                },
            )?),
        };
        let msgs = messages(inputs, 4 * jobs);
        let run = client.map_cowork(&msgs, msgs.len(), cw)?;
        // Items are messages; messages hold equal numbers of inputs but the
        // last, so this is the local share of the inputs to within one message.
        local += run.report.local_items as u64 * inputs as u64 / msgs.len() as u64;
        backups.fetch_add(run.report.backups as u64, Ordering::Relaxed);
    }
    Ok(local)
}

/// Job number -> (results still missing, where to say it is done).
type Pending = HashMap<u32, (u32, mpsc::Sender<()>)>;

/// One job handed to a static partition's function: inputs, messages, and
/// where to say it is done.
struct Job {
    inputs: u32,
    jobs: u32,
    done: mpsc::Sender<()>,
}

/// `static`: the nodes are divided among functions up front; each placed
/// function is one exclusive-mode connection holding its nodes, configured
/// once and never again, through which every application's calls to that
/// function go (a FIFO across applications). Calls to functions without a
/// partition run in software on the calling application's CPU.
pub struct StaticPartition {
    proxies: HashMap<u32, mpsc::Sender<Job>>,
}

impl StaticPartition {
    /// Functions `0..placed` get `nodes / placed` nodes each (the first
    /// `nodes % placed` one more).
    pub fn start(addr: SocketAddr, nodes: u32, placed: u32) -> Result<StaticPartition> {
        let mut proxies = HashMap::new();
        for f in 0..placed {
            let share = nodes / placed + u32::from(f < nodes % placed);
            let mut c = Conn::open(addr, Some(share))?;
            c.configure(f)?;
            let (tx, rx) = mpsc::channel::<Job>();
            let Conn { mut w, mut r } = c;
            let pending: Arc<Mutex<Pending>> = Arc::default();
            let owner: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
            let (p2, o2) = (pending.clone(), owner.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut next_id = 0u32;
                for (n, job) in rx.into_iter().enumerate() {
                    let msgs = messages(job.inputs, job.jobs);
                    p2.lock()
                        .unwrap()
                        .insert(n as u32, (msgs.len() as u32, job.done));
                    for m in msgs {
                        o2.lock().unwrap().insert(next_id, n as u32);
                        write_frame(&mut w, OutFrame::data(next_id, m)?)?;
                        next_id = next_id.wrapping_add(1);
                    }
                }
                Ok(())
            });
            std::thread::spawn(move || -> Result<()> {
                while let Some(fr) = r.read_frame()? {
                    if fr.ty != MsgType::Data {
                        continue;
                    }
                    let d = Data::parse(fr.payload)?;
                    let Some(n) = owner.lock().unwrap().remove(&d.id) else {
                        continue;
                    };
                    let mut p = pending.lock().unwrap();
                    if let Some(e) = p.get_mut(&n) {
                        e.0 -= 1;
                        if e.0 == 0 {
                            let (_, done) = p.remove(&n).expect("present");
                            let _ = done.send(());
                        }
                    }
                }
                Ok(())
            });
            proxies.insert(f, tx);
        }
        Ok(StaticPartition { proxies })
    }

    pub fn app(&self, sw: Software, calls: &[Call], jobs: u32) -> Result<u64> {
        let mut local = 0;
        for &(f, inputs) in calls {
            match self.proxies.get(&f) {
                Some(p) => {
                    let (done, wait) = mpsc::channel();
                    p.send(Job { inputs, jobs, done })
                        .map_err(|_| anyhow::anyhow!("function {f}'s partition stopped"))?;
                    wait.recv()
                        .map_err(|_| anyhow::anyhow!("function {f}'s partition lost a call"))?;
                }
                None => {
                    sw.run(f, inputs)?;
                    local += inputs as u64;
                }
            }
        }
        Ok(local)
    }
}
