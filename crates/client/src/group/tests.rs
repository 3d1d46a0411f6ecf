use super::*;
use corefarm_model::collectives::PerTree;
use corefarm_smp::group::GroupCtl;
use std::net::TcpListener;

/// A member's peer address that is never contacted (tests of the control
/// plane only).
pub(crate) const NO_PEER: &str = "127.0.0.1:9";

/// A scripted server: agrees `group-priority` or not (an older server),
/// opens a group whose rank r has peer address `peers[r]`, answers every
/// command for every rank, and returns the command bytes (byte 8 of each
/// command) it received once the client closes the connection.
pub(crate) fn server(agree: bool, peers: &[&str]) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    let peers: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = FrameReader::new(s, 1 << 20);
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
