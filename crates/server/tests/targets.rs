//! A node is sent only configurations it can run, by the targets its hello
//! announced: a node running Intel-style cores only is never sent an image
//! that carries only an AMD-style artifact, and an image carrying both
//! goes to nodes of either family (each loads the artifact it runs).

use crate::common;

use bytes::Bytes;
use common::*;
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::{Configuration, CoreInfo, ErrorCode};

const TARGET: &str = "native-x86_64-linux";

/// A configuration image (magic, version, manifest length, manifest)
/// whose artifacts are for `TARGET` in `families`; the fake nodes never
/// load it, so it carries no artifact bytes.
fn image(families: &[&str]) -> Configuration {
    let artifacts: Vec<String> = families
        .iter()
        .map(|f| {
            format!(
                r#"{{"target":"{TARGET}","kind":"native","entry":"f","offset":0,"length":0,"sha256":"","family":"{f}"}}"#
            )
        })
        .collect();
    let m = format!(
        r#"{{"name":"f","input_size":8,"output_size":8,"cores":[],"artifacts":[{}]}}"#,
        artifacts.join(",")
    );
    let mut b = b"CFIMAGE\0".to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend((m.len() as u32).to_le_bytes());
    b.extend(m.as_bytes());
    Configuration {
        input_size: 8,
        output_size: 8,
        cores: vec![CoreInfo {
            control: 0xC000_0000,
            input: 0xC000_1000,
            output: 0xC000_2000,
        }],
        bitstream: Bytes::from(b),
    }
}

async fn family_nodes(s: &TestServer) -> (FakeNode, FakeNode) {
    let intel = format!("{TARGET}:intel");
    let amd = format!("{TARGET}:amd");
    let i = FakeNode::spawn_with_targets(s.nodes, "intel-0", 1, Behaviour::Echo, &[&intel]).await;
    let a = FakeNode::spawn_with_targets(s.nodes, "amd-0", 2, Behaviour::Echo, &[&amd]).await;
    s.wait_free_nodes(2).await;
    (i, a)
}

#[tokio::test]
async fn exclusive_nodes_get_only_images_they_run() {
    let s = start(opts()).await;
    let (mut intel, mut amd) = family_nodes(&s).await;

    let (mut u, _) = FakeUser::hello(s.users, None).await;
    let (status, errors) = u.configure(&image(&["amd"])).await;
    assert_eq!(status, 0, "{errors:?}");
    assert!(amd.configs.recv().await.is_some());
    // The Intel node was not sent it, and the user hears why it was left out.
    assert!(intel.configs.try_recv().is_err());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, ErrorCode::ConfigurationFailed as u32);
    assert!(
        errors[0].reason.contains("intel-0") && errors[0].reason.contains("but this node runs"),
        "{}",
        errors[0].reason
    );
    // An Intel node joining the configured user is not taken either.
    let mut late = FakeNode::spawn_with_targets(
        s.nodes,
        "intel-1",
        3,
        Behaviour::Echo,
        &[&format!("{TARGET}:intel")],
    )
    .await;
    s.wait_free_nodes(2).await;
    assert!(late.configs.try_recv().is_err());
    drop(u);
    s.wait_free_nodes(3).await;

    // An image carrying both styles goes to both.
    let (mut u, _) = FakeUser::hello(s.users, None).await;
    let (status, errors) = u.configure(&image(&["intel", "amd"])).await;
    assert_eq!((status, errors.len()), (0, 0), "{errors:?}");
    assert!(intel.configs.recv().await.is_some());
    assert!(amd.configs.recv().await.is_some());
}

#[tokio::test]
async fn shared_nodes_get_only_images_they_run() {
    let s = start(ServerOptions {
        sharing: Sharing::Shared,
        ..opts()
    })
    .await;
    let intel = format!("{TARGET}:intel");
    let mut node =
        FakeNode::spawn_with_targets(s.nodes, "intel-0", 1, Behaviour::Echo, &[&intel]).await;
    s.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(s.users, None).await;
    let (status, errors) = u.configure(&image(&["amd"])).await;
    assert_ne!(status, 0, "configured on a node that cannot run it");
    assert!(node.configs.try_recv().is_err());
    assert!(
        errors
            .iter()
            .any(|e| e.reason.contains("but this node runs")),
        "{errors:?}"
    );
    // The same function in its Intel style runs there.
    let (status, errors) = u.configure(&image(&["amd", "intel"])).await;
    assert_eq!(status, 0, "{errors:?}");
    assert!(node.configs.recv().await.is_some());
}
