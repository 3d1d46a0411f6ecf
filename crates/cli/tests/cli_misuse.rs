//! The command line misused as a new user would: the wrong half of a key
//! pair, limits that would refuse every peer, a benchmark of no duration,
//! and an interrupted soak. Each is refused at once with what to do (or,
//! for the soak, stops cleanly), never left running or half-working.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use support::{Proc, BIN};

/// Runs `corefarm args`, killing it if it has not exited within `limit`
/// (a misused command that does not refuse would run for ever): the exit
/// code (None if it had to be killed) and its stderr.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run corefarm");
    let mut p = Proc(child);
    let code = wait_exit(&mut p.0, limit).map(|s| s.code().unwrap_or(-1));
    drop(p); // kills it if it is still running
    (code, std::fs::read_to_string(&err_path).unwrap())
}

/// Waits for `child` to exit, for at most `limit`; polls its status, which
/// is the condition itself.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A refusal: exits with `code` within a few seconds, says `needle`, and
/// prints no panic or backtrace.
fn refused(args: &[&str], code: i32, needle: &str) -> String {
    let (got, err) = run_bounded(args, Duration::from_secs(10));
    assert_eq!(got, Some(code), "{args:?} was not refused: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
    for bad in ["panicked", "stack backtrace", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "{args:?} printed {bad:?}: {err}");
    }
    err
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A key pair from `image keygen` and an unsigned image built from a
/// bitstream (no compiler needed), in `dir`.
fn key_and_image(dir: &Path) -> (String, String) {
    let key = dir.join("ops.key").to_str().unwrap().to_string();
    let st = Command::new(BIN)
        .args(["image", "keygen", "-o", &key])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let rbf = dir.join("design.rbf");
    std::fs::write(&rbf, [0x55u8; 64]).unwrap();
    let img = dir.join("design.cfimg").to_str().unwrap().to_string();
    let st = Command::new(BIN)
        .args(["image", "build", "--rbf", rbf.to_str().unwrap()])
        .args(["--input-size", "16", "--output-size", "16", "-o", &img])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    (key, img)
}

/// Both halves of a key pair are 64 hex digits, so `image sign --key
/// KEY.pub` (made private, as the refusal of a readable key file used to
/// advise) signed with a key derived from the public one: a signature no
/// node trusts, reported as success. Now the public half, a directory and
/// a secret key named like a public one are refused with what to give.
#[test]
fn image_sign_refuses_the_public_half_of_a_key_pair() {
    let dir = tempfile::tempdir().unwrap();
    let (key, img) = key_and_image(dir.path());
    let public = format!("{key}.pub");
    let out = dir.path().join("signed.cfimg");
    let out = out.to_str().unwrap();
    for mode in [0o644, 0o600] {
        chmod(Path::new(&public), mode);
        let err = refused(
            &["image", "sign", &img, "--key", &public, "-o", out],
            1,
            "is a public key",
        );
        assert!(err.contains(&format!("secret key {key}")), "{err}");
        assert!(
            !err.contains("chmod"),
            "no advice to chmod a public key: {err}"
        );
        assert!(!Path::new(out).exists(), "nothing was signed");
    }
    let d = dir.path().to_str().unwrap();
    refused(
        &["image", "sign", &img, "--key", d, "-o", out],
        1,
        "is a directory",
    );
    let named_pub = dir.path().join("other.pub");
    refused(
        &["image", "keygen", "-o", named_pub.to_str().unwrap()],
        1,
        "would be taken for a public key",
    );
    assert!(!named_pub.exists());
    // The secret half still signs, with the key whose .pub nodes trust.
    let o = Command::new(BIN)
        .args(["image", "sign", &img, "--key", &key, "-o", out])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pubhex = std::fs::read_to_string(&public).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(pubhex.trim()),
        "signed with the key of {public}"
    );
}

