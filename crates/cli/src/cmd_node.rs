//! `corefarm node`: node managers that connect to a server.

use std::time::Duration;

use clap::Args;
use corefarm_node::NodeOptions;
use tokio_util::sync::CancellationToken;

use crate::cmd_server::{metrics_field, parse_trust, runtime, serve_metrics, stop_on_signal};
use crate::flags::FlagError;

#[derive(Args, Clone)]
pub struct NodeArgs {
    /// Server node port, HOST:PORT; or several, comma-separated (an active
    /// server and its standbys): the node connects to the first that
    /// answers and stays with it until that connection ends, then tries the
    /// next address, round-robin, with back-off.
    #[arg(
        long,
        default_value = "127.0.0.1:8888",
        value_name = "HOST:PORT[,HOST:PORT...]"
    )]
    pub server: String,
    /// File holding the node secret of a server with an auth file (mode
    /// 600). Default: $COREFARM_SECRET, or the file $COREFARM_SECRET_FILE.
    #[arg(long)]
    pub secret_file: Option<std::path::PathBuf>,
    /// Number of independent node managers (separate connections) to run in this process.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics and the node managers' status as JSON at /status.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub tls: crate::cmd_tls::ClientTlsArgs,
    #[command(flatten)]
    pub node: NodeTuning,
}

