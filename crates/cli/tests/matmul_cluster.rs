//! The matrix multiplier on a mixed cluster of real processes: one
//! `corefarm server`, two `corefarm node --backends rtl` (Verilator
//! simulations of cores/matmul/matmul.v) and two `corefarm node --backends
//! native` (cores/matmul/matmul.cpp compiled for the CPU), all on 127.0.0.1
//! with OS-assigned ports, and one user (the Rust client) multiplying random
//! 64×64 int32 matrices. One image carries both artifacts; each node picks
//! the one its --backends allow.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::{image, ArtifactKind};
use corefarm_smp::{ClusterStatus, NodeState};
use corefarm_toolchain::{self as toolchain, BuildKind, ImageBuilder};
use rand::{Rng, SeedableRng};
use tools::Tool;

use crate::support;
use crate::tools;
use support::{Proc, BIN};
const N: usize = 64;
const INPUT: usize = 2 * N * N * 4;
const OUTPUT: usize = N * N * 4;
const ENTRY: &str = "mat_mul_64x64";
/// Longest wait for the cluster to reach a state (an RTL node loads a
/// Verilated model first).
const LOG_WAIT: Duration = Duration::from_secs(60);

/// A process's stderr so far and whether it has ended; `grew` is signalled
/// on every line and at the end.
#[derive(Default)]
struct Log {
    state: Mutex<(String, bool)>,
    grew: Condvar,
}

/// A process whose stderr (its log) is read line by line as it is written.
struct Logged {
    _proc: Proc,
    log: Arc<Log>,
}

impl Logged {
    /// Owns `child` and reads its piped stderr on a thread.
    fn new(mut child: Child) -> Logged {
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Log::default());
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).split(b'\n') {
                    let Ok(line) = line else { break };
                    let mut st = log.state.lock().unwrap();
                    st.0.push_str(&String::from_utf8_lossy(&line));
                    st.0.push('\n');
                    log.grew.notify_all();
                }
                log.state.lock().unwrap().1 = true;
                log.grew.notify_all();
            }
        });
        Logged {
            _proc: Proc(child),
            log,
        }
    }

    fn log(&self) -> String {
        self.log.state.lock().unwrap().0.clone()
    }
}

/// `corefarm server` on port 0; returns it with (node port, user port).
fn server() -> (Logged, SocketAddr, SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["--log", "info", "server"])
        .args([
            "--nodes-listen",
            "127.0.0.1:0",
            "--users-listen",
            "127.0.0.1:0",
        ])
        // A user waits this long for the nodes it asks for to be free.
        .args(["--node-wait", "30"])
        // These tests check that each kind of node serves its share. Until a
        // node has answered once it is judged by its function's pace, so on
        // a loaded machine a simulation's first jobs (tens of ms each) were
        // copied to the native nodes, which then served every job: a
        // verdict that would depend on the machine's speed. Hedging has its
        // own tests.
        .args(["--hedge-factor", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start corefarm server");
    let stdout = child.stdout.take().unwrap();
    let logged = Logged::new(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    // "listening nodes=IP:PORT users=IP:PORT"
    let field = |key: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}; log:\n{}", logged.log()))
            .parse()
            .unwrap()
    };
    let (nodes, users) = (field("nodes="), field("users="));
    (logged, nodes, users)
}

fn node(server: SocketAddr, name: &str, backends: &str) -> Logged {
    let child = Command::new(BIN)
        .args(["--log", "info", "node", "--server"])
        .arg(server.to_string())
        .args(["--name", name, "--backends", backends])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start corefarm node");
    Logged::new(child)
}

