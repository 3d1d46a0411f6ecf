use super::calls::without_labels;
use super::*;
use corefarm_model::collectives::PerTree;
use corefarm_smp::group::GroupCtl;
use corefarm_smp::tls::rustls::{ServerConfig, ServerConnection, StreamOwned};
use corefarm_smp::ReduceOp;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;

/// A member's peer address that is never contacted (tests of the control
/// plane only).
pub(crate) const NO_PEER: &str = "127.0.0.1:9";

/// A scripted server: agrees `group-priority` or not (an older server),
/// opens a group whose rank r has peer address `peers[r]`, answers every
/// command for every rank, and returns the command bytes (byte 8 of each
/// command) it received once the client closes the connection.
pub(crate) fn server(agree: bool, peers: &[&str]) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    server_failing(agree, peers, None)
}

/// [`server`], where rank 0 fails the first command `fail` names with
/// (culprit, reason), as a node reports a collective that ends the group.
fn server_failing(
    agree: bool,
    peers: &[&str],
    fail: Option<(Cmd, u32, &'static str)>,
) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    scripted(None, agree, peers, fail)
}

/// One TLS server connection as the scripted server's reader and writer.
/// It reads and writes on one thread, in turn, so a lock never waits.
#[derive(Clone)]
struct Shared(Arc<Mutex<StreamOwned<ServerConnection, TcpStream>>>);

impl Read for Shared {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.lock().unwrap().read(buf)
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap().flush()
    }
}

type Halves = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// [`server_failing`], speaking TLS with `tls`.
fn scripted(
    tls: Option<Arc<ServerConfig>>,
    agree: bool,
    peers: &[&str],
    fail: Option<(Cmd, u32, &'static str)>,
) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    let mut fail = fail;
    let peers: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let (rd, mut w): Halves = match tls {
            None => (Box::new(s.try_clone().unwrap()), Box::new(s)),
            Some(cfg) => {
                let conn = ServerConnection::new(cfg).unwrap();
                let shared = Shared(Arc::new(Mutex::new(StreamOwned::new(conn, s))));
                (Box::new(shared.clone()), Box::new(shared))
            }
        };
        let mut r = FrameReader::new(rd, 1 << 20);
        let hello = Hello::decode(&r.read_frame().unwrap().unwrap().payload).unwrap();
        assert!(hello.has(features::GROUP_PRIORITY), "the client offers it");
        let mut answer = Hello::new("server");
        answer.features = vec![features::ERROR.into(), features::GROUP.into()];
        if agree {
            answer.features.push(features::GROUP_PRIORITY.into());
        }
        write_frame(&mut w, answer.to_frame()).unwrap();
        let mut bytes = Vec::new();
        while let Ok(Some(f)) = r.read_frame() {
            match f.ty {
                MsgType::GroupCtl => {
                    if let Ok(GroupCtl::Open { .. }) = GroupCtl::decode(&f.payload) {
                        let members = (0..)
                            .zip(&peers)
                            .map(|(rank, peer)| GroupMember {
                                rank,
                                name: format!("n{rank}"),
                                peer: peer.clone(),
                            })
                            .collect();
                        let opened = GroupCtl::Opened {
                            group: 1,
                            members,
                            token: 0,
                        };
                        write_frame(&mut w, opened.to_frame()).unwrap();
                    }
                }
                MsgType::GroupCmd => {
                    bytes.push(f.payload[8]);
                    let c = GroupCmd::parse(f.payload).unwrap();
                    if let Some((_, culprit, reason)) = fail.take_if(|(cmd, ..)| *cmd == c.cmd) {
                        let code = corefarm_smp::ErrorCode::Internal;
                        let no = GroupReply::failed(c.seq, 0, code, culprit, reason);
                        write_frame(&mut w, no.to_frame().unwrap()).unwrap();
                        continue;
                    }
                    for rank in 0..peers.len() as u32 {
                        let ok = GroupReply::ok(c.seq, rank, Bytes::new());
                        write_frame(&mut w, ok.to_frame().unwrap()).unwrap();
                    }
                }
                _ => {}
            }
        }
        bytes
    });
    (addr, t)
}

#[test]
fn auto_follows_the_stage_model() {
    // Short messages: the binomial tree's log2 n stages beat the chain's n − 1.
    assert_eq!(choose(8, 16), Algo::Binomial);
    // Long ones: the pipelined chain's c + n − 2 beats log2(n)·c.
    assert_eq!(choose(4 << 20, 16), Algo::Linear);
    assert_eq!(choose(4 << 20, 4), Algo::Linear);
    assert_eq!(choose(1 << 20, 2), Algo::Binomial);
}

