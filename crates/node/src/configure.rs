//! Turning a configuration message into running core handlers: parse,
//! check the sizes against the link's message limit, build the engine (the
//! benchmarking core, or cores from a backend) and start its handlers.

use std::sync::Arc;

use bytes::Bytes;
use corefarm_cores::spin::Ruleset;
use corefarm_cores::worker::HandlerWorker;
use corefarm_cores::{LoadError, LoadOptions, Loaded};
use corefarm_smp::{Configuration, ErrorCode, ProtocolError};
use tokio::sync::mpsc;

use crate::bench::BenchCore;
use crate::handlers::{Engine, Outgoing, Workers};
use crate::NodeOptions;

type LoadFn = dyn Fn(&Configuration, &LoadOptions) -> Result<Loaded, LoadError> + Send + Sync;

/// How a node turns a (non-benchmark) configuration into cores:
/// [`corefarm_cores::load`] by default; tests and embedding programs may
/// supply their own. Called on a blocking thread.
#[derive(Clone)]
pub struct CoreLoader(Arc<LoadFn>);

impl CoreLoader {
    pub fn new(
        f: impl Fn(&Configuration, &LoadOptions) -> Result<Loaded, LoadError> + Send + Sync + 'static,
    ) -> Self {
        CoreLoader(Arc::new(f))
    }

    pub fn load(&self, cfg: &Configuration, opts: &LoadOptions) -> Result<Loaded, LoadError> {
        (self.0)(cfg, opts)
    }
}

impl Default for CoreLoader {
    fn default() -> Self {
        CoreLoader::new(corefarm_cores::load)
    }
}

impl std::fmt::Debug for CoreLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreLoader")
    }
}

/// Why a configuration was refused. The text is the reason sent back to the
/// server (and on to the user); [`ConfigureError::code`] is the SMP code.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// The payload is not a configuration message.
    #[error("{0}")]
    Malformed(ProtocolError),
    /// An input or output size cannot pass the link's message limit.
    #[error("{0}")]
    Limits(ProtocolError),
    /// The backend refused or failed to load the cores.
    #[error("{0}")]
    Load(LoadError),
    /// The loader panicked.
    #[error("loading the configuration crashed: {0}")]
    LoaderCrashed(String),
    /// The loader returned no cores.
    #[error("the configuration instantiates no cores")]
    NoCores,
    /// The OS refused the engine a thread.
    #[error("cannot start the core handlers: {0}")]
    Engine(std::io::Error),
    /// The image's streaming handler sets did not load.
    #[error("handler sets: {0}")]
    HandlerSets(LoadError),
    /// Loading the handler sets panicked.
    #[error("loading the handler sets crashed: {0}")]
    HandlerSetsCrashed(String),
    /// The streaming-handler lane did not start.
    #[error("cannot start the streaming handlers: {0}")]
    Lane(std::io::Error),
}

impl ConfigureError {
    /// Every refusal is a failed configuration on the wire; what went wrong
    /// is in the reason.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::ConfigurationFailed
    }
}

/// The configuration a node runs and its core handlers.
pub struct Configured {
    pub cfg: Configuration,
    /// SHA-256 of the configuration payload: the function's identity (the
    /// server names functions by the same digest).
    pub digest: [u8; 32],
    pub workers: Workers,
}

impl Configured {
    /// Stops the handlers (`finish`: after the queued jobs; otherwise the
    /// queued jobs are dropped and only the running ones finish) and keeps
    /// the function loaded if every core came back idle (blocking: call
    /// from `spawn_blocking`).
    pub fn wind_down(self, finish: bool) -> Option<Kept> {
        let cores = if finish {
            self.workers.stop()
        } else {
            self.workers.abort()
        }?;
        Some(Kept {
            digest: self.digest,
            cfg: self.cfg,
            cores,
        })
    }
}

/// A loaded function whose handlers stopped, its cores idle: kept from one
/// configuration (and one server connection) to the next, so the same
/// configuration again is answered without loading (without reprogramming
/// a board). A different configuration drops it before it loads.
pub struct Kept {
    digest: [u8; 32],
    cfg: Configuration,
    cores: Vec<Box<dyn corefarm_cores::Core>>,
}

impl Kept {
    /// The digest of the configuration the cores were loaded from.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

/// Drops a kept function's cores where dropping may block (a core in a
/// worker process waits for it to exit).
async fn release(k: Kept) {
    let _ = tokio::task::spawn_blocking(move || drop(k)).await;
}

/// The function's identity: SHA-256 of the configuration payload.
pub fn digest(payload: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(payload).into()
}

/// Whether a configuration was loaded or found already loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Loaded,
    /// Identical (same digest) to the function the node held: its cores
    /// were run again, nothing was loaded.
    Reused,
}

