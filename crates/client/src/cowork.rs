//! CPU/cluster co-working: run one function on the local CPU and on the
//! cluster at once (seed 002 chapter 4 and Algorithm 2).
//!
//! An image that carries a native artifact for this machine can be loaded
//! here too (through `corefarm_cores::load`, the same code a node uses), so
//! the client can compute some of the inputs itself while the cluster
//! computes the rest:
//!
//! ```no_run
//! use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};
//! # fn inputs() -> Vec<bytes::Bytes> { vec![] }
//! let c = Client::connect("127.0.0.1:9999", ClientOptions::default())?;
//! let cfg = corefarm_cores::image::configuration(std::fs::read("matmul.cfimg")?.into())?;
//! c.configure(&cfg)?;
//! let cowork = Cowork::load(&cfg, CoworkOptions::default())?;
//! let run = c.map_cowork(&inputs(), 32, &cowork)?;
//! println!("{} local, {} on the cluster", run.report.local_items, run.report.cluster_items);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! How the work is split (see docs/cowork.md):
//!
//! - Below the break-even size `N_L` (eq. 4.8) everything runs locally;
//!   above it the cluster's share follows eq. 4.4, `α = α*[1 − X_c(D_a −
//!   O_c)/N]`, re-evaluated on the work that remains each time the cluster
//!   has room for more, so the split rebalances as results arrive.
//! - Work is handed out in batches from one shared cursor: the local
//!   threads and the cluster take the next batch when ready, so the faster
//!   side takes more; batches shrink as the work runs out.
//! - `X_c` is measured from the local batches, `X_a` and `D_a` from the
//!   cluster's results; a [`Cowork`] remembers them for its next run, and
//!   [`Cowork::set_cluster_throughput`] replaces the measured `X_a` with a
//!   reported one.
//! - While the client is not configured with this function, work goes on
//!   locally in small batches, checking after each; if the cluster fails,
//!   what it had not answered is computed locally.
//!
//! Results come back in input order and are the same bytes whichever side
//! computed them (the same function on the same input).

mod engine;
mod policy;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use corefarm_cores::{ArtifactKind, Core, CoreError, LoadError, LoadOptions};
use corefarm_smp::Configuration;

pub use policy::Estimates;

use crate::{Client, ClientError};

/// How a [`Cowork`] runs.
#[derive(Debug, Clone)]
pub struct CoworkOptions {
    /// Local worker threads (one core each); 0: one per CPU.
    pub threads: usize,
    /// `C_COWORK_MAX` of Algorithm 2: most data messages a local thread
    /// takes at once before it comes back to rebalance (and, while the
    /// client is not configured, to check whether it is).
    pub local_batch_max: usize,
    /// `n_j` of Algorithm 2 (6 in the seed): a local thread takes
    /// 1/(n_j · threads) of the local share at a time.
    pub jobs: usize,
    /// Which backends may run locally. Default: native soft cores only (an
    /// RTL simulation computes the same results, far more slowly), run in
    /// this process: the core is the user's own code in the user's own
    /// program, and a worker process would need the `corefarm` binary
    /// beside every program that co-works.
    pub load: LoadOptions,
    /// `map_cowork` sends the cowork's configuration itself when the client
    /// holds another one, and the local threads work until the server
    /// answers (seed 002 Algorithm 2 lines 7–12, where a call requests its
    /// accelerator and computes on the CPU meanwhile). Without it the
    /// caller configures, and an unconfigured call runs locally.
    pub configure: bool,
    /// When the cluster has nothing left to take, it also computes messages
    /// local threads are still on and not due within one cluster round
    /// trip; the first result is kept (docs/cowork.md, "Backup copies").
    pub backup: bool,
}

