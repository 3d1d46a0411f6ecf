//! One connection to the server: the receiving task (this function) and the
//! sending task it spawns.

use corefarm_smp::codec::{write_batch, FrameReader, ReadError};
use corefarm_smp::{
    hello::features, Configuration, ConfigurationResponse, Data, ErrorCode, ErrorMsg, Hello,
    MsgType, OutFrame,
};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::guard::{MemoryGuard, Reservation};
use crate::handlers::{self, Engine, Job, Outgoing, Workers};
use crate::{NodeError, NodeOptions};

struct Configured {
    cfg: Configuration,
    workers: Workers,
}

pub async fn run(
    stream: TcpStream,
    opts: &NodeOptions,
    stop: CancellationToken,
) -> Result<(), NodeError> {
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    let mut reader = FrameReader::new(rd, opts.max_message);
    let session_stop = stop.child_token();
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Outgoing>();
    let server_hello = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = tokio::spawn(send_loop(
        wr,
        out_rx,
        session_stop.clone(),
        server_hello.clone(),
    ));

    if opts.hello {
        let mut h = Hello::new("node");
        h.name = Some(opts.name.clone());
        h.features = vec![features::ERROR.into()];
        h.targets = corefarm_cores::supported_targets(&opts.load);
        let _ = out_tx.send(Outgoing::Frame(h.to_frame()));
    }

    let guard = MemoryGuard::new(opts.memory_limit);
    let mut state: Option<Configured> = None;
    let result = loop {
        let frame = tokio::select! {
            _ = session_stop.cancelled() => break Ok(()),
            f = reader.read_frame() => f,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(ReadError::Io(e)) => break Err(NodeError::Io(e)),
            Err(ReadError::Protocol(e)) => {
                send_error(
                    &out_tx,
                    &server_hello,
                    ErrorMsg::NO_ID,
                    e.code(),
                    e.to_string(),
                );
                break Err(NodeError::Protocol(e));
            }
        };
        match frame.ty {
            MsgType::Hello => match Hello::decode(&frame.payload) {
                Ok(h) => {
                    tracing::debug!(node = %opts.name, "server hello: {h:?}");
                    server_hello
                        .store(h.has(features::ERROR), std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => break Err(NodeError::Protocol(e)),
            },
            MsgType::Configuration => {
                // Stop state: finish queued work of the old configuration first.
                if let Some(old) = state.take() {
                    let _ = tokio::task::spawn_blocking(move || old.workers.stop()).await;
                }
                match configure(frame.payload, opts, &out_tx).await {
                    Ok(c) => {
                        tracing::info!(node = %opts.name, "configured: {}", describe(&c.cfg));
                        state = Some(c);
                        let _ = out_tx.send(Outgoing::Frame(
                            ConfigurationResponse { status: 0 }.to_frame(),
                        ));
                    }
                    Err(reason) => {
                        tracing::warn!(node = %opts.name, "configuration refused: {reason}");
                        send_error(
                            &out_tx,
                            &server_hello,
                            ErrorMsg::NO_ID,
                            ErrorCode::ConfigurationFailed,
                            reason,
                        );
                        let resp = ConfigurationResponse {
                            status: ConfigurationResponse::FAILED,
                        };
                        let _ = out_tx.send(Outgoing::Frame(resp.to_frame()));
                    }
                }
            }
            MsgType::Data => {
                let Some(st) = state.as_ref() else {
                    let reason = "data message before any configuration";
                    send_error(
                        &out_tx,
                        &server_hello,
                        ErrorMsg::NO_ID,
                        ErrorCode::NotConfigured,
                        reason,
                    );
                    break Err(NodeError::Session(reason.into()));
                };
                let data = match Data::parse(frame.payload) {
                    Ok(d) => d,
                    Err(e) => break Err(NodeError::Protocol(e)),
                };
                let count = match st.cfg.count_inputs(data.data.len()) {
                    Ok(n) => n as usize,
                    Err(e) => {
                        send_error(&out_tx, &server_hello, data.id, e.code(), e.to_string());
                        break Err(NodeError::Protocol(e));
                    }
                };
                let bytes = data.data.len() + count * st.cfg.output_size as usize;
                let reservation = tokio::select! {
                    _ = session_stop.cancelled() => break Ok(()),
                    r = guard.reserve(bytes) => r,
                };
                // A zero-delay benchmarking node has nothing to wait for:
                // answering here saves two thread hand-offs per message.
                if let Some(b) = st.cfg.benchmark().filter(|b| b.delay_us == 0) {
                    let out = handlers::benchmark_output(&b, &data.data, count);
                    let _ = out_tx.send(Outgoing::Result {
                        id: data.id,
                        data: out,
                        reservation,
                    });
                    continue;
                }
                let job = Job {
                    id: data.id,
                    data: data.data,
                    count,
                    reservation,
                };
                if !st.workers.submit(job).await {
                    break Err(NodeError::Session("core handlers stopped".into()));
                }
            }
            MsgType::Error => match ErrorMsg::parse(&frame.payload) {
                Ok(e) => tracing::warn!(node = %opts.name, "server reports: {e}"),
                Err(e) => break Err(NodeError::Protocol(e)),
            },
            other => {
                let reason = format!("unexpected {} message from the server", other.name());
                send_error(
                    &out_tx,
                    &server_hello,
                    ErrorMsg::NO_ID,
                    ErrorCode::UnexpectedMessage,
                    reason.clone(),
                );
                break Err(NodeError::Session(reason));
            }
        }
    };
    // Let the sending task flush what is queued (results, a final error),
    // then stop the core handlers.
    drop(out_tx);
    if let Some(st) = state.take() {
        let _ = tokio::task::spawn_blocking(move || st.workers.stop()).await;
    }
    if let Ok(Ok(sent)) = tokio::time::timeout(std::time::Duration::from_secs(2), sender).await {
        tracing::info!(node = %opts.name, "{sent} result message(s) sent in this session");
    }
    session_stop.cancel();
    result
}

fn describe(cfg: &Configuration) -> String {
    match cfg.benchmark() {
        Some(b) => format!(
            "benchmarking configuration: input {} B, output {} B, delay {} µs",
            b.input_size, b.output_size, b.delay_us
        ),
        None => format!(
            "{} cores, input {} B, output {} B, bitstream {} B",
            cfg.cores.len(),
            cfg.input_size,
            cfg.output_size,
            cfg.bitstream.len()
        ),
    }
}

async fn configure(
    payload: bytes::Bytes,
    opts: &NodeOptions,
    results: &mpsc::UnboundedSender<Outgoing>,
) -> Result<Configured, String> {
    let cfg = Configuration::parse(payload).map_err(|e| e.to_string())?;
    let engine = match cfg.benchmark() {
        Some(b) => Engine::Benchmark(b),
        None => {
            let (c, load) = (cfg.clone(), opts.load.clone());
            let loaded = tokio::task::spawn_blocking(move || corefarm_cores::load(&c, &load))
                .await
                .map_err(|e| format!("loading the configuration crashed: {e}"))?
                .map_err(|e| e.to_string())?;
            if loaded.cores.is_empty() {
                return Err("the configuration instantiates no cores".into());
            }
            tracing::info!(node = %opts.name, "loaded {}", loaded.description);
            Engine::Cores {
                cores: loaded.cores,
                input_size: cfg.input_size as usize,
                output_size: cfg.output_size as usize,
            }
        }
    };
    let workers = Workers::start(engine, results.clone(), &opts.name);
    Ok(Configured { cfg, workers })
}

fn send_error(
    out: &mpsc::UnboundedSender<Outgoing>,
    negotiated: &std::sync::atomic::AtomicBool,
    id: u32,
    code: ErrorCode,
    reason: impl Into<String>,
) {
    if negotiated.load(std::sync::atomic::Ordering::Relaxed) {
        let _ = out.send(Outgoing::Frame(ErrorMsg::new(id, code, reason).to_frame()));
    }
}

/// A frame for the wire, holding its memory reservation; `None` when a
/// seed-format server must be told about a core failure by closing.
fn to_wire(o: Outgoing, held: &mut Vec<Reservation>, negotiated: bool) -> Option<OutFrame> {
    match o {
        Outgoing::Frame(f) => Some(f),
        Outgoing::Result {
            id,
            data,
            reservation,
        } => {
            held.push(reservation);
            // Results are sized by the configuration, whose limits were
            // checked when it arrived; should one still not fit, the input
            // fails with a reason instead of the sending task panicking.
            Some(OutFrame::data(id, data).unwrap_or_else(|e| {
                ErrorMsg::new(
                    id,
                    ErrorCode::Internal,
                    format!("result cannot be sent: {e}"),
                )
                .to_frame()
            }))
        }
        Outgoing::Failed {
            id,
            reason,
            reservation,
        } => {
            held.push(reservation);
            tracing::warn!("core failed on data id {id}: {reason}");
            // A seed-format server has no way to hear about a failed input;
            // closing makes it re-dispatch instead of waiting forever.
            negotiated.then(|| ErrorMsg::new(id, ErrorCode::CoreFailure, reason).to_frame())
        }
    }
}

async fn send_loop(
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    stop: CancellationToken,
    negotiated: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u64 {
    let mut results = 0u64;
    // Reservations are released only once their result is on the wire, so
    // the memory guard also counts results waiting for the socket.
    let mut held = Vec::new();
    while let Some(o) = rx.recv().await {
        let neg = negotiated.load(std::sync::atomic::Ordering::Relaxed);
        let mut fatal = false;
        let r = match to_wire(o, &mut held, neg) {
            Some(first) => {
                let more = || match to_wire(rx.try_recv().ok()?, &mut held, neg) {
                    Some(f) => Some(f),
                    None => {
                        fatal = true;
                        None
                    }
                };
                write_batch(&mut wr, first, more).await.map(|_| ())
            }
            None => {
                fatal = true;
                Ok(())
            }
        };
        results += held.len() as u64;
        held.clear();
        let r = r.and_then(|()| match fatal {
            true => Err(std::io::Error::other(
                "core failure reported by closing the connection",
            )),
            false => Ok(()),
        });
        if let Err(e) = r {
            tracing::warn!("sending to server failed: {e}");
            stop.cancel();
            return results;
        }
    }
    results
}