/// Parses, checks and loads a configuration, or reuses `kept` if it holds
/// the same one (same payload digest).
/// `limit` is the largest payload the link carries (the node's own limit,
/// lowered by the server's if it announced one); `any_length`: the server
/// takes handler results of any length (hello feature `any-length`).
pub async fn configure(
    payload: Bytes,
    opts: &NodeOptions,
    limit: u32,
    any_length: bool,
    results: &mpsc::UnboundedSender<Outgoing>,
    kept: Option<Kept>,
) -> Result<(Configured, Outcome), ConfigureError> {
    let digest = digest(&payload);
    match kept {
        Some(k) if k.digest == digest => {
            // The limits are the link's: another server may announce others.
            if let Err(e) = k.cfg.check_limits(limit) {
                release(k).await;
                return Err(ConfigureError::Limits(e));
            }
            let cfg = k.cfg;
            let engine = Engine {
                cores: k.cores,
                input_size: cfg.input_size as usize,
                output_size: cfg.output_size as usize,
            };
            let configured = start(engine, cfg, digest, opts, limit, any_length, results).await?;
            return Ok((configured, Outcome::Reused));
        }
        // Anything else held goes first: a board holds one image.
        Some(other) => release(other).await,
        None => {}
    }
    if !opts.reconfigure_delay.is_zero() {
        // Emulated board programming (simulation only; zero by default).
        tokio::time::sleep(opts.reconfigure_delay).await;
    }
    let cfg = Configuration::parse(payload).map_err(ConfigureError::Malformed)?;
    // Refused here, with a reason, rather than as an impossible allocation
    // or an unsendable result once data flows.
    cfg.check_limits(limit).map_err(ConfigureError::Limits)?;
    let engine = match cfg.benchmark() {
        Some(b) => BenchCore::engine(&b),
        None => {
            let (c, load, loader) = (cfg.clone(), opts.load.clone(), opts.loader.clone());
            let loaded = tokio::task::spawn_blocking(move || loader.load(&c, &load))
                .await
                .map_err(|e| ConfigureError::LoaderCrashed(e.to_string()))?
                .map_err(ConfigureError::Load)?;
            if loaded.cores.is_empty() {
                return Err(ConfigureError::NoCores);
            }
            tracing::info!(node = %opts.name, "loaded {}", loaded.description);
            Engine {
                cores: loaded.cores,
                input_size: cfg.input_size as usize,
                output_size: cfg.output_size as usize,
            }
        }
    };
    let configured = start(engine, cfg, digest, opts, limit, any_length, results).await?;
    Ok((configured, Outcome::Loaded))
}

/// Starts the handlers of `engine`, and the image's streaming handlers
/// (loaded again even when the cores are reused: they are software, and
/// their pool does not outlive its lane).
async fn start(
    engine: Engine,
    cfg: Configuration,
    digest: [u8; 32],
    opts: &NodeOptions,
    limit: u32,
    any_length: bool,
    results: &mpsc::UnboundedSender<Outgoing>,
) -> Result<Configured, ConfigureError> {
    let mut workers =
        Workers::start(engine, results.clone(), &opts.name).map_err(ConfigureError::Engine)?;
    if let Some((pool, rulesets)) = handler_sets(&cfg, opts).await? {
        let link = crate::spin::ResultLink { limit, any_length };
        workers
            .attach_spin(pool, rulesets, opts.spin, link, &opts.name)
            .map_err(ConfigureError::Lane)?;
    }
    Ok(Configured {
        cfg,
        digest,
        workers,
    })
}

/// The image's streaming handler sets, loaded in a pool of
/// `opts.spin.workers` handler workers sharing the sets' memory
/// (docs/streams.md), and their rulesets; `None` without handler sets.
async fn handler_sets(
    cfg: &Configuration,
    opts: &NodeOptions,
) -> Result<Option<(Vec<HandlerWorker>, Vec<Ruleset>)>, ConfigureError> {
    if cfg.benchmark().is_some() {
        return Ok(None);
    }
    let (c, load, threads) = (cfg.clone(), opts.load.clone(), opts.spin.threads);
    let size = opts.spin.workers.max(1);
    let pool = tokio::task::spawn_blocking(move || {
        let Some(first) = corefarm_cores::spin::load_handlers(&c, &load, threads)? else {
            return Ok(None);
        };
        let mut pool = Vec::with_capacity(size);
        for _ in 1..size {
            pool.push(first.sibling()?);
        }
        pool.insert(0, first);
        Ok(Some(pool))
    })
    .await
    .map_err(|e| ConfigureError::HandlerSetsCrashed(e.to_string()))?
    .map_err(ConfigureError::HandlerSets)?;
    Ok(pool.map(|pool| {
        let w = &pool[0];
        let rulesets = (0..w.contexts())
            .map(|i| w.set(i).ruleset.clone())
            .collect();
        (pool, rulesets)
    }))
}