impl Default for CoworkOptions {
    fn default() -> Self {
        CoworkOptions {
            threads: 0,
            local_batch_max: 16,
            jobs: 6,
            load: LoadOptions {
                native: true,
                rtl: false,
                fpga: None,
                prefer: vec![ArtifactKind::Native],
                isolation: corefarm_cores::Isolation::InProcess,
                ..LoadOptions::default()
            },
            configure: false,
            backup: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoworkError {
    #[error("cannot run this configuration on the local CPU: {0}")]
    Load(#[from] LoadError),
    #[error("input {index}: {reason}")]
    Input { index: usize, reason: String },
    #[error("the local core failed on input {index}: {error}")]
    Local { index: usize, error: CoreError },
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What a co-worked run did and measured.
#[derive(Debug, Clone, PartialEq)]
pub struct CoworkReport {
    /// Data messages computed locally.
    pub local_items: usize,
    /// Data messages computed by the cluster.
    pub cluster_items: usize,
    /// Copies sent to the cluster of messages a local thread was on
    /// (counted above by whichever side answered first).
    pub backups: usize,
    /// Why the cluster stopped taking work early, if it failed (its
    /// unanswered messages were then computed locally).
    pub cluster_error: Option<String>,
    /// Model parameters in force at the end (earlier runs, this run's
    /// measurements, a reported `X_a`).
    pub estimates: Estimates,
    /// What this run measured by itself.
    pub measured: Estimates,
    /// Wall-clock seconds of the run.
    pub seconds: f64,
}

impl CoworkReport {
    /// Eq. 4.8's break-even size with the final estimates, if known.
    pub fn break_even(&self) -> Option<f64> {
        self.estimates.partition().map(|p| p.break_even())
    }
}

/// The results, in input order, and the report.
#[derive(Debug, Clone)]
pub struct CoworkRun {
    pub results: Vec<Bytes>,
    pub report: CoworkReport,
}

/// One function loaded on the local CPU, ready to co-work with a cluster
/// configured with the same configuration. Runs one co-worked map at a time
/// (concurrent calls wait); keeps its estimates between runs.
pub struct Cowork {
    cfg: Configuration,
    opts: CoworkOptions,
    cores: Mutex<Vec<Box<dyn Core>>>,
    /// Local threads asked for: a core that panicked is dropped after its
    /// run, and one loaded from the configuration is loaded again before
    /// the next (`reloadable`); caller-built cores cannot be.
    threads: usize,
    reloadable: bool,
    estimates: Mutex<Estimates>,
    pinned_x_a: Mutex<Option<f64>>,
    description: String,
}

impl std::fmt::Debug for Cowork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cowork")
            .field("description", &self.description)
            .field("estimates", &self.estimates())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cowork {
    /// Loads `cfg`'s cores on this machine: `opts.threads` of them, loading
    /// the configuration as many times as its core table needs.
    pub fn load(cfg: &Configuration, opts: CoworkOptions) -> Result<Cowork, CoworkError> {
        if cfg.input_size == 0 || cfg.output_size == 0 {
            return Err(LoadError::Invalid(
                "co-working needs a configuration with non-zero input and output sizes".into(),
            )
            .into());
        }
        let threads = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut cores: Vec<Box<dyn Core>> = Vec::with_capacity(threads);
        let mut description = String::new();
        while cores.len() < threads {
            let loaded = corefarm_cores::load(cfg, &opts.load)?;
            if loaded.cores.is_empty() {
                return Err(LoadError::Invalid("the configuration loads no cores".into()).into());
            }
            description = loaded.description;
            cores.extend(loaded.cores);
        }
        cores.truncate(threads);
        // O_0 (eq. 4.5): starting and joining the local threads with no work.
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| ());
            }
        });
        let o_0 = t.elapsed().as_secs_f64();
        Ok(Cowork {
            cfg: cfg.clone(),
            opts,
            cores: Mutex::new(cores),
            threads,
            reloadable: true,
            estimates: Mutex::new(Estimates {
                o_0: Some(o_0),
                ..Estimates::default()
            }),
            pinned_x_a: Mutex::new(None),
            description: format!("{threads} local thread(s) of {description}"),
        })
    }

    /// A cowork over cores the caller built (for example a software model of
    /// a configuration no backend loads here, such as the benchmarking
    /// configuration): `cores` compute `cfg`'s function, one thread each.
    pub fn with_cores(
        cfg: &Configuration,
        cores: Vec<Box<dyn Core>>,
        opts: CoworkOptions,
    ) -> Result<Cowork, CoworkError> {
        if cfg.input_size == 0 || cfg.output_size == 0 || cores.is_empty() {
            return Err(LoadError::Invalid(
                "co-working needs non-zero input and output sizes and at least one core".into(),
            )
            .into());
        }
        let threads = cores.len();
        Ok(Cowork {
            cfg: cfg.clone(),
            opts,
            cores: Mutex::new(cores),
            threads,
            reloadable: false,
            estimates: Mutex::new(Estimates::default()),
            pinned_x_a: Mutex::new(None),
            description: format!("{threads} local thread(s) of caller-provided cores"),
        })
    }

    /// A cowork over given cores (tests: fake cores, no image).
    #[cfg(test)]
    pub(crate) fn from_cores(
        input_size: u32,
        output_size: u32,
        cores: Vec<Box<dyn Core>>,
    ) -> Cowork {
        Cowork {
            cfg: Configuration {
                input_size,
                output_size,
                cores: Vec::new(),
                bitstream: Bytes::new(),
            },
            opts: CoworkOptions::default(),
            threads: cores.len(),
            reloadable: false,
            cores: Mutex::new(cores),
            estimates: Mutex::new(Estimates::default()),
            pinned_x_a: Mutex::new(None),
            description: "test cores".into(),
        }
    }

    /// Loads the configuration `client` was last configured with.
    pub fn for_client(client: &Client, opts: CoworkOptions) -> Result<Cowork, CoworkError> {
        let cfg = client.configuration().ok_or(ClientError::NotConfigured)?;
        Cowork::load(&cfg, opts)
    }

    /// The configuration this runs locally.
    pub fn configuration(&self) -> &Configuration {
        &self.cfg
    }

    /// Local threads.
    pub fn threads(&self) -> usize {
        lock(&self.cores).len()
    }

    /// "2 local thread(s) of 2 × native mat_mul_64x64 (native-x86_64-linux)".
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The model parameters known so far (from earlier runs).
    pub fn estimates(&self) -> Estimates {
        let mut e = *lock(&self.estimates);
        if let Some(x) = *lock(&self.pinned_x_a) {
            e.x_a = Some(x);
        }
        e
    }

    /// Uses `x_a` data messages/s as the cluster's throughput instead of
    /// measuring it (e.g. a per-function throughput the server reports);
    /// `None` goes back to measuring.
    pub fn set_cluster_throughput(&self, x_a: Option<f64>) {
        *lock(&self.pinned_x_a) = x_a.filter(|x| x.is_finite() && *x > 0.0);
    }

    /// Checks every input is a whole, non-zero number of inputs.
    fn check_inputs(&self, inputs: &[Bytes]) -> Result<(), CoworkError> {
        let size = self.cfg.input_size as usize;
        match inputs
            .iter()
            .position(|b| b.is_empty() || b.len() % size != 0)
        {
            Some(index) => Err(CoworkError::Input {
                index,
                reason: format!(
                    "{} bytes is not a whole, non-zero number of {size}-byte inputs",
                    inputs[index].len()
                ),
            }),
            None => Ok(()),
        }
    }

    /// Runs `inputs` locally and on `cluster` (see the module docs).
    pub(crate) fn run<P: engine::ClusterPath>(
        &self,
        inputs: &[Bytes],
        window: usize,
        cluster: &P,
        clock: &dyn policy::Clock,
    ) -> Result<CoworkRun, CoworkError> {
        self.check_inputs(inputs)?;
        let mut cores = lock(&self.cores);
        self.replace_panicked(&mut cores)?;
        let knobs = policy::Knobs {
            window,
            threads: cores.len(),
            local_max: self.opts.local_batch_max,
            jobs: self.opts.jobs,
            backup: self.opts.backup,
        };
        let pinned = Estimates {
            x_a: *lock(&self.pinned_x_a),
            ..Estimates::default()
        };
        let prior = *lock(&self.estimates);
        let sizes = (self.cfg.input_size as usize, self.cfg.output_size as usize);
        let (results, report) = engine::run(
            inputs, sizes, &mut cores, cluster, clock, knobs, prior, pinned,
        )?;
        {
            let mut e = lock(&self.estimates);
            *e = e.merged(report.measured);
        }
        Ok(CoworkRun { results, report })
    }
}

impl Cowork {
    /// Cores dropped after a panic (see `engine::run`) are loaded again
    /// from the configuration; caller-built ones cannot be, and a cowork
    /// left without any says so instead of running all-cluster unasked.
    fn replace_panicked(&self, cores: &mut Vec<Box<dyn Core>>) -> Result<(), CoworkError> {
        while self.reloadable && cores.len() < self.threads {
            let loaded = corefarm_cores::load(&self.cfg, &self.opts.load)?;
            if loaded.cores.is_empty() {
                break;
            }
            let missing = self.threads - cores.len();
            cores.extend(loaded.cores.into_iter().take(missing));
        }
        if cores.is_empty() {
            return Err(LoadError::Invalid(
                "every local core panicked in an earlier run, and cores the caller built \
                 cannot be loaded again: make a new Cowork"
                    .into(),
            )
            .into());
        }
        Ok(())
    }
}

/// The cluster path over a real client: ready when the client's
/// configuration is this one.
struct ClientPath<'a> {
    client: &'a Client,
    cfg: &'a Configuration,
    /// [`CoworkOptions::configure`].
    configure: bool,
    /// This call sent its configuration request already.
    requested: std::sync::atomic::AtomicBool,
}