#[derive(Args, Clone)]
pub struct NodeTuning {
    /// Node name announced to the server (suffixed with `-<i>` when --count > 1).
    #[arg(long, default_value = "node")]
    pub name: String,
    /// Memory guard: bytes of queued input and unsent output a node may hold
    /// before it stops reading from the server.
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    pub memory_limit: usize,
    /// Largest message payload this node accepts or sends, in bytes; a
    /// configuration whose inputs or outputs cannot fit is refused with the
    /// reason (the server's own limit applies too when it is smaller).
    #[arg(long, default_value_t = corefarm_smp::DEFAULT_MAX_MESSAGE,
          value_parser = crate::cmd_server::parse_max_message)]
    pub node_max_message: u32,
    /// Behave exactly like a seed-format node: no hello, no error messages.
    #[arg(long)]
    pub no_hello: bool,
    /// Exit when the connection ends instead of reconnecting.
    #[arg(long)]
    pub once: bool,
    /// Run only images signed by one of these Ed25519 public keys (64 hex
    /// digits, or a .pub file from `corefarm image keygen`); anything else
    /// is refused with the reason. Default: run every image.
    #[arg(long, value_name = "PUBKEY", num_args = 1.., value_parser = parse_trust)]
    pub trust: Vec<corefarm_cores::signature::PublicKey>,
    /// Milliseconds every configuration takes before it is answered: emulates
    /// a board's programming time (tens to hundreds of ms for a bitstream),
    /// so shared-mode reconfiguration can be studied in simulation.
    #[arg(long, default_value_t = 0)]
    pub reconfigure_delay_ms: u64,
    /// Bytes per chunk a message is cut into for streaming handlers
    /// (docs/streams.md); at most 65 472.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=65472))]
    pub spin_chunk_size: u32,
    /// Payload handlers of one message running at once (streaming handlers).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub spin_threads: u32,
    /// Handler worker processes per handler-carrying configuration, so
    /// that many messages run their streaming handlers at once (each
    /// worker runs one message at a time, so a crash fails only its
    /// message; all share the handler sets' memory). Default: 2, or 1 on a
    /// one-CPU machine.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub handler_workers: Option<u32>,
    /// Offer chunks on the server link (so that an urgent message need not wait behind a large one) with this chunk size in
    /// bytes: the server sends data larger than the size in force (the
    /// smaller of this and its `--node-chunk-size`) as chunks interleaved by
    /// priority class, and streaming handlers start on a message's first
    /// chunk. The same size is offered on a group's peer links (a link uses
    /// the smaller of its two nodes' offers). 0: do not offer chunks;
    /// otherwise 512 to 1048576.
    #[arg(long, default_value_t = corefarm_smp::stream::DEFAULT_CHUNK_SIZE,
          value_parser = crate::cmd_server::parse_chunk_size)]
    pub chunk_size: u32,
    /// Peer port of the node fabric (groups, docs/collectives.md): where the
    /// other members of a group reach this node. An unspecified IP means the
    /// interface the node reaches the server through; port 0 picks a free
    /// port (give port 0 with --count > 1); `none` disables groups.
    #[arg(long, default_value = "0.0.0.0:0", value_parser = parse_peer_listen)]
    pub peer_listen: PeerListen,
    /// Hardware-core backends this node may load, comma-separated: native
    /// (HLS C++ compiled for this CPU), rtl (Verilog simulated by Verilator),
    /// fpga (Cyclone V bitstream through the HPS-to-FPGA bridge), zynq
    /// (AMD Zynq bitstream through the FPGA manager, UIO and u-dma-buf). The
    /// node announces the matching targets and refuses configurations it
    /// cannot run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,rtl",
        value_parser = ["native", "rtl", "fpga", "zynq"],
        help_heading = "Backends"
    )]
    pub backends: Vec<String>,
    /// FPGA families whose native and RTL artifacts this node runs,
    /// comma-separated: intel (Intel HLS cores: Avalon agent, memories in
    /// the core) and amd (Vitis HLS cores: ap_ctrl_hs on AXI4-Lite, m_axi
    /// pointers into host memory). An image may carry one function in both
    /// styles; each node runs the one it supports, with the same result.
    /// A node running one family announces its native and RTL targets for
    /// it (rtl-x86_64-linux:amd), so the server sends it only images
    /// carrying an artifact of that family. (The Cyclone V backend runs
    /// Intel cores only; the Zynq backend either style.)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "intel,amd",
        value_parser = parse_family,
        help_heading = "Backends"
    )]
    pub families: Vec<corefarm_cores::image::Family>,
    /// Seconds one job may keep a core busy before the core counts as hung:
    /// the job fails with an error, the core is reset where the backend can.
    #[arg(long, default_value_t = 10.0, value_parser = NodeTuning::parse_seconds, help_heading = "Backends")]
    pub core_timeout: f64,
    /// File mapped for the HPS-to-FPGA bridge (opened read/write, O_SYNC).
    #[arg(
        long,
        default_value = "/dev/mem",
        help_heading = "FPGA backend (--backends fpga)"
    )]
    pub fpga_device: std::path::PathBuf,
    /// Physical address of the bridge window; core-table
    /// addresses in base..base+span are physical, those below span are
    /// bridge-relative. Decimal or 0x-hex.
    #[arg(long, default_value = "0xC0000000", value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_base: u64,
    /// Offset of the bridge within --fpga-device (default: --fpga-base,
    /// which is right for /dev/mem). Decimal or 0x-hex.
    #[arg(long, value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_device_offset: Option<u64>,
    /// Bytes of the bridge window. Decimal or 0x-hex.
    #[arg(long, default_value = "0x3C000000", value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_span: u64,
    /// How bitstreams are programmed. `fpga-manager` uses the
    /// socfpga kernels' /sys/class/fpga_manager/fpga0 with /lib/firmware;
    /// anything else is a command line (shell-style quoting, not run by a
    /// shell) where `{bitstream}` becomes the path of a file holding the
    /// bitstream; without the placeholder the bitstream is piped to its
    /// standard input, e.g. "dd of=/dev/fpga0". It must exit 0.
    #[arg(long, default_value = "fpga-manager", value_parser = NodeTuning::parse_programmer, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_programmer: corefarm_cores::fpga::Programmer,
    /// Wait for each core's completion on its UIO interrupt (the core's irq
    /// wired to the HPS, a generic-uio device-tree node whose reg covers the
    /// core's CSR) instead of polling its done register.
    #[arg(long, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_interrupts: bool,
    /// The FPGA manager under /sys/class/fpga_manager that programs the
    /// Zynq's bitstream (written to /lib/firmware).
    #[arg(
        long,
        default_value = "fpga0",
        help_heading = "Zynq backend (--backends zynq)"
    )]
    pub zynq_fpga_manager: String,
    /// The u-dma-buf buffer (/dev/NAME) shared out among the cores for their
    /// m_axi arguments; `none` for designs whose cores do not master the bus.
    #[arg(
        long,
        default_value = "udmabuf0",
        help_heading = "Zynq backend (--backends zynq)"
    )]
    pub zynq_udmabuf: String,
    /// Poll each core's done register instead of waiting on its UIO
    /// interrupt.
    #[arg(long, help_heading = "Zynq backend (--backends zynq)")]
    pub zynq_poll: bool,
    /// A device-tree overlay (.dtbo) applied through configfs for each
    /// configuration, instead of the FPGA manager: its firmware-name is
    /// corefarm.bin, and it adds the cores' UIO devices and the u-dma-buf
    /// buffer. On a board without configfs overlays the FPGA manager
    /// programs the bitstream (with a warning).
    #[arg(long, help_heading = "Zynq backend (--backends zynq)")]
    pub zynq_overlay: Option<std::path::PathBuf>,
    /// Directory the board's /sys, /dev and /lib/firmware are under, for
    /// the zynq backend and --fpga-interrupts (a chroot; `/` on a board).
    #[arg(
        long,
        default_value = "/",
        help_heading = "Zynq backend (--backends zynq)"
    )]
    pub board_root: std::path::PathBuf,
}

fn parse_family(
    s: &str,
) -> Result<corefarm_cores::image::Family, corefarm_cores::image::UnknownFamily> {
    s.parse()
}

/// `--peer-listen`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub struct PeerListen(Option<std::net::SocketAddr>);