/// A calibration fitted to a synthetic machine: 100 µs per command,
/// `hop` per stage of each tree, 1 ns per byte per stage.
fn synthetic(hop: PerTree) -> Calibration {
    use corefarm_model::collectives::{predict, Params, Sample, Shape};
    let p = Params {
        t0: 100e-6,
        hop,
        byte: PerTree::same(1e-9),
        ..Params::default()
    };
    let mut samples = Vec::new();
    for op in [ModelOp::Bcast, ModelOp::Reduce] {
        for algo in [ModelAlgo::Linear, ModelAlgo::Binomial, ModelAlgo::Star] {
            for n in [2, 4, 8, 16] {
                for bytes in [8, 1 << 16, 4 << 20] {
                    let shape = Shape { op, algo, n, bytes };
                    let seconds = predict(&p, shape, CHUNK);
                    samples.push(Sample { shape, seconds });
                }
            }
        }
    }
    Calibration::from_samples(samples, CHUNK, "synthetic".into()).unwrap()
}

#[test]
fn auto_uses_the_calibrated_model() {
    let m = synthetic(PerTree::same(20e-6));
    assert_eq!(auto(Some(&m), Cmd::Bcast, Some(8), 16), Algo::Binomial);
    assert_eq!(
        auto(Some(&m), Cmd::Allreduce, Some(4 << 20), 16),
        Algo::Linear
    );
    // 256 KiB over 4 members: 4 chunks; chain 6 stages, binomial 8.
    assert_eq!(
        auto(Some(&m), Cmd::Reduce, Some(256 << 10), 4),
        Algo::Linear
    );
    // A machine where the root's sends are cheap and forwarding is dear
    // (3 star stages at 10 µs beat 2 binomial stages at 40 µs): the
    // model picks the star, which the stage count never does.
    let cheap_root = synthetic(PerTree {
        linear: 40e-6,
        binomial: 40e-6,
        star: 10e-6,
    });
    assert_eq!(auto(Some(&cheap_root), Cmd::Bcast, Some(8), 4), Algo::Star);
    assert_eq!(choose(8, 4), Algo::Binomial);
    // Unknown sizes: binomial; no model: the stage count.
    assert_eq!(auto(Some(&m), Cmd::Bcast, None, 16), Algo::Binomial);
    assert_eq!(
        auto(None, Cmd::Bcast, Some(4 << 20), 16),
        choose(4 << 20, 16)
    );
}

#[test]
fn algorithm_names() {
    assert_eq!("star".parse::<Algorithm>(), Ok(Algorithm::Star));
    assert_eq!(
        "ring".parse::<Algorithm>(),
        Err(UnknownAlgorithm("ring".into()))
    );
}

fn open(addr: &str, n: u32) -> Group {
    let mut opts = GroupOptions::new(n);
    opts.model = None;
    Group::open(addr, opts).unwrap()
}