impl<'a> ClientPath<'a> {
    fn new(client: &'a Client, cowork: &'a Cowork) -> Self {
        ClientPath {
            client,
            cfg: &cowork.cfg,
            configure: cowork.opts.configure,
            requested: Default::default(),
        }
    }

    /// A configuration request is on its way (sent, or about to be by a
    /// co-working call's thread).
    fn asking(&self, t: &crate::inner::ConfigureTiming) -> bool {
        let flag = &self.client.inner.cowork_configuring;
        t.since.is_some() || flag.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl engine::ClusterPath for ClientPath<'_> {
    type Ticket = crate::Pending;

    fn ready(&self) -> bool {
        // A configuration on its way replaces the accepted one for every
        // message sent after it, whichever it was.
        let asking = self.asking(&crate::inner::lock(&self.client.inner.configure_timing));
        !asking
            && self
                .client
                .configuration()
                .is_some_and(|c| c.input_size == self.cfg.input_size && c == *self.cfg)
    }

    fn expected_wait(&self) -> Option<f64> {
        let t = crate::inner::lock(&self.client.inner.configure_timing);
        if !self.asking(&t) {
            return None;
        }
        let elapsed = t.since.map_or(0.0, |s| s.elapsed().as_secs_f64());
        Some(
            t.took
                .map_or(f64::INFINITY, |d| (d.as_secs_f64() - elapsed).max(0.0)),
        )
    }

    fn request(&self) {
        let flag = &self.client.inner.cowork_configuring;
        // Once per call: the engine checks every millisecond, and after a
        // refusal (or on a closed connection) each check would send the
        // configuration, bitstream and all, again.
        if !self.configure
            || self.requested.load(std::sync::atomic::Ordering::Acquire)
            || crate::inner::lock(&self.client.inner.configure_timing)
                .since
                .is_some()
            || flag.swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        // Not joined: the call ends when its work is done, even while the
        // programming of a node goes on; a later `configure` waits for
        // this one (they are serialised), and no second request goes out
        // while it is on its way (it would program nodes for a call that
        // may be over by then). A refusal (or no thread) leaves the
        // client's configuration as it was, so the work stays local.
        self.requested
            .store(true, std::sync::atomic::Ordering::Release);
        let inner = self.client.inner.clone();
        let cfg = self.cfg.clone();
        let started = std::thread::Builder::new()
            .name("cowork-configure".into())
            .spawn(move || {
                let _ = inner.configure(&cfg);
                let flag = &inner.cowork_configuring;
                flag.store(false, std::sync::atomic::Ordering::Release);
            });
        if started.is_err() {
            flag.store(false, std::sync::atomic::Ordering::Release);
        }
    }

    fn submit(&self, data: &Bytes) -> Result<crate::Pending, ClientError> {
        self.client.submit_pending(data.clone())
    }

    fn wait(&self, ticket: crate::Pending) -> Result<Bytes, ClientError> {
        ticket.wait(None).map(|o| o.data)
    }
}

impl Client {
    /// Like [`map`](Client::map), computing part of the inputs on the local
    /// CPU with `cowork`'s cores (see [`Cowork`] and the module docs of
    /// `cowork`). `window`: most data messages in flight to the cluster.
    /// The cluster is used only while this client is configured with
    /// `cowork`'s configuration; until then (or if it fails) the work is
    /// done locally.
    pub fn map_cowork(
        &self,
        inputs: &[Bytes],
        window: usize,
        cowork: &Cowork,
    ) -> Result<CoworkRun, CoworkError> {
        let path = ClientPath::new(self, cowork);
        // In shared mode the server knows the function's replicas and their
        // measured service time: X_a from the start of the call instead of
        // from the first results (seed 002 Algorithm 2). A caller's pinned
        // value wins; the reported one holds for this call only. Asked
        // only when configured for it: the server answers a status request
        // after a configuration it is still carrying out.
        let ready = engine::ClusterPath::ready(&path);
        let reported = (ready && lock(&cowork.pinned_x_a).is_none() && self.has_status())
            .then(|| self.status().ok())
            .flatten()
            .and_then(|s| {
                let per_message = inputs.first()?.len() / cowork.cfg.input_size.max(1) as usize;
                reported_throughput(&s, per_message)
            });
        if reported.is_some() {
            cowork.set_cluster_throughput(reported);
        }
        let run = cowork.run(inputs, window, &path, &policy::WallClock::new());
        if reported.is_some() {
            cowork.set_cluster_throughput(None);
        }
        run
    }
}

/// Data messages per second the cluster can take for this user's function,
/// from a shared-mode status: replicas × 10⁶ / (service µs per input ×
/// inputs per message). `None` outside shared mode or before a measurement.
pub fn reported_throughput(
    s: &corefarm_smp::ClusterStatus,
    inputs_per_message: usize,
) -> Option<f64> {
    let me = s.users.iter().find(|u| Some(u.id) == s.you)?;
    // A user's function is shown by name (the id, from servers before names).
    let mine = me.function.as_ref()?;
    let f = s
        .functions
        .iter()
        .find(|f| f.name.as_ref() == Some(mine) || &f.id == mine)?;
    let service = f.service_us.filter(|&us| us > 0.0)?;
    (f.replicas > 0 && inputs_per_message > 0)
        .then(|| f64::from(f.replicas) * 1e6 / (service * inputs_per_message as f64))
}
