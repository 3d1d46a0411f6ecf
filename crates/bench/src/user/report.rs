//! Progress lines while a run lasts, and its report.

use super::*;

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Progress {
    pub(super) sent: u64,
    pub(super) recv: u64,
    pub(super) in_bytes: u64,
    pub(super) out_bytes: u64,
    pub(super) at: Duration,
}

pub(super) fn print_progress(sh: &RunState, last: Progress, at: Duration) -> Progress {
    let now = Progress {
        sent: sh.sent_msgs.load(Ordering::Relaxed),
        recv: sh.recv_msgs.load(Ordering::Relaxed),
        in_bytes: sh.recv_in_bytes.load(Ordering::Relaxed),
        out_bytes: sh.recv_out_bytes.load(Ordering::Relaxed),
        at,
    };
    let dt = (now.at - last.at).as_secs_f64().max(1e-9);
    let n = sh.tick_lat_n.swap(0, Ordering::Relaxed);
    let lat = sh.tick_lat_ns.swap(0, Ordering::Relaxed);
    let inflight = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).len();
    eprintln!(
        "[{:>4.0} s] sent {:.0} msg/s, done {:.0} msg/s, in {}, out {}, latency {}, in flight {}",
        at.as_secs_f64(),
        (now.sent - last.sent) as f64 / dt,
        (now.recv - last.recv) as f64 / dt,
        human_bps(bits_per_second(now.in_bytes - last.in_bytes, dt)),
        human_bps(bits_per_second(now.out_bytes - last.out_bytes, dt)),
        if n > 0 {
            format!("{:.2} ms", lat as f64 / n as f64 / 1e6)
        } else {
            "-".into()
        },
        inflight
    );
    now
}

pub(super) fn build_report(
    o: &UserBenchOptions,
    session: Session,
    win: Window,
    sh: &RunState,
    lat: LatencyHistogram,
) -> UserReport {
    let secs = (win.end - win.start) as f64 / 1e9;
    let missing = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counts = Counts {
        sent_messages: ld(&sh.sent_msgs),
        sent_inputs: ld(&sh.sent_inputs),
        received_messages: ld(&sh.recv_msgs),
        received_outputs: ld(&sh.recv_outputs),
        window_messages: ld(&sh.window_msgs),
        missing,
        corrupted: ld(&sh.corrupted),
        failed: ld(&sh.failed),
        resumes: ld(&sh.resumes),
    };
    let msg_bytes = o.input_size as u64 * o.count as u64;
    let throughput = Throughput {
        input_bps: bits_per_second(ld(&sh.window_in_bytes), secs),
        output_bps: bits_per_second(ld(&sh.window_out_bytes), secs),
        offered_input_bps: bits_per_second(ld(&sh.window_sent_msgs) * msg_bytes, secs),
        messages_per_s: counts.window_messages as f64 / secs,
        inputs_per_s: (counts.window_messages * o.count as u64) as f64 / secs,
        send_rate_hz: ld(&sh.window_sent_msgs) as f64 / secs,
    };
    let mut errors = sh.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if missing > 0 && !errors.iter().any(|e| e.contains("missing")) {
        errors.push(format!("{missing} results never came back"));
    }
    if counts.window_messages == 0 {
        errors.push("no result arrived inside the measurement window".into());
    }
    let ok = errors.is_empty() && missing == 0 && counts.corrupted == 0 && counts.failed == 0;
    UserReport {
        benchmark: "user".into(),
        ok,
        errors,
        server: o.server.clone(),
        config: RunConfig {
            input_size: o.input_size,
            output_size: o.output_size,
            delay_us: o.delay_us,
            count: o.count,
            message_bytes: msg_bytes,
            duration_s: o.duration.as_secs_f64(),
            warmup_s: o.warmup.as_secs_f64(),
            rate_hz: o.rate_hz,
            nodes_requested: o.nodes,
            legacy: o.legacy,
        },
        session,
        window_s: secs,
        counts,
        throughput,
        latency: lat.summary(),
        cpu: Vec::new(),
    }
}