/// One image with a native and an RTL artifact of cores/matmul and the
/// default table for `cores` cores; builds come from the shared build cache.
fn matmul_image(cores: u32) -> Bytes {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cores/matmul");
    let cache = toolchain::default_cache_dir();
    let native =
        toolchain::cached_build(&BuildKind::Native, &[dir.join("matmul.cpp")], ENTRY, &cache)
            .expect("build the native matrix multiplier");
    let rtl = toolchain::cached_build(
        &BuildKind::Rtl { top: ENTRY.into() },
        &[dir.join("matmul.v")],
        "",
        &cache,
    )
    .expect("build the RTL matrix multiplier");
    let table = image::default_core_table(cores, INPUT as u32, OUTPUT as u32).unwrap();
    let img = ImageBuilder::new(ENTRY, INPUT as u32, OUTPUT as u32, table)
        .artifact(
            image::native_target().unwrap(),
            ArtifactKind::Native,
            ENTRY,
            std::fs::read(native).unwrap(),
        )
        .artifact(
            image::rtl_target().unwrap(),
            ArtifactKind::Rtl,
            ENTRY,
            std::fs::read(rtl).unwrap(),
        )
        .build()
        .unwrap();
    Bytes::from(img)
}

fn random_input(rng: &mut impl Rng) -> Bytes {
    let mut v = vec![0u8; INPUT];
    rng.fill(&mut v[..]);
    Bytes::from(v)
}

