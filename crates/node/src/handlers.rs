//! Core handlers: one OS thread per hardware core (seed 000 §3.4.2), fed from
//! the shared input queue. Cores block (an FPGA poll loop, a simulated clock,
//! a C function), so they get real threads rather than async tasks.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use corefarm_cores::Core;
use corefarm_smp::{BenchmarkConfig, BENCH_ECHO_LEN};
use tokio::sync::mpsc;

use crate::guard::Reservation;

/// One data message waiting for a core.
pub struct Job {
    pub id: u32,
    pub data: Bytes,
    pub count: usize,
    pub reservation: Reservation,
}

/// What the sending task writes: results from core handlers, and control
/// frames (responses, errors, hello) from the receiving task, through one
/// channel so results take no extra hop.
pub enum Outgoing {
    Frame(corefarm_smp::OutFrame),
    Result {
        id: u32,
        data: Bytes,
        reservation: Reservation,
    },
    Failed {
        id: u32,
        reason: String,
        reservation: Reservation,
    },
}

/// What the node runs for the current configuration.
pub enum Engine {
    /// Seed 000 §4.2.2: no cores, a processing delay per input, 16 echoed bytes.
    Benchmark(BenchmarkConfig),
    /// Real hardware cores, one handler each.
    Cores {
        cores: Vec<Box<dyn Core>>,
        input_size: usize,
        output_size: usize,
    },
}

/// The running core handlers of one configuration.
pub struct Workers {
    input: async_channel::Sender<Job>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn start(engine: Engine, results: mpsc::UnboundedSender<Outgoing>, node: &str) -> Self {
        let (tx, rx) = async_channel::unbounded::<Job>();
        let mut threads = Vec::new();
        match engine {
            Engine::Benchmark(cfg) => {
                let (rx, results) = (rx.clone(), results.clone());
                threads.push(spawn(format!("{node}-bench"), move || {
                    benchmark_loop(cfg, rx, results)
                }));
            }
            Engine::Cores {
                cores,
                input_size,
                output_size,
            } => {
                for (i, core) in cores.into_iter().enumerate() {
                    let (rx, results) = (rx.clone(), results.clone());
                    threads.push(spawn(format!("{node}-core{i}"), move || {
                        core_loop(core, input_size, output_size, rx, results)
                    }));
                }
            }
        }
        Workers { input: tx, threads }
    }

    pub async fn submit(&self, job: Job) -> bool {
        self.input.send(job).await.is_ok()
    }

    /// Lets the handlers finish the queued jobs, then joins them (blocking:
    /// call from `spawn_blocking`).
    pub fn stop(self) {
        drop(self.input);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .expect("spawn core handler thread")
}

fn core_loop(
    mut core: Box<dyn Core>,
    input_size: usize,
    output_size: usize,
    rx: async_channel::Receiver<Job>,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    while let Ok(job) = rx.recv_blocking() {
        let mut out = BytesMut::zeroed(job.count * output_size);
        let mut failure = None;
        for (i, o) in job
            .data
            .chunks_exact(input_size)
            .zip(out.chunks_exact_mut(output_size.max(1)))
        {
            if let Err(e) = core.process(i, o) {
                failure = Some(e.to_string());
                break;
            }
        }
        let msg = match failure {
            None => Outgoing::Result {
                id: job.id,
                data: out.freeze(),
                reservation: job.reservation,
            },
            Some(reason) => Outgoing::Failed {
                id: job.id,
                reason,
                reservation: job.reservation,
            },
        };
        if results.send(msg).is_err() {
            return;
        }
    }
}

/// The benchmarking node's output for `count` inputs: zero-filled outputs
/// whose first 16 bytes echo the first 16 bytes of each input.
pub fn benchmark_output(cfg: &BenchmarkConfig, data: &[u8], count: usize) -> Bytes {
    let (isz, osz) = (cfg.input_size as usize, cfg.output_size as usize);
    let mut out = BytesMut::zeroed(count * osz);
    for (i, o) in data.chunks_exact(isz).zip(out.chunks_exact_mut(osz)) {
        o[..BENCH_ECHO_LEN].copy_from_slice(&i[..BENCH_ECHO_LEN]);
    }
    out.freeze()
}

fn benchmark_loop(
    cfg: BenchmarkConfig,
    rx: async_channel::Receiver<Job>,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    let (isz, osz) = (cfg.input_size as usize, cfg.output_size as usize);
    let delay = Duration::from_micros(cfg.delay_us as u64);
    // While inputs arrive back to back, each deadline is the previous one plus
    // the delay, so the wake-up latency of one sleep is absorbed by the next
    // instead of stretching every input (the node keeps its nominal rate).
    // After a real idle gap the schedule restarts from now.
    let slack = Duration::from_micros(500).min(delay);
    let mut deadline = Instant::now();
    while let Ok(job) = rx.recv_blocking() {
        let mut out = BytesMut::zeroed(job.count * osz);
        for (i, o) in job.data.chunks_exact(isz).zip(out.chunks_exact_mut(osz)) {
            if !delay.is_zero() {
                let now = Instant::now();
                deadline = if now.saturating_duration_since(deadline) <= slack {
                    deadline + delay
                } else {
                    now + delay
                };
                if deadline > now {
                    std::thread::sleep(deadline - now);
                }
            }
            o[..BENCH_ECHO_LEN].copy_from_slice(&i[..BENCH_ECHO_LEN]);
        }
        if results
            .send(Outgoing::Result {
                id: job.id,
                data: out.freeze(),
                reservation: job.reservation,
            })
            .is_err()
        {
            return;
        }
    }
}