/// `node --trust KEY` with the secret half (a file of 64 hex digits too)
/// made the node trust a key nobody signs with, and put the secret on the
/// node; a missing file was called "not an Ed25519 public key".
#[test]
fn node_trust_refuses_a_secret_key_and_names_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = key_and_image(dir.path());
    // Without the refusal the node would join this server and run.
    let (_srv, nodes, _) = support::server(&[]);
    let nodes = nodes.to_string();
    let node =
        |trust: &str| ["node", "--server", &nodes, "--once", "--trust", trust].map(String::from);
    let args = node(&key);
    let err = refused(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        2,
        "is a secret signing key",
    );
    assert!(err.contains(&format!("--trust {key}.pub")), "{err}");
    let missing = dir.path().join("absent.pub");
    let args = node(missing.to_str().unwrap());
    refused(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        2,
        "(no such file)",
    );
}

/// Limits under which no peer could ever work were accepted: a server with
/// `--max-message 0` (or `--max-users 0`) ran and failed every user with
/// "server answered the hello with a configuration-response message"; one
/// with `--node-chunk-size 1` cut every message into 1-byte chunks (a
/// thousandth of the throughput); a node with `--node-max-message 0`
/// failed on the server's hello. Each is now refused at start.
#[test]
fn limits_that_no_peer_could_work_with_are_refused_at_start() {
    let listen = [
        "--nodes-listen",
        "127.0.0.1:0",
        "--users-listen",
        "127.0.0.1:0",
    ];
    for (flag, value, needle) in [
        ("--max-message", "0", "at least 1024 bytes"),
        ("--max-message", "100", "at least 1024 bytes"),
        ("--max-users", "0", "would refuse every connection"),
        ("--max-nodes", "0", "would refuse every connection"),
        ("--node-chunk-size", "1", "0 (no chunks) or 512 to 1048576"),
        (
            "--node-chunk-size",
            "2000000",
            "0 (no chunks) or 512 to 1048576",
        ),
    ] {
        for cmd in ["server", "local"] {
            let mut args = vec![cmd];
            args.extend(listen);
            args.extend([flag, value]);
            refused(&args, 2, needle);
        }
    }
    let (_srv, nodes, _) = support::server(&[]);
    let nodes = nodes.to_string();
    for (flag, needle) in [
        ("--node-max-message", "at least 1024 bytes"),
        ("--chunk-size", "0 (no chunks) or 512 to 1048576"),
    ] {
        refused(
            &["node", "--server", &nodes, "--once", flag, "1"],
            2,
            needle,
        );
    }
    // The bounds themselves are accepted: the server starts and says so.
    let (_ok, _, users) = support::server(&[
        "--max-message",
        "1024",
        "--max-users",
        "1",
        "--node-chunk-size",
        "512",
    ]);
    assert_ne!(users.port(), 0);
}

/// `bench echo --duration 0` printed "0.00 bit/s (NaN msg/s)" and exited 0.
#[test]
fn bench_echo_refuses_a_zero_duration() {
    refused(
        &["bench", "echo", "--duration", "0"],
        1,
        "--duration must be more than 0 seconds",
    );
}

/// Direct children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            rest.split_whitespace().next() != Some("Z")
        }
        Err(_) => false,
    }
}

