//! What users see of their work: functions by name with their digest, and
//! per-user figures (results, latency, function) in both sharing modes.

use crate::common;

use std::time::Duration;

use common::{opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::{Configuration, CoreInfo, NodeState};

/// A corefarm image (docs/images.md) named `name`: a fake node accepts it
/// without looking inside; only its manifest's name matters here.
fn image(name: &str) -> Configuration {
    let manifest = format!(r#"{{"name":"{name}","input_size":16,"output_size":16}}"#);
    let mut b = b"CFIMAGE\0".to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend((manifest.len() as u32).to_le_bytes());
    b.extend(manifest.as_bytes());
    b.extend([7u8; 32]);
    Configuration {
        input_size: 16,
        output_size: 16,
        cores: vec![CoreInfo {
            control: 0,
            input: 16,
            output: 32,
        }],
        bitstream: b.into(),
    }
}

fn shared() -> ServerOptions {
    ServerOptions {
        sharing: Sharing::Shared,
        monitor_period: Duration::from_millis(10),
        ..opts()
    }
}

async fn functions_by_name(o: ServerOptions) {
    let shared = o.sharing == Sharing::Shared;
    let srv = start(o).await;
    let _n = FakeNode::spawn(srv.nodes, "n0", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    let cfg = image("crc32-mine");
    assert_eq!(u.configure(&cfg).await.0, 0);
    assert_eq!(u.stream(0..5, 16, true).await.len(), 5);
    let digest = corefarm_server::metrics::bitstream_digest(&cfg.bitstream);
    let label = format!("crc32-mine (sha256:{})", &digest[..12]);
    let s = srv
        .wait_status("the node ready", |s| s.count_nodes(NodeState::Ready) == 1)
        .await;
    assert_eq!(s.nodes[0].function.as_deref(), Some(label.as_str()));
    if shared {
        assert_eq!(s.functions[0].name.as_deref(), Some(label.as_str()));
    }
    let text = corefarm_telemetry::Endpoints::metrics(&srv.status);
    let want = format!(r#"function="{label}"}} 1"#);
    assert!(
        text.lines()
            .any(|l| l.starts_with("corefarm_node_function{") && l.ends_with(&want)),
        "no {want} in:\n{text}"
    );
}

#[tokio::test]
async fn exclusive_mode_names_functions_by_image_name_and_digest() {
    functions_by_name(opts()).await;
}

#[tokio::test]
async fn shared_mode_names_functions_by_image_name_and_digest() {
    functions_by_name(shared()).await;
}

/// A user's figures after some results: latency percentiles, results, its
/// function and the nodes serving it in the status, its series in
/// `/metrics`, whichever the sharing mode.
async fn per_user_figures(o: ServerOptions) {
    let srv = start(o).await;
    let _n = FakeNode::spawn(srv.nodes, "n0", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    let cfg = image("crc32-mine");
    assert_eq!(u.configure(&cfg).await.0, 0);
    assert_eq!(u.stream(0..5, 16, true).await.len(), 5);
    let s = u.status().await;
    let me = s.user(s.you.expect("the asker")).unwrap();
    let digest = corefarm_server::metrics::bitstream_digest(&cfg.bitstream);
    let label = format!("crc32-mine (sha256:{})", &digest[..12]);
    assert_eq!(me.results, 5);
    assert!(
        me.latency_p50.is_some() && me.latency_p99.is_some(),
        "{me:?}"
    );
    assert_eq!(me.function.as_deref(), Some(label.as_str()));
    assert_eq!(me.nodes, [s.nodes[0].id]);
    let text = corefarm_telemetry::Endpoints::metrics(&srv.status);
    for want in [
        r#"corefarm_user_results_total{user="test-user"} 5"#,
        r#"corefarm_user_latency_seconds_count{user="test-user"} 5"#,
    ] {
        assert!(text.lines().any(|l| l == want), "no {want} in:\n{text}");
    }
}

#[tokio::test]
async fn exclusive_mode_publishes_per_user_figures() {
    per_user_figures(opts()).await;
}

#[tokio::test]
async fn shared_mode_publishes_per_user_figures() {
    per_user_figures(shared()).await;
}
