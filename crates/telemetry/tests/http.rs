//! The endpoint over real loopback TCP: both paths, errors, and a request
//! head too large to be accepted.

use std::sync::Arc;

use corefarm_telemetry::prometheus_client::metrics::MetricType;
use corefarm_telemetry::prometheus_client::registry::Registry;
use corefarm_telemetry::{collector, family, AtomicHistogram, Endpoints, MetricsServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

struct Fixed(Registry);

impl Endpoints for Fixed {
    fn metrics(&self) -> String {
        corefarm_telemetry::encode(&self.0)
    }
    fn status(&self) -> Vec<u8> {
        br#"{"nodes":[]}"#.to_vec()
    }
}

async fn get(addr: std::net::SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn serves_metrics_and_status_and_refuses_the_rest() {
    let h = Arc::new(AtomicHistogram::default());
    h.observe(std::time::Duration::from_millis(3));
    let mut reg = corefarm_telemetry::registry();
    let h2 = h.clone();
    reg.register_collector(collector(move |enc| {
        family(enc, "things", "Things done.", MetricType::Counter)?
            .counter(&vec![("kind", "a".to_string())], 7)?;
        family(enc, "wait_seconds", "Waits.", MetricType::Histogram)?
            .histogram(&vec![], &h2.snapshot())?;
        Ok(())
    }));
    let server = MetricsServer::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr();
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.run(Arc::new(Fixed(reg)), stop.clone()));

    let m = get(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    assert!(m.contains("# TYPE corefarm_things_total counter"), "{m}");
    assert!(m.contains("corefarm_things_total{kind=\"a\"} 7"), "{m}");
    assert!(
        m.contains("corefarm_wait_seconds_bucket{le=\"0.005\"} 1"),
        "{m}"
    );
    assert!(m.contains("corefarm_wait_seconds_count 1"), "{m}");
    let om = get(
        addr,
        "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    assert!(
        om.contains("# TYPE corefarm_things counter") && om.ends_with("# EOF\n"),
        "{om}"
    );

    let s = get(
        addr,
        "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        s.starts_with("HTTP/1.1 200") && s.ends_with(r#"{"nodes":[]}"#),
        "{s}"
    );
    let nf = get(
        addr,
        "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
    let post = get(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    // A head over the bound is refused without being buffered whole.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let r = get(addr, &big).await;
    assert!(r.is_empty() || r.starts_with("HTTP/1.1 431"), "{r}");

    stop.cancel();
    task.await.unwrap();
}

struct Large;

impl Endpoints for Large {
    fn metrics(&self) -> String {
        "# EOF\n".into()
    }
    fn status(&self) -> Vec<u8> {
        vec![b'x'; 64 * 1024]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_cannot_lock_scrapers_out() {
    // 32 connections (every slot), each with many requests pipelined and
    // never reading: their answers fill the sockets. Each connection's
    // lifetime ends it; a scraper is then served.
    let s = MetricsServer::bind("127.0.0.1:0")
        .await
        .unwrap()
        .connection_lifetime(std::time::Duration::from_millis(300));
    let addr = s.local_addr();
    let stop = CancellationToken::new();
    tokio::spawn(s.run(Arc::new(Large), stop.clone()));
    let mut held = Vec::new();
    for _ in 0..32 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let reqs = "GET /status HTTP/1.1\r\nHost: x\r\n\r\n".repeat(200);
        c.write_all(reqs.as_bytes()).await.unwrap();
        held.push(c);
    }
    let scrape = get(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let answer = tokio::time::timeout(std::time::Duration::from_secs(20), scrape)
        .await
        .expect("a scrape is served once the stalled connections time out");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    stop.cancel();
}
