//! The isolated node-manager benchmark of seed 000 §4.2.3.
//!
//! The seed measured one node manager without the server: data generated
//! next to the node, pushed through its queues and core handlers with no
//! computation time. Here the benchmark *is* the node's server: it listens on
//! a loopback port, a real `corefarm node --server ADDR` connects to it as
//! to a server's node port, and the benchmark sends the benchmarking
//! configuration with delay 0 and streams data messages straight to the
//! node (sender and receiver threads, a bounded window of messages in
//! flight), so the figure contains the node manager and one TCP hop, not the
//! server's routing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::hello::features;
use corefarm_smp::{
    BenchmarkConfig, ConfigurationResponse, ErrorMsg, Hello, MsgType, DEFAULT_MAX_MESSAGE,
};

use crate::now_ns;
use crate::user::{self, Measure, Session, UserBenchOptions, UserReport};

/// How a node comes to the benchmark's port.
#[derive(Debug, Clone)]
pub enum NodeSource {
    /// Start this program with `node --server ADDR --once` appended
    /// arguments (normally the running `corefarm` binary).
    Spawn {
        program: std::path::PathBuf,
        args: Vec<String>,
    },
    /// Wait for a node started by someone else (the address is announced
    /// through the `listening` callback).
    Accept,
}

#[derive(Debug, Clone)]
pub struct NodeBenchOptions {
    /// Address the benchmark listens on as a server node port.
    pub listen: String,
    pub source: NodeSource,
    /// Data messages in flight at most (the node has no credit protocol:
    /// this bound is what keeps its queues, and latency, finite).
    pub window: u32,
    /// How long to wait for the node to connect.
    pub accept_timeout: Duration,
    /// Sizes, count, duration, warm-up, drain timeout and progress; `delay_us`
    /// is forced to 0 and `server`, `nodes`, `legacy`, `rate_hz` are unused.
    pub run: UserBenchOptions,
}

/// Kills and reaps the spawned node however the benchmark ends.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl ChildGuard {
    /// Why the node is gone, if it is.
    fn exited(&mut self) -> Option<String> {
        let c = self.0.as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => Some(format!("the node process exited ({st})")),
            _ => None,
        }
    }
}

fn accept(l: &TcpListener, timeout: Duration, child: &mut ChildGuard) -> Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(why) = child.exited() {
                    bail!("{why} before connecting");
                }
                if Instant::now() >= deadline {
                    bail!("no node connected within {:.0} s", timeout.as_secs_f64());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("accepting the node"),
        }
    }
}