fn parse_peer_listen(s: &str) -> Result<PeerListen, FlagError> {
    if s == "none" {
        return Ok(PeerListen(None));
    }
    s.parse()
        .map(|a| PeerListen(Some(a)))
        .map_err(|error| FlagError::PeerListen {
            given: s.to_string(),
            error,
        })
}

impl NodeTuning {
    pub fn options(&self, server: String) -> NodeOptions {
        let has = |b: &str| self.backends.iter().any(|x| x == b);
        let fpga = has("fpga").then(|| corefarm_cores::fpga::FpgaOptions {
            programmer: self.fpga_programmer.clone(),
            device: self.fpga_device.clone(),
            device_offset: self.fpga_device_offset.unwrap_or(self.fpga_base),
            base: self.fpga_base,
            span: self.fpga_span,
            interrupts: self
                .fpga_interrupts
                .then(|| corefarm_board::Root::new(&self.board_root)),
        });
        let zynq = has("zynq").then(|| corefarm_cores::zynq::ZynqOptions {
            root: corefarm_board::Root::new(&self.board_root),
            fpga_manager: self.zynq_fpga_manager.clone(),
            udmabuf: (self.zynq_udmabuf != "none").then(|| self.zynq_udmabuf.clone()),
            interrupts: !self.zynq_poll,
            overlay: self.zynq_overlay.clone(),
        });
        let defaults = corefarm_cores::LoadOptions::default();
        NodeOptions {
            server,
            name: self.name.clone(),
            hello: !self.no_hello,
            memory_limit: self.memory_limit,
            max_message: self.node_max_message,
            reconnect: !self.once,
            reconfigure_delay: Duration::from_millis(self.reconfigure_delay_ms),
            load: corefarm_cores::LoadOptions {
                native: has("native"),
                rtl: has("rtl"),
                fpga,
                families: self.families.clone(),
                zynq,
                driver: corefarm_cores::DriverOptions {
                    timeout: Duration::from_secs_f64(self.core_timeout),
                    ..defaults.driver
                },
                trust: corefarm_cores::signature::Trust(self.trust.clone()),
                ..defaults
            },
            peer_listen: self.peer_listen.0,
            spin: corefarm_node::spin::SpinOptions {
                chunk_size: self.spin_chunk_size as usize,
                threads: self.spin_threads as usize,
                workers: self
                    .handler_workers
                    .map_or_else(corefarm_node::spin::SpinOptions::default_workers, |n| {
                        n as usize
                    }),
            },
            chunk_size: self.chunk_size,
            ..NodeOptions::default()
        }
    }

    /// `--fpga-base`/`--fpga-span`: decimal or 0x-prefixed hexadecimal.
    fn parse_u64(s: &str) -> Result<u64, FlagError> {
        let t = s.trim().replace('_', "");
        let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse(),
        };
        r.map_err(|error| FlagError::Number {
            given: s.to_string(),
            error,
        })
    }

    /// `--core-timeout`: positive, finite seconds (Duration panics otherwise).
    fn parse_seconds(s: &str) -> Result<f64, FlagError> {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
            _ => Err(FlagError::PositiveSeconds(s.to_string())),
        }
    }

    /// `--fpga-programmer`: `fpga-manager` or a command line.
    fn parse_programmer(s: &str) -> Result<corefarm_cores::fpga::Programmer, FlagError> {
        if s.trim() == "fpga-manager" {
            return Ok(corefarm_cores::fpga::Programmer::default());
        }
        match shlex::split(s) {
            Some(argv) if !argv.is_empty() => Ok(corefarm_cores::fpga::Programmer::Command(argv)),
            Some(_) => Err(FlagError::EmptyProgrammer),
            None => Err(FlagError::UnbalancedQuotes(s.to_string())),
        }
    }
}

pub fn run_node(args: NodeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.count >= 1, "--count must be at least 1");
    let secret = corefarm_smp::auth::Secret::from_file_or_env(args.secret_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    runtime()?.block_on(async {
        let stop = CancellationToken::new();
        stop_on_signal(&stop);
        let mut opts = args.node.options(args.server);
        if let Some(f) = &opts.load.fpga {
            f.check()
                .map_err(|e| anyhow::anyhow!("--backends fpga: {e} (--fpga-device)"))?;
        }
        if let Some(z) = &opts.load.zynq {
            z.check()
                .map_err(|e| anyhow::anyhow!("--backends zynq: {e}"))?;
        }
        opts.secret = secret;
        opts.tls = args.tls.load()?;
        if let Some(addr) = args.metrics_listen.as_deref() {
            let t = std::sync::Arc::new(corefarm_node::metrics::NodeTelemetry::default());
            opts.telemetry = Some(t.clone());
            let endpoints = corefarm_node::metrics::NodeEndpoints(t);
            let bound = serve_metrics(Some(addr), endpoints, &stop).await?;
            println!("listening{}", metrics_field(bound));
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        corefarm_node::run_many(opts, args.count, stop).await?;
        Ok(())
    })
}