/// One line for the log.
pub fn describe(cfg: &Configuration) -> String {
    match cfg.benchmark() {
        Some(b) => format!(
            "benchmarking configuration: input {} B, output {} B, delay {} µs",
            b.input_size, b.output_size, b.delay_us
        ),
        None => format!(
            "{} cores, input {} B, output {} B, bitstream {} B",
            cfg.cores.len(),
            cfg.input_size,
            cfg.output_size,
            cfg.bitstream.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::{BenchmarkConfig, CoreInfo};

    fn opts(loader: CoreLoader) -> NodeOptions {
        NodeOptions {
            loader,
            ..NodeOptions::default()
        }
    }

    fn bench(i: u32, o: u32) -> Bytes {
        let b = BenchmarkConfig {
            input_size: i,
            output_size: o,
            delay_us: 0,
        };
        Bytes::from(b.to_configuration().encode_payload())
    }

    #[tokio::test]
    async fn sizes_beyond_the_limit_are_refused_with_a_reason() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let o = opts(CoreLoader::default());
        let why = configure(bench(32, 0xFFFF_FFF0), &o, 1 << 20, false, &tx, None)
            .await
            .err()
            .unwrap();
        assert!(matches!(why, ConfigureError::Limits(_)), "{why}");
        assert_eq!(why.code(), ErrorCode::ConfigurationFailed);
        assert!(configure(bench(32, 1 << 19), &o, 1 << 20, false, &tx, None)
            .await
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_emulated_programming_time_delays_every_configuration() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let o = NodeOptions {
            reconfigure_delay: std::time::Duration::from_millis(250),
            ..opts(CoreLoader::default())
        };
        let t0 = tokio::time::Instant::now();
        assert!(configure(bench(32, 32), &o, 1 << 20, false, &tx, None)
            .await
            .is_ok());
        // Paused clock: exactly the emulated time, whatever the machine's load.
        assert_eq!(t0.elapsed(), std::time::Duration::from_millis(250));
    }

    #[tokio::test]
    async fn zero_output_core_configurations_never_reach_the_loader() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let o = opts(CoreLoader::new(|_, _| panic!("must not load")));
        let cfg = Configuration {
            input_size: 8,
            output_size: 0,
            cores: vec![CoreInfo {
                control: 0,
                input: 64,
                output: 128,
            }],
            bitstream: Bytes::from_static(b"image"),
        };
        let why = configure(
            Bytes::from(cfg.encode_payload()),
            &o,
            1 << 20,
            false,
            &tx,
            None,
        )
        .await
        .err()
        .unwrap();
        assert!(matches!(why, ConfigureError::Limits(_)), "{why}");
    }

    #[tokio::test]
    async fn loader_errors_and_empty_loads_are_reasons() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let cfg = Configuration {
            input_size: 8,
            output_size: 8,
            cores: vec![CoreInfo {
                control: 0,
                input: 64,
                output: 128,
            }],
            bitstream: Bytes::from_static(b"image"),
        };
        let payload = Bytes::from(cfg.encode_payload());
        let o = opts(CoreLoader::new(|_, _| {
            Err(LoadError::Unsupported("no such backend".into()))
        }));
        let why = configure(payload.clone(), &o, 1 << 20, false, &tx, None)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&why, ConfigureError::Load(LoadError::Unsupported(m)) if m == "no such backend"),
            "{why}"
        );
        // The backend's words are the reason the server gets, unchanged.
        assert_eq!(why.to_string(), "no such backend");
        let o = opts(CoreLoader::new(|_, _| {
            Ok(Loaded {
                cores: vec![],
                description: "nothing".into(),
            })
        }));
        let why = configure(payload, &o, 1 << 20, false, &tx, None)
            .await
            .err()
            .unwrap();
        assert!(matches!(why, ConfigureError::NoCores), "{why}");
    }
}