#[test]
fn a_reduction_of_the_wrong_type_is_refused_before_it_is_sent() {
    let (addr, t) = server(true, &[NO_PEER; 2]);
    let mut g = open(&addr, 2);
    g.scatter_rows("v", DType::F32, &[0; 16], 4).unwrap();
    let algo = Algorithm::Binomial;
    let e = g
        .allreduce("v", "s", DType::I32, ReduceOp::Sum, algo)
        .unwrap_err();
    assert!(matches!(e, GroupError::Usage(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid use of the group: buffer \"v\" holds f32 elements, the allreduce wants i32 \
         (pass dtype f32)"
    );
    let e = g
        .reduce(1, "v", "m", DType::U32, ReduceOp::Max, algo)
        .unwrap_err();
    assert!(matches!(e, GroupError::Usage(_)), "{e:?}");
    // The group goes on, and the right type passes.
    g.allreduce("v", "s", DType::F32, ReduceOp::Sum, algo)
        .unwrap();
    g.allreduce("s", "t", DType::F32, ReduceOp::Sum, algo)
        .unwrap();
    // A broadcast's destination takes its type; an unknown buffer is the nodes' to check.
    g.bcast(0, "t", "b", DType::F32, algo).unwrap();
    let e = g
        .allreduce("b", "c", DType::I64, ReduceOp::Sum, algo)
        .unwrap_err();
    assert!(matches!(e, GroupError::Usage(_)), "{e:?}");
    g.allreduce("elsewhere", "d", DType::I64, ReduceOp::Sum, algo)
        .unwrap();
    drop(g);
    let (put, allreduce, bcast) = (Cmd::Put as u8, Cmd::Allreduce as u8, Cmd::Bcast as u8);
    let sent = [put, put, allreduce, allreduce, bcast, allreduce];
    assert_eq!(t.join().unwrap(), sent);
}

#[test]
fn a_reduction_over_unequal_blocks_is_refused_before_it_is_sent() {
    let (addr, t) = server(true, &[NO_PEER; 4]);
    let mut g = open(&addr, 4);
    // 10 rows over 4 ranks: 3, 3, 2 and 2.
    assert_eq!(
        g.scatter_rows("x", DType::I32, &[0; 40], 4).unwrap(),
        [3, 3, 2, 2]
    );
    let algo = Algorithm::Binomial;
    let e = g
        .allreduce("x", "s", DType::I32, ReduceOp::Sum, algo)
        .unwrap_err();
    assert!(matches!(e, GroupError::Usage(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid use of the group: allreduce of buffer \"x\": its ranks hold 12, 12, 8, 8 \
         bytes, and a reduction needs the same length on every rank (scatter a number of rows \
         that divides by 4, or put equal blocks)"
    );
    assert!(matches!(
        g.reduce(0, "x", "m", DType::I32, ReduceOp::Max, algo),
        Err(GroupError::Usage(_))
    ));
    // Gathering unequal blocks is fine, and the group goes on.
    g.allgather("x", "all", algo).unwrap();
    g.scatter_rows("y", DType::I32, &[0; 32], 4).unwrap();
    g.allreduce("y", "s", DType::I32, ReduceOp::Sum, algo)
        .unwrap();
    drop(g);
    let sent = t.join().unwrap();
    assert!(!sent.contains(&(Cmd::Reduce as u8)), "{sent:?}");
    assert_eq!(
        sent.iter().filter(|&&b| b == Cmd::Allreduce as u8).count(),
        1
    );
}

#[test]
fn a_failure_says_the_call_once_and_closing_after_it_is_quiet() {
    // What a node reports when another member refused its part of a
    // collective: its own numbering of the call, then the abort's.
    let reason = "allreduce #1 (binomial, root 0, i32 sum): rank 1 (n1@127.0.0.1:9): reported by \
                  rank 1: allreduce #1 (binomial, root 0, i32 sum): buffer \"v\": holds f32 \
                  elements, the operation wants i32";
    let (addr, t) = server_failing(true, &[NO_PEER; 2], Some((Cmd::Allreduce, 1, reason)));
    let mut g = open(&addr, 2);
    let algo = Algorithm::Binomial;
    let e = g
        .allreduce("v", "s", DType::I32, ReduceOp::Sum, algo)
        .unwrap_err();
    assert_eq!(e.rank(), Some(1));
    assert_eq!(
        e.to_string(),
        "allreduce #1: rank 0 (n0@127.0.0.1:9) reports: rank 1 (n1@127.0.0.1:9): reported by \
         rank 1: buffer \"v\": holds f32 elements, the operation wants i32"
    );
    assert!(matches!(g.barrier(algo), Err(GroupError::Closed(_))));
    // The failure was reported; leaving the group does not report it again.
    g.close().unwrap();
    t.join().unwrap();
}

#[test]
fn labels_are_dropped_only_where_a_part_begins() {
    let same = [
        "buffer \"v\": holds f32 elements, the operation wants i32",
        "no buffer named \"barrier #6: \"",
        "run #x: not a label",
        "allreduce #: not one either",
    ];
    for s in same {
        assert_eq!(without_labels(s), s);
    }
    assert_eq!(
        without_labels("barrier #6: the group failed earlier: barrier #2: it stalled"),
        "the group failed earlier: it stalled"
    );
    assert_eq!(
        without_labels("bcast #3 (linear, root 1, f64 none): rank 2 (a@b:1): link lost: eof"),
        "rank 2 (a@b:1): link lost: eof"
    );
}

/// A group over TLS goes through the client's TLS link: opened, commands
/// answered, closed; the direct path, which would be plain TCP to the
/// members, is refused before anything is dialled, and the group goes on.
#[test]
fn a_group_over_tls_and_its_direct_path_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::tls::tests::pki(dir.path());
    let (addr, t) = scripted(Some(cfg), true, &[NO_PEER; 2], None);
    let mut opts = GroupOptions::new(2);
    opts.model = None;
    let ca = corefarm_smp::tls::ClientTls::from_ca_file(&dir.path().join("ca.pem"), None);
    opts.tls = Some(ca.unwrap());
    let mut g = Group::open(&addr, opts).unwrap();
    assert_eq!(g.size(), 2);
    g.scatter_rows("v", DType::I32, &[7; 64 << 10], 4).unwrap();
    g.allreduce("v", "s", DType::I32, ReduceOp::Sum, Algorithm::Binomial)
        .unwrap();
    assert!(matches!(g.direct(4), Err(GroupError::DirectOverTls)));
    g.barrier(Algorithm::Binomial).unwrap();
    drop(g);
    // Every command reached the server through TLS, in order.
    let (put, allreduce, barrier) = (Cmd::Put as u8, Cmd::Allreduce as u8, Cmd::Barrier as u8);
    assert_eq!(t.join().unwrap(), [put, put, allreduce, barrier]);
}