/// Naive A·B with wrapping i32 arithmetic.
fn product(input: &[u8]) -> Vec<u8> {
    let w = |i: usize| i32::from_le_bytes(input[4 * i..4 * i + 4].try_into().unwrap());
    let mut out = Vec::with_capacity(OUTPUT);
    for i in 0..N {
        for j in 0..N {
            let mut s = 0i32;
            for k in 0..N {
                s = s.wrapping_add(w(i * N + k).wrapping_mul(w(N * N + k * N + j)));
            }
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    out
}

/// Connects asking for `nodes` nodes, configures `image` and multiplies
/// `jobs` random pairs, then returns the server's status as this user sees
/// it. A wrong product panics; not getting results at all (connection, node
/// assignment, configuration, a job error) is an `Err`.
fn multiply(
    users: SocketAddr,
    nodes: u32,
    image: &Bytes,
    jobs: usize,
    seed: u64,
) -> Result<ClusterStatus, String> {
    let client = Client::connect(
        &users.to_string(),
        ClientOptions {
            nodes: Some(nodes),
            name: Some("matmul-test".into()),
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| format!("connect: {e}"))?;
    if client.nodes() != Some(nodes) {
        return Err(format!(
            "assigned {:?} nodes, asked for {nodes}",
            client.nodes()
        ));
    }
    client
        .configure(&image::configuration(image.clone()).unwrap())
        .map_err(|e| format!("configure: {e}"))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let inputs: Vec<Bytes> = (0..jobs).map(|_| random_input(&mut rng)).collect();
    let results: Vec<_> = client.map(inputs.iter().cloned(), 16).collect();
    if results.len() != jobs {
        return Err(format!("{} of {jobs} results", results.len()));
    }
    for (i, (input, r)) in inputs.iter().zip(results).enumerate() {
        let out = r.map_err(|e| format!("job {i}: {e}"))?;
        assert_eq!(out.len(), OUTPUT, "job {i}");
        assert!(out[..] == product(input)[..], "job {i}: wrong product");
    }
    // The server's account of this session: which nodes served it.
    client.status().map_err(|e| format!("status: {e}"))
}

#[test]
fn rtl_and_native_nodes_serve_one_user_correctly() {
    let tools = [Tool::Cxx, Tool::Verilator, Tool::Make];
    if !tools::available(&tools, "this test builds RTL and native nodes") {
        return;
    }
    let image = matmul_image(2);
    let (_srv, nodes_addr, users) = server();
    let _rtl = [
        node(nodes_addr, "rtl-0", "rtl"),
        node(nodes_addr, "rtl-1", "rtl"),
    ];
    let native = [
        node(nodes_addr, "native-0", "native"),
        node(nodes_addr, "native-1", "native"),
    ];
    let rtl_target = image::rtl_target().unwrap();
    let native_target = image::native_target().unwrap();

    // --backends decides what each node announces (the server's status
    // lists it), so each can only load its own kind of artifact.
    let s = wait_status(users, "four named nodes", |s| {
        s.count_nodes(NodeState::Free) == 4 && s.nodes.iter().all(|n| n.name.is_some())
    });
    for n in &s.nodes {
        let name = n.name.as_deref().unwrap();
        let want = if name.starts_with("rtl") {
            &rtl_target
        } else {
            &native_target
        };
        assert_eq!(n.targets, std::slice::from_ref(want), "{name}");
    }

    // One user, all four nodes, every product right, and every node served
    // some of them: both kinds of core ran.
    let s = multiply(users, 4, &image, 48, 1).unwrap();
    assert_eq!(s.nodes.len(), 4);
    for n in &s.nodes {
        assert!(n.results > 0, "{:?} served nothing: {s:#?}", n.name);
    }

    // Without the native nodes, the RTL simulations serve alone.
    drop(native);
    wait_status(users, "only the RTL nodes left, free", |s| {
        s.nodes.len() == 2
            && s.count_nodes(NodeState::Free) == 2
            && s.nodes.iter().all(|n| n.targets == [rtl_target.clone()])
    });
    let s = multiply(users, 2, &image, 8, 100).unwrap();
    assert!(s.nodes.iter().all(|n| n.results > 0), "{s:#?}");
}

/// One program, both families: an image carrying the Intel-style matrix
/// multiplier (matmul.cpp) and the AMD-style one (matmul_vitis.cpp behind
/// its generated shim), one node accepting only Intel cores and one only
/// AMD cores. Each loads its own artifact, both serve the one user, and
/// every product is right: the user cannot tell which computed it.
#[test]
fn intel_and_amd_nodes_serve_one_program() {
    if !tools::available(&[Tool::Cxx], "this test builds native cores") {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cores/matmul");
    let cache = toolchain::default_cache_dir();
    let intel =
        toolchain::cached_build(&BuildKind::Native, &[dir.join("matmul.cpp")], ENTRY, &cache)
            .expect("build the native matrix multiplier");
    let table = image::default_core_table(1, INPUT as u32, OUTPUT as u32).unwrap();
    let intel = ImageBuilder::new(ENTRY, INPUT as u32, OUTPUT as u32, table)
        .artifact(
            image::native_target().unwrap(),
            ArtifactKind::Native,
            ENTRY,
            std::fs::read(intel).unwrap(),
        )
        .build()
        .unwrap();
    let amd = toolchain::build_image(&toolchain::BuildSpec {
        name: ENTRY.into(),
        cores: 1,
        hls: Some((dir.join("matmul_vitis.cpp"), ENTRY.into())),
        family: image::Family::Amd,
        ..toolchain::BuildSpec::default()
    })
    .expect("build the Vitis-style matrix multiplier");
    let image = Bytes::from(toolchain::merge_images(&[intel, amd.image]).unwrap());

    let (_srv, nodes_addr, users) = server();
    let family_node = |name: &str, family: &str| {
        let child = Command::new(BIN)
            .args(["--log", "info", "node", "--server"])
            .arg(nodes_addr.to_string())
            .args(["--name", name, "--backends", "native", "--families", family])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start corefarm node");
        Logged::new(child)
    };
    let nodes = [family_node("intel-0", "intel"), family_node("amd-0", "amd")];
    wait_status(users, "two named nodes", |s| {
        s.count_nodes(NodeState::Free) == 2 && s.nodes.iter().all(|n| n.name.is_some())
    });
    let s = multiply(users, 2, &image, 24, 3).unwrap();
    for n in &s.nodes {
        assert!(n.results > 0, "{:?} served nothing: {s:#?}", n.name);
    }
    // Each node says which style of core it loaded.
    for (node, family) in nodes.iter().zip(["intel", "amd"]) {
        let log = node.log();
        assert!(
            log.lines()
                .any(|l| l.contains("loaded") && l.contains(&format!(", {family}, "))),
            "{family} node:\n{log}"
        );
    }
}

/// Asks the server's status as an observer (a user taking no node) until
/// `cond` holds; the pause between questions is not the synchronisation.
fn wait_status(
    users: SocketAddr,
    what: &str,
    cond: impl Fn(&ClusterStatus) -> bool,
) -> ClusterStatus {
    let watcher = Client::connect(
        &users.to_string(),
        ClientOptions {
            nodes: Some(0),
            name: Some("observer".into()),
            io_timeout: Some(Duration::from_secs(30)),
            ..ClientOptions::default()
        },
    )
    .expect("observer connects");
    support::poll_until(what, LOG_WAIT, || watcher.status().expect("status"), cond)
}
