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
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::{image, ArtifactKind};
use corefarm_toolchain::{self as toolchain, BuildKind, ImageBuilder};
use rand::{Rng, SeedableRng};
use tools::Tool;

mod tools;

const BIN: &str = env!("CARGO_BIN_EXE_corefarm");
const N: usize = 64;
const INPUT: usize = 2 * N * N * 4;
const OUTPUT: usize = N * N * 4;
const ENTRY: &str = "mat_mul_64x64";
/// Longest wait for a log line (an RTL node loads a Verilated model first).
const LOG_WAIT: Duration = Duration::from_secs(60);

/// A child process killed and reaped when dropped, so no test leaves one behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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

    /// Waits for `needle` to appear in the log; false if the process ended
    /// (or LOG_WAIT passed) without writing it.
    fn wait_for(&self, needle: &str) -> bool {
        let deadline = Instant::now() + LOG_WAIT;
        let mut st = self.log.state.lock().unwrap();
        loop {
            if st.0.contains(needle) {
                return true;
            }
            let now = Instant::now();
            if st.1 || now >= deadline {
                return false;
            }
            st = self.log.grew.wait_timeout(st, deadline - now).unwrap().0;
        }
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
/// `jobs` random pairs. A wrong product panics; not getting results at all
/// (connection, node assignment, configuration, a job error) is an `Err`.
fn multiply(
    users: SocketAddr,
    nodes: u32,
    image: &Bytes,
    jobs: usize,
    seed: u64,
) -> Result<(), String> {
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
    Ok(())
}

#[test]
fn rtl_and_native_nodes_serve_one_user_correctly() {
    let tools = [Tool::Cxx, Tool::Verilator, Tool::Make];
    if !tools::available(&tools, "this test builds RTL and native nodes") {
        return;
    }
    let image = matmul_image(2);
    let (srv, nodes_addr, users) = server();
    let rtl = [
        node(nodes_addr, "rtl-0", "rtl"),
        node(nodes_addr, "rtl-1", "rtl"),
    ];
    let native = [
        node(nodes_addr, "native-0", "native"),
        node(nodes_addr, "native-1", "native"),
    ];
    let rtl_target = image::rtl_target().unwrap();
    let native_target = image::native_target().unwrap();

    // --backends decides what each node announces.
    for (name, target) in [
        ("rtl-0", &rtl_target),
        ("rtl-1", &rtl_target),
        ("native-0", &native_target),
        ("native-1", &native_target),
    ] {
        // The server names a node `name@address` in every log line.
        let hello = format!("node hello: targets=[{target:?}] node={name}@");
        assert!(srv.wait_for(&hello), "no {hello} in\n{}", srv.log());
    }

    // One user, all four nodes, every product right.
    multiply(users, 4, &image, 48, 1).unwrap();

    // Each node instantiated its own kind of core from the one image.
    for n in &rtl {
        assert!(
            n.wait_for(&format!("loaded 2 × rtl {ENTRY} ({rtl_target})")),
            "{}",
            n.log()
        );
        assert!(!n.log().contains("native"), "{}", n.log());
    }
    for n in &native {
        assert!(
            n.wait_for(&format!("loaded 2 × native {ENTRY} ({native_target})")),
            "{}",
            n.log()
        );
    }
    for n in rtl.iter().chain(&native) {
        let log = n.log();
        assert!(!log.contains("core failed"), "{log}");
    }

    // Nothing reports per-node job counts, so show that each kind serves
    // by itself: without the native nodes, only the RTL simulations are left.
    let killed = native.len() as u64;
    drop(native);
    multiply_on_survivors(users, &image, 2, killed);
    for n in &rtl {
        assert!(!n.log().contains("core failed"), "{}", n.log());
    }
}

/// The server may not have seen the killed nodes' connections close yet and
/// hand one to the next user, which then gets no results. Each such attempt
/// ends with the server dropping the dead nodes it handed out (their
/// connections fail), and it waits (--node-wait) for live nodes to be free,
/// so `killed` failed attempts at most precede one that must succeed. A
/// wrong product still fails at once.
fn multiply_on_survivors(users: SocketAddr, image: &Bytes, nodes: u32, killed: u64) {
    let mut errors = Vec::new();
    for attempt in 0..=killed {
        match multiply(users, nodes, image, 8, 100 + attempt) {
            Ok(()) => return,
            Err(e) => errors.push(e),
        }
    }
    panic!("the surviving nodes gave no results: {errors:?}");
}
