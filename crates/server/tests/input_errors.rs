//! A node's per-input error reaches the user by the user's id, in both
//! sharing modes, with the code the user can act on: `too-large` and
//! `bad-data-size` as the node said, anything else as `core-failure`
//! (`ErrorCode::per_input`); the session goes on.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::{ErrorCode, MsgType, OutFrame};

fn options(sharing: Sharing) -> ServerOptions {
    ServerOptions {
        sharing,
        monitor_period: Duration::from_millis(10),
        ..opts()
    }
}

#[tokio::test]
async fn a_nodes_per_input_error_keeps_the_code_a_user_can_act_on() {
    let cases = [
        (ErrorCode::TooLarge as u32, ErrorCode::TooLarge),
        (ErrorCode::BadDataSize as u32, ErrorCode::BadDataSize),
        (ErrorCode::Internal as u32, ErrorCode::CoreFailure),
        (999, ErrorCode::CoreFailure),
    ];
    for sharing in [Sharing::Exclusive, Sharing::Shared] {
        for (sent, seen) in cases {
            let srv = start(options(sharing)).await;
            let _node = FakeNode::spawn(srv.nodes, "refuser", 1, Behaviour::FailWith(sent)).await;
            srv.wait_free_nodes(1).await;
            let (mut u, _) = FakeUser::hello(srv.users, Some(1)).await;
            assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
            for id in [70u32, 71] {
                u.send(OutFrame::data(id, Bytes::from(vec![0u8; 16])).unwrap())
                    .await;
                let f = u.recv_skip_credit().await.expect("an error");
                assert_eq!(f.ty, MsgType::Error, "{sharing:?}, code {sent}");
                let e = corefarm_smp::ErrorMsg::parse(&f.payload).unwrap();
                assert_eq!(
                    (e.id, e.code),
                    (id, seen as u32),
                    "{sharing:?}, code {sent}: {e}"
                );
                // The node names the server's own id for the message; the user gets its own.
                assert!(e.reason.contains("failed on this input: input"), "{e}");
            }
        }
    }
}

#[tokio::test]
async fn a_hello_user_without_the_error_feature_is_not_left_waiting_for_a_failed_input() {
    for sharing in [Sharing::Exclusive, Sharing::Shared] {
        let srv = start(options(sharing)).await;
        let failing = Behaviour::FailWith(ErrorCode::CoreFailure as u32);
        let _node = FakeNode::spawn(srv.nodes, "refuser", 1, failing).await;
        srv.wait_free_nodes(1).await;
        let feats = [corefarm_smp::hello::features::CREDIT];
        let (mut u, f) = FakeUser::hello_with(srv.users, "no-errors", Some(1), &feats).await;
        assert_eq!(f.ty, MsgType::Hello, "{sharing:?}");
        assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
        u.send(OutFrame::data(5, Bytes::from(vec![0u8; 16])).unwrap())
            .await;
        // It cannot be told about one input: its session ends (no error
        // frame it did not agree, no result), instead of the message
        // silently never being answered.
        while let Some(f) = u.recv().await {
            assert_eq!(
                f.ty,
                MsgType::Credit,
                "{sharing:?}: only credit, then the end"
            );
        }
    }
}