/// Kills the processes it names when dropped, so that the test leaves
/// nothing behind even when the soak did.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &p in &self.0 {
            if alive(p) {
                // SAFETY: kill(2) on a pid this test saw as the soak's child.
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// Ctrl-C on `bench soak` ended it without its clean-up: the server and
/// node managers it had started kept running (and reconnecting) for ever.
/// Now SIGINT stops them, says so, and exits 130.
#[test]
fn an_interrupted_soak_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let child = Command::new(BIN)
        .args(["bench", "soak", "--duration", "5m", "--nodes", "2"])
        .args(["--users", "1", "--kill-every", "1h"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let mut soak = Proc(child);
    let pid = soak.0.id();
    // The server and both node managers are up.
    let started = support::poll_until(
        "the soak's server and two node managers",
        Duration::from_secs(60),
        || children(pid),
        |c| c.len() >= 3,
    );
    let _guard = KillOnDrop(started.clone());
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    let status = wait_exit(&mut soak.0, Duration::from_secs(20)).expect("the soak exits");
    let err = std::fs::read_to_string(&err_path).unwrap();
    let left = support::poll_until(
        "the soak's processes to be gone",
        Duration::from_secs(10),
        || {
            started
                .iter()
                .copied()
                .filter(|&p| alive(p))
                .collect::<Vec<_>>()
        },
        |l| l.is_empty(),
    );
    assert!(left.is_empty());
    assert_eq!(status.code(), Some(130), "{status:?}: {err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
}

/// `corefarm status` pointed at the server's node port said "a seed-only
/// server? try legacy mode" (status has no legacy mode), and at the metrics
/// port "protocol error: unknown message type 72": neither said that the
/// address is the wrong port of a corefarm server, nor which one to give.
/// The node port now says so itself (the hello offered error messages);
/// the metrics port speaks HTTP, and the client says it.
#[test]
fn status_at_the_wrong_port_names_the_user_port() {
    let (_srv, nodes, _) = support::server(&[]);
    let err = refused(
        &["status", "--server", &nodes.to_string(), "--timeout", "5"],
        1,
        "on the node port",
    );
    assert!(
        err.contains("users connect to the server's user port"),
        "{err}"
    );
    let (_local, [_, _, metrics]) = support::local_cluster_with_metrics(0, &[]);
    let err = refused(
        &["status", "--server", &metrics, "--timeout", "5"],
        1,
        "did not complete the hello exchange",
    );
    assert!(
        err.contains(&format!("Is {metrics} the server's user port?"))
            && err.contains("users=ADDR"),
        "{err}"
    );
}

#[test]
fn bench_compare_refuses_a_threshold_that_is_not_a_change() {
    for t in ["--threshold=nan", "--threshold=-0.1", "--threshold=inf"] {
        refused(
            &["bench", "compare", "old.json", "new.json", t],
            2,
            "is not a relative change",
        );
    }
}

#[test]
fn image_inspect_refuses_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.cfimg");
    std::fs::write(&empty, b"").unwrap();
    refused(
        &["image", "inspect", empty.to_str().unwrap()],
        1,
        "is empty: neither a corefarm image nor a bitstream",
    );
}

/// `node --backends fpga` with a bridge device it cannot open started,
/// connected, and failed only at the first configuration, on the user's
/// side: it is refused at start with the device named.
#[test]
fn a_node_with_an_fpga_device_it_cannot_open_is_refused_at_start() {
    let node = |device: &str, needle: &str| {
        let args = [
            "node",
            "--server",
            "127.0.0.1:9",
            "--backends",
            "fpga",
            "--fpga-device",
            device,
        ];
        refused(&args, 1, needle)
    };
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-bridge");
    let missing = missing.to_str().unwrap();
    let err = node(missing, "cannot open the bridge device");
    assert!(
        err.contains(missing) && err.contains("--fpga-device"),
        "{err}"
    );
    // A regular file too small for the window is refused too.
    let small = dir.path().join("small");
    std::fs::write(&small, [0u8; 64]).unwrap();
    node(small.to_str().unwrap(), "the bridge window needs");
}

/// `node --backends zynq` on a machine without the board's interfaces is
/// refused at start, the missing piece named with what provides it.
#[test]
fn a_zynq_node_without_its_board_interfaces_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let node = |needle: &str| {
        let args = [
            "node",
            "--server",
            "127.0.0.1:9",
            "--backends",
            "zynq",
            "--board-root",
            root,
        ];
        refused(&args, 1, needle)
    };
    let err = node("--backends zynq: the FPGA manager is missing");
    assert!(err.contains("CONFIG_FPGA_MGR"), "{err}");
    let mgr = dir.path().join("sys/class/fpga_manager/fpga0");
    std::fs::create_dir_all(&mgr).unwrap();
    std::fs::write(mgr.join("firmware"), "").unwrap();
    std::fs::write(mgr.join("state"), "operating\n").unwrap();
    std::fs::create_dir_all(dir.path().join("lib/firmware")).unwrap();
    let err = node("--backends zynq: UIO is missing");
    assert!(err.contains("generic-uio"), "{err}");
    let uio = dir.path().join("sys/class/uio/uio0");
    std::fs::create_dir_all(uio.join("maps/map0")).unwrap();
    std::fs::write(uio.join("name"), "core\n").unwrap();
    let err = node("--backends zynq: u-dma-buf is missing");
    assert!(err.contains("insmod u-dma-buf.ko"), "{err}");
}
