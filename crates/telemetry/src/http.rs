//! The HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /status`
//! (JSON), served by hyper's HTTP/1.1 connection handler on tokio. Requests
//! are untrusted: the request head is bounded by hyper's buffer limit, it
//! must arrive within a timeout, bodies are never read, and the number of
//! concurrent connections is capped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Concurrent scrapers; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 32;
/// The request head (line and headers) must fit this (hyper's minimum).
const MAX_HEAD: usize = 8 * 1024;
/// The request head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection's whole life, requests and responses: a client that stops
/// reading its answers would otherwise hold a slot for good (hyper times
/// only the reading of a request head), and 32 of them would lock every
/// scraper out. Scrapers reconnect.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// What the endpoint serves: both answers are made at request time.
pub trait Endpoints: Send + Sync + 'static {
    /// The OpenMetrics text exposition (see [`crate::encode`]).
    fn metrics(&self) -> String;
    /// The JSON status document.
    fn status(&self) -> Vec<u8>;
}

/// A bound metrics endpoint, ready to run.
pub struct MetricsServer {
    listener: TcpListener,
    lifetime: Duration,
}

impl MetricsServer {
    pub async fn bind(addr: &str) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen for metrics on {addr}: {e}"),
            )
        })?;
        Ok(MetricsServer {
            listener,
            lifetime: CONNECTION_LIFETIME,
        })
    }

    /// How long one connection may last (30 s by default).
    pub fn connection_lifetime(mut self, d: Duration) -> Self {
        self.lifetime = d;
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves until `stop` is cancelled.
    pub async fn run(self, endpoints: Arc<dyn Endpoints>, stop: CancellationToken) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                p = slots.clone().acquire_owned() => p.expect("never closed"),
            };
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Typically EMFILE: back off instead of spinning.
                        tracing::warn!("metrics accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let endpoints = endpoints.clone();
            let stop = stop.clone();
            let lifetime = self.lifetime;
            tokio::spawn(async move {
                let _permit = permit;
                let svc = hyper::service::service_fn(move |req| {
                    let endpoints = endpoints.clone();
                    async move { Ok::<_, Infallible>(answer(&*endpoints, &req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .max_buf_size(MAX_HEAD)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = tokio::time::timeout(lifetime, conn) => match r {
                        Ok(Err(e)) => tracing::debug!(peer = %peer, "metrics connection: {e}"),
                        Err(_) => tracing::debug!(peer = %peer, "metrics connection closed after {lifetime:?}"),
                        Ok(Ok(())) => {}
                    },
                }
            });
        }
    }
}

fn answer(e: &dyn Endpoints, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    let (body, ty) = match req.uri().path() {
        // Prometheus asks for OpenMetrics in its Accept header; anyone
        // else gets the classic text format.
        "/metrics" if accepts_openmetrics(req) => (
            Bytes::from(e.metrics()),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/metrics" => (
            Bytes::from(crate::to_prometheus_text(&e.metrics())),
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        "/status" => (Bytes::from(e.status()), "application/json"),
        _ => return plain(StatusCode::NOT_FOUND, "try /metrics or /status\n"),
    };
    let mut r = Response::new(Full::new(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ty));
    r
}

fn accepts_openmetrics(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

fn plain(code: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = code;
    r
}
