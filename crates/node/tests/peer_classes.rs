//! A user's priority on node↔node links, for a group's collectives: each
//! collective's data carries its class, and a link serves the classes by
//! strict priority, so an urgent collective's chunks pass a bulk one's
//! still queued on the same link.

use crate::fabric_common;

use bytes::Bytes;
use corefarm_node::collective::{CollOptions, Group};
use corefarm_node::peer::{Event, Topology};
use corefarm_smp::Algo;
use fabric_common::*;

const CHUNK: usize = 64 * 1024;

#[tokio::test]
async fn an_urgent_collective_passes_a_bulk_one_queued_on_the_same_link() {
    let Cluster {
        listeners: _keep,
        fabrics,
    } = cluster(31, 2, Topology::FullMesh).await;
    let [f0, mut f1]: [_; 2] = fabrics.try_into().ok().unwrap();
    let opts = CollOptions {
        chunk: CHUNK,
        ..CollOptions::default()
    };
    let mut root = Group::new(f0, opts);
    // A root's broadcast returns once its chunks are queued on the link.
    // This runtime has one thread and nothing in between yields to the
    // link's writer, so both collectives wait there together: the writer
    // picks by class.
    let bulk: Bytes = (0..16 * CHUNK as u32).map(|i| i as u8).collect();
    root.set_class(7);
    root.bcast(Algo::Linear, 0, bulk.clone()).await.unwrap();
    let urgent = Bytes::from(vec![0xAB; 2 * CHUNK]);
    root.set_class(0);
    root.bcast(Algo::Linear, 0, urgent.clone()).await.unwrap();

    // What rank 1 receives, in order: (collective number, class, offset).
    let mut order = Vec::new();
    let mut got = (Vec::new(), Vec::new());
    while order.len() < 18 {
        match within("the chunks", f1.recv()).await {
            Some(Event::Chunk { src: 0, coll, data }) => {
                order.push((coll.seq, coll.class, coll.offset));
                let into = if coll.seq == 1 {
                    &mut got.0
                } else {
                    &mut got.1
                };
                into.extend_from_slice(&data);
            }
            other => panic!("expected a chunk from rank 0, got {other:?}"),
        }
    }
    let classes: Vec<(u32, u8)> = order.iter().map(|o| (o.0, o.1)).collect();
    let mut want = vec![(2, 0); 2];
    want.extend([(1, 7); 16]);
    assert_eq!(classes, want, "the urgent collective first: {order:?}");
    // Each in its own order, intact.
    assert!(order[2..].windows(2).all(|w| w[0].2 < w[1].2));
    assert_eq!((got.0, got.1), (bulk.to_vec(), urgent.to_vec()));
    assert_eq!(f1.stats().delivered, 18);
}
