//! Handler notifications (type 0x1C) relayed node → user in process, in
//! exclusive and shared mode: a user that agreed `spin-notify` gets every
//! notification of a message, with its own id for it, before the
//! message's result; one that did not gets the results only; a node that
//! notifies about an id it does not hold is dropped like one that answers
//! one.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::{hello::features, Data, Hello, MsgType, Notification, OutFrame};

fn shared() -> ServerOptions {
    ServerOptions {
        sharing: Sharing::Shared,
        monitor_period: Duration::from_millis(10),
        ..opts()
    }
}

const WITH: [&str; 3] = [features::ERROR, features::STATUS, features::SPIN_NOTIFY];
const WITHOUT: [&str; 2] = [features::ERROR, features::STATUS];

/// Sends one-input messages with user ids `ids` one at a time and checks
/// what comes back for each: the notifications (when `agreed`) with the
/// user's id, then the result.
async fn round_trips(u: &mut FakeUser, ids: &[u32], agreed: bool) {
    for &id in ids {
        let first = id as u8 ^ 0x5A;
        u.send(OutFrame::data(id, Bytes::from(vec![first; 16])).unwrap())
            .await;
        if agreed {
            for want in notes(first) {
                let f = u.recv_skip_credit().await.expect("a notification");
                assert_eq!(f.ty, MsgType::Notification, "id {id}: before the result");
                let n = Notification::parse(f.payload).unwrap();
                assert_eq!((n.id, n.set, n.data), (id, NOTE_SET, want), "id {id}");
            }
        }
        let f = u.recv_skip_credit().await.expect("a result");
        assert_eq!(f.ty, MsgType::Data, "id {id}: the result, nothing else");
        let d = Data::parse(f.payload).unwrap();
        assert_eq!((d.id, d.data.len()), (id, 16));
    }
}

async fn user(srv: &TestServer, feats: &[&str]) -> FakeUser {
    let (mut u, f) = FakeUser::hello_with(srv.users, "notes", Some(1), feats).await;
    assert_eq!(f.ty, MsgType::Hello);
    let h = Hello::decode(&f.payload).unwrap();
    assert_eq!(
        h.has(features::SPIN_NOTIFY),
        feats.contains(&features::SPIN_NOTIFY),
        "agreed only when asked: {h:?}"
    );
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    u
}

async fn relay(opts: ServerOptions) {
    let exclusive = opts.sharing != Sharing::Shared;
    let srv = start(opts).await;
    let _node = FakeNode::spawn(srv.nodes, "notifier", 3, Behaviour::Notify).await;
    srv.wait_free_nodes(1).await;
    // Ids the server's internal numbering would not produce by chance.
    let mut u = user(&srv, &WITH).await;
    round_trips(&mut u, &[900, 7, 0xDEAD_BEEF], true).await;
    drop(u);
    if exclusive {
        // Shared mode keeps the node configured for the next user.
        srv.wait_free_nodes(1).await;
    }
    let mut u = user(&srv, &WITHOUT).await;
    round_trips(&mut u, &[41, 42], false).await;
    // Two notifications per message: three messages' relayed, two's dropped.
    let text = corefarm_telemetry::Endpoints::metrics(&srv.status);
    for want in [
        "notifications_total{outcome=\"relayed\"} 6",
        "notifications_total{outcome=\"dropped\"} 4",
    ] {
        assert!(text.contains(want), "{want} in:\n{text}");
    }
}

#[tokio::test]
async fn exclusive_mode_relays_notifications_before_the_result() {
    relay(opts()).await;
}

#[tokio::test]
async fn shared_mode_relays_notifications_before_the_result() {
    relay(shared()).await;
}

async fn unknown_id(opts: ServerOptions) {
    let srv = start(opts).await;
    let liar = FakeNode::spawn(srv.nodes, "liar", 9, Behaviour::NotifyUnknownId).await;
    srv.wait_free_nodes(1).await;
    let mut u = user(&srv, &WITH).await;
    u.send(OutFrame::data(5, Bytes::from(vec![1; 16])).unwrap())
        .await;
    liar.closed().await;
}

#[tokio::test]
async fn exclusive_mode_drops_a_node_that_notifies_an_unknown_id() {
    unknown_id(opts()).await;
}

#[tokio::test]
async fn shared_mode_drops_a_node_that_notifies_an_unknown_id() {
    unknown_id(shared()).await;
}
