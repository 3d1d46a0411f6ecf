//! Property tests of peer messages: any payload parses to a message or an
//! error (never a panic), and every message re-encodes to the bytes it came
//! from; any generated message round-trips.

use bytes::{Buf, Bytes};
use corefarm_smp::{
    Algo, CollHeader, CollOp, DType, PeerBody, PeerHeader, PeerKind, PeerMsg, ReduceOp, HEADER_LEN,
};
use proptest::prelude::*;

fn header(kind: PeerKind) -> impl Strategy<Value = PeerHeader> {
    (
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(move |(ttl, group, src, dst, seq)| PeerHeader {
            kind,
            ttl,
            group,
            src,
            dst,
            seq,
        })
}

fn coll(len: usize) -> impl Strategy<Value = CollHeader> {
    (
        any::<u32>(),
        prop::sample::select(CollOp::ALL.to_vec()),
        any::<u8>(),
        prop::sample::select(Algo::ALL.to_vec()),
        prop::sample::select(DType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
        any::<u32>(),
        any::<u32>(),
        0u64..1 << 40,
        0u64..1 << 20,
        0u8..8,
    )
        .prop_map(
            move |(seq, op, phase, algo, dtype, reduce, root, block, offset, extra, class)| {
                CollHeader {
                    seq,
                    op,
                    phase,
                    algo,
                    dtype,
                    reduce,
                    root,
                    block,
                    offset,
                    total: offset + len as u64 + extra,
                    class,
                }
            },
        )
}

fn message() -> impl Strategy<Value = PeerMsg> {
    prop_oneof![
        (header(PeerKind::Hello), any::<u64>(), "[a-z0-9@.:-]{0,40}").prop_map(
            |(header, token, name)| PeerMsg {
                header,
                body: PeerBody::Hello { token, name }
            }
        ),
        prop::collection::vec(any::<u8>(), 0..300).prop_flat_map(|d| {
            (header(PeerKind::Collective), coll(d.len()), Just(d)).prop_map(|(header, coll, d)| {
                PeerMsg {
                    header,
                    body: PeerBody::Collective {
                        coll,
                        data: Bytes::from(d),
                    },
                }
            })
        }),
        (
            header(PeerKind::Abort),
            any::<u32>(),
            any::<u32>(),
            ".{0,60}"
        )
            .prop_map(|(header, culprit, coll_seq, reason)| PeerMsg {
                header,
                body: PeerBody::Abort {
                    culprit,
                    coll_seq,
                    reason
                },
            }),
    ]
}

proptest! {
    #[test]
    fn generated_messages_round_trip(m in message()) {
        let mut f = m.to_frame().unwrap();
        let wire = f.to_vec();
        prop_assert_eq!(f.remaining(), wire.len());
        let mut flat = Vec::new();
        while f.has_remaining() {
            let n = f.chunk().len();
            flat.extend_from_slice(f.chunk());
            f.advance(n);
        }
        prop_assert_eq!(&flat, &wire);
        let back = PeerMsg::parse(Bytes::copy_from_slice(&wire[HEADER_LEN..])).unwrap();
        prop_assert_eq!(back, m);
    }

    #[test]
    fn arbitrary_payloads_never_panic_and_reencode_exactly(
        kind in 0u8..5, rest in prop::collection::vec(any::<u8>(), 0..200)
    ) {
        let mut p = vec![kind, 0];
        p.extend(rest);
        if let Ok(m) = PeerMsg::parse(Bytes::from(p.clone())) {
            // Reserved bytes of the collective header are ignored on input,
            // written as zero; so is a class field no sender writes.
            let mut again = m.to_frame().unwrap().to_vec().split_off(HEADER_LEN);
            if m.header.kind == PeerKind::Collective {
                let at = 24;
                for i in (at + 9..at + 12).chain(at + 20..at + 24) {
                    again[i] = p[i];
                }
            }
            prop_assert_eq!(again, p);
        }
    }
}