/// Runs the benchmark; `listening` is called with the bound address before
/// any node is started or awaited.
pub fn run(o: &NodeBenchOptions, listening: impl FnOnce(SocketAddr)) -> Result<UserReport> {
    let mut uo = o.run.clone();
    uo.delay_us = 0;
    uo.rate_hz = None;
    uo.nodes = None;
    uo.legacy = false;
    user::validate(&uo)?;
    if o.window == 0 {
        bail!("--window must be at least 1");
    }
    now_ns();
    let l = TcpListener::bind(&o.listen).with_context(|| format!("binding {}", o.listen))?;
    let addr = l.local_addr()?;
    listening(addr);
    let mut child = ChildGuard(None);
    if let NodeSource::Spawn { program, args } = &o.source {
        let c = Command::new(program)
            .arg("node")
            .arg("--server")
            .arg(addr.to_string())
            .arg("--once")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} node", program.display()))?;
        child.0 = Some(c);
    }
    let stream = accept(&l, o.accept_timeout, &mut child)?;
    drop(l);
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(uo.connect_timeout))?;
    let peer = stream.peer_addr()?.to_string();
    let mut reader = FrameReader::new(stream.try_clone()?, DEFAULT_MAX_MESSAGE);
    let mut writer = stream.try_clone()?;

    // The node's hello, if it sends one, comes first; a seed node sends nothing.
    let mut session = Session::default();
    let cfg = BenchmarkConfig {
        input_size: uo.input_size,
        output_size: uo.output_size,
        delay_us: 0,
    };
    corefarm_smp::blocking::write_frame(&mut writer, cfg.to_configuration().to_frame()?)?;
    let mut reason = None;
    loop {
        let f = match reader.read_frame() {
            Ok(Some(f)) => f,
            Ok(None) => bail!("the node closed the connection during configuration"),
            Err(e) => {
                let why = child.exited().unwrap_or_default();
                return Err(anyhow::anyhow!(e)).context(format!(
                    "waiting for the node's configuration response {why}"
                ));
            }
        };
        match f.ty {
            MsgType::Hello => {
                let h = Hello::decode(&f.payload)?;
                session.hello = true;
                session.features = h.features.clone();
                // Answer as a server would, so the node may send error messages.
                let mut sh = Hello::new("server");
                sh.features = vec![features::ERROR.into()];
                corefarm_smp::blocking::write_frame(&mut writer, sh.to_frame())?;
            }
            MsgType::Error => reason = Some(ErrorMsg::parse(&f.payload)?.to_string()),
            MsgType::ConfigurationResponse => {
                let r = ConfigurationResponse::parse(&f.payload)?;
                if !r.ok() {
                    bail!(
                        "the node refused the benchmarking configuration (status {}){}",
                        r.status,
                        reason.map(|r| format!(": {r}")).unwrap_or_default()
                    );
                }
                break;
            }
            t => bail!(
                "unexpected {} message from the node during configuration",
                t.name()
            ),
        }
    }
    session.nodes = Some(1);
    let mut rep = user::measure(
        stream,
        reader,
        &uo,
        Measure {
            benchmark: "node",
            peer,
            session,
            initial_credit: 0,
            window: Some(o.window),
            reconnect: None,
        },
    )?;
    if !rep.ok {
        if let Some(why) = child.exited() {
            rep.errors.push(why);
        }
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A real node manager (the library `corefarm node` runs) connects to the
    /// benchmark's port; every result must come back intact.
    #[test]
    fn measures_a_real_node_manager_without_a_server() {
        let (tx, rx) = mpsc::channel::<SocketAddr>();
        let stop = tokio_util::sync::CancellationToken::new();
        let node = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                let addr = rx.recv().unwrap();
                let opts = corefarm_node::NodeOptions {
                    server: addr.to_string(),
                    reconnect: false,
                    ..Default::default()
                };
                rt.block_on(corefarm_node::run(opts, stop))
            }
        });
        let o = NodeBenchOptions {
            listen: "127.0.0.1:0".into(),
            source: NodeSource::Accept,
            window: 8,
            accept_timeout: Duration::from_secs(10),
            run: UserBenchOptions {
                input_size: 1024,
                output_size: 64,
                count: 3,
                duration: Duration::from_millis(300),
                warmup: Duration::from_millis(100),
                drain_timeout: Duration::from_secs(5),
                ..Default::default()
            },
        };
        let rep = run(&o, |a| tx.send(a).unwrap()).unwrap();
        stop.cancel();
        let _ = node.join();
        assert!(rep.ok, "{:?}", rep.errors);
        assert_eq!(rep.benchmark, "node");
        assert!(rep.session.hello, "the node manager sends a hello");
        assert_eq!(rep.config.delay_us, 0);
        assert_eq!(rep.counts.missing, 0);
        assert!(rep.counts.received_messages > 0);
        assert_eq!(
            rep.counts.received_outputs,
            3 * rep.counts.received_messages
        );
        assert!(rep.latency.samples > 0);
    }

    #[test]
    fn no_node_is_a_clear_error() {
        let o = NodeBenchOptions {
            listen: "127.0.0.1:0".into(),
            source: NodeSource::Accept,
            window: 4,
            accept_timeout: Duration::from_millis(200),
            run: UserBenchOptions::default(),
        };
        let e = run(&o, |_| {}).unwrap_err().to_string();
        assert!(e.contains("no node connected"), "{e}");
    }

    #[test]
    fn a_node_that_dies_is_named() {
        let o = NodeBenchOptions {
            listen: "127.0.0.1:0".into(),
            source: NodeSource::Spawn {
                program: "false".into(),
                args: vec![],
            },
            window: 4,
            accept_timeout: Duration::from_secs(10),
            run: UserBenchOptions::default(),
        };
        let e = run(&o, |_| {}).unwrap_err().to_string();
        assert!(e.contains("exited"), "{e}");
    }
}
