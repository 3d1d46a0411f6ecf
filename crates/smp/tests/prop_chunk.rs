//! Property tests of chunked messages: any payload parses to a chunk or an
//! error (never a panic); any set of messages, cut into chunks of any size
//! and interleaved in any order that keeps each message's chunks in order,
//! goes over the wire and comes back whole, with nothing left held.

use bytes::Bytes;
use corefarm_smp::stream::{Chunk, Chunks, Message, Reassembler};
use corefarm_smp::HEADER_LEN;
use proptest::prelude::*;

fn messages() -> impl Strategy<Value = Vec<(u8, Vec<u8>, usize)>> {
    prop::collection::vec(
        (
            0u8..8,
            prop::collection::vec(any::<u8>(), 0..3000),
            1usize..700,
        ),
        0..6,
    )
}

proptest! {
    #[test]
    fn any_payload_parses_or_is_refused(p in prop::collection::vec(any::<u8>(), 0..100)) {
        if let Ok(c) = Chunk::parse(Bytes::from(p.clone())) {
            // What parses re-encodes to its bytes (reserved bytes aside).
            let mut w = c.to_frame().unwrap().to_vec()[HEADER_LEN..].to_vec();
            w[6..8].copy_from_slice(&p[6..8]);
            prop_assert_eq!(w, p);
        }
    }

    #[test]
    fn interleaved_chunks_reassemble_to_the_messages(ms in messages(), picks in prop::collection::vec(any::<usize>(), 0..200)) {
        let mut pending: Vec<std::collections::VecDeque<Chunk>> = ms
            .iter()
            .enumerate()
            .map(|(i, (class, data, size))| {
                Chunks::new(i as u32, *class, Bytes::from(data.clone()), *size).unwrap().collect()
            })
            .collect();
        let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
        let mut out: Vec<Message> = Vec::new();
        let mut picks = picks.into_iter();
        while pending.iter().any(|q| !q.is_empty()) {
            let live: Vec<usize> = (0..pending.len()).filter(|&i| !pending[i].is_empty()).collect();
            let i = live[picks.next().unwrap_or(0) % live.len()];
            let c = pending[i].pop_front().unwrap();
            let wire = c.to_frame().unwrap().to_vec();
            let back = Chunk::parse(Bytes::copy_from_slice(&wire[HEADER_LEN..])).unwrap();
            out.extend(r.push(back).unwrap());
        }
        prop_assert_eq!((r.open(), r.held()), (0, 0));
        out.sort_by_key(|m| m.id);
        prop_assert_eq!(out.len(), ms.len());
        for (m, (class, data, _)) in out.iter().zip(&ms) {
            prop_assert_eq!(m.class, *class);
            prop_assert_eq!(&m.data[..], &data[..]);
        }
    }
}
