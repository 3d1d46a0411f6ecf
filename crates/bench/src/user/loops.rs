//! The sending loop (fast or paced) and the receiving loop.

use super::*;

/// How the receiving loop ended.
pub(super) enum Ended {
    /// Every result is in (or the run was aborted).
    Done,
    /// The server connection broke, or the server has no node left for
    /// this user; a resumable run moves to a new connection.
    Lost(String),
}

pub(super) fn send_loop(
    o: &UserBenchOptions,
    credit: bool,
    t0: u64,
    win: Window,
    sh: &RunState,
) -> Result<()> {
    let in_size = o.input_size as usize;
    // One buffer for the whole run: random once, then only the 16-byte tags
    // change, so generating inputs costs almost nothing.
    let mut buf = vec![0u8; in_size * o.count as usize];
    rand::thread_rng().fill_bytes(&mut buf);
    let period_ns = o.rate_hz.map(|hz| 1e9 / hz);
    let mut id: u32 = 0;
    let mut k: u64 = 0;
    loop {
        if sh.abort.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = now_ns();
        if let Some(p) = period_ns {
            // Absolute deadlines: a late send is followed by an early one, so
            // the average rate is exact even though sleeps overshoot.
            let deadline = t0 + (k as f64 * p) as u64;
            if deadline >= win.end {
                return Ok(());
            }
            if deadline > now {
                thread::sleep(Duration::from_nanos(deadline - now));
            }
        } else if now >= win.end {
            return Ok(());
        }
        // While a lost server is being replaced nothing new is sent.
        if credit || sh.resuming.load(Ordering::Acquire) {
            let mut c = sh.credits.lock().unwrap_or_else(|p| p.into_inner());
            while (credit && *c == 0) || sh.resuming.load(Ordering::Acquire) {
                if sh.abort.load(Ordering::Acquire) || now_ns() >= win.end {
                    return Ok(());
                }
                c = sh
                    .credit_cv
                    .wait_timeout(c, POLL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if credit {
                *c -= 1;
            }
        }
        let ts = now_ns();
        for (i, input) in buf.chunks_exact_mut(in_size).enumerate() {
            stamp(input, ts, id, i as u32);
        }
        // Registered before the write: the result may come back before
        // write() returns. The connection it is meant for is read under
        // the same lock a resume takes to replace it.
        let gen = {
            let mut inflight = sh.inflight.lock().unwrap_or_else(|p| p.into_inner());
            inflight.insert(id, InFlight { ts, count: o.count });
            sh.link_gen.load(Ordering::Acquire)
        };
        sh.sent_msgs.fetch_add(1, Ordering::Relaxed);
        sh.sent_inputs.fetch_add(o.count as u64, Ordering::Relaxed);
        if win.contains(ts) {
            sh.window_sent_msgs.fetch_add(1, Ordering::Relaxed);
        }
        let written = {
            let mut w = sh.link.lock().unwrap_or_else(|p| p.into_inner());
            // Replaced since: the resume sends this message again.
            match sh.link_gen.load(Ordering::Acquire) == gen {
                true => write_data_borrowed(&mut *w, id, &buf),
                false => Ok(()),
            }
        };
        if let Err(e) = written {
            if sh.abort.load(Ordering::Acquire) {
                return Ok(());
            }
            if o.reconnect_timeout.is_none() || o.legacy {
                return Err(e).context("writing a data message");
            }
            // Half a frame may be out: shut the connection so that the
            // receiver resumes, and wait until it has.
            lost_on_write(sh, gen);
        }
        id = id.wrapping_add(1);
        k += 1;
    }
}

/// The connection `gen` failed a write: shut it (the receiver sees that
/// and resumes) and wait until it is replaced or the run ends.
fn lost_on_write(sh: &RunState, gen: u64) {
    {
        let w = sh.link.lock().unwrap_or_else(|p| p.into_inner());
        if sh.link_gen.load(Ordering::Acquire) == gen {
            let _ = w.shutdown(Shutdown::Both);
        }
    }
    let mut c = sh.credits.lock().unwrap_or_else(|p| p.into_inner());
    while sh.link_gen.load(Ordering::Acquire) == gen && !sh.abort.load(Ordering::Acquire) {
        c = sh
            .credit_cv
            .wait_timeout(c, POLL)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Reads results until every one is in (`Ended::Done`) or, for a
/// `resumable` run, the connection is lost (`Ended::Lost`); without
/// resuming, a lost connection is an error.
pub(super) fn recv_loop<R: std::io::Read>(
    r: &mut FrameReader<R>,
    o: &UserBenchOptions,
    win: Window,
    sh: &RunState,
    hist: &mut LatencyHistogram,
    resumable: bool,
) -> Result<Ended> {
    let lost = |why: String| match resumable {
        true => Ok(Ended::Lost(why)),
        false => Err(anyhow!(why)),
    };
    let done = || {
        sh.sender_done.load(Ordering::Acquire)
            && sh
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    };
    loop {
        let f = match r.read_frame() {
            Ok(Some(f)) => f,
            Ok(None) if done() => return Ok(Ended::Done),
            Ok(None) => return lost("the server closed the connection".into()),
            Err(e) if is_timeout(&e) => {
                if sh.abort.load(Ordering::Acquire) || done() {
                    return Ok(Ended::Done);
                }
                continue;
            }
            Err(e) if resumable && !sh.abort.load(Ordering::Acquire) => {
                return lost(format!("reading from the server: {e}"))
            }
            Err(e) => return Err(e.into()),
        };
        match f.ty {
            MsgType::Data => {
                let now = now_ns();
                let d = match Data::parse(f.payload) {
                    Ok(d) => d,
                    Err(e) => {
                        sh.corrupt(format!("malformed result: {e}"));
                        continue;
                    }
                };
                let sent = sh
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&d.id);
                let Some(sent) = sent else {
                    sh.corrupt(format!("result with unknown or repeated id {}", d.id));
                    continue;
                };
                sh.return_credit();
                let (in_bytes, out_bytes) =
                    (sent.count as u64 * o.input_size as u64, d.data.len() as u64);
                sh.recv_msgs.fetch_add(1, Ordering::Relaxed);
                sh.recv_outputs.fetch_add(
                    d.data.len() as u64 / o.output_size as u64,
                    Ordering::Relaxed,
                );
                sh.recv_in_bytes.fetch_add(in_bytes, Ordering::Relaxed);
                sh.recv_out_bytes.fetch_add(out_bytes, Ordering::Relaxed);
                if let Some(e) = check_result(&d.data, d.id, &sent, o.output_size) {
                    sh.corrupt(e);
                    continue;
                }
                let lat = now.saturating_sub(sent.ts);
                sh.tick_lat_ns.fetch_add(lat, Ordering::Relaxed);
                sh.tick_lat_n.fetch_add(1, Ordering::Relaxed);
                if win.contains(sent.ts) {
                    hist.record(lat);
                }
                if win.contains(now) {
                    sh.window_msgs.fetch_add(1, Ordering::Relaxed);
                    sh.window_in_bytes.fetch_add(in_bytes, Ordering::Relaxed);
                    sh.window_out_bytes.fetch_add(out_bytes, Ordering::Relaxed);
                }
            }
            MsgType::Credit => match Credit::parse(&f.payload) {
                Ok(c) => {
                    *sh.credits.lock().unwrap_or_else(|p| p.into_inner()) += c.messages as u64;
                    sh.credit_cv.notify_one();
                }
                Err(e) => sh.corrupt(format!("malformed credit: {e}")),
            },
            MsgType::Error => {
                let e = ErrorMsg::parse(&f.payload)
                    .map_err(|e| anyhow!("malformed error message: {e}"))?;
                // A server left without nodes: another server may have them
                // (the message is sent again there, not failed).
                if resumable && e.code() == Some(corefarm_smp::ErrorCode::NoNodes) {
                    return lost(format!("server error: {e}"));
                }
                if e.id == ErrorMsg::NO_ID {
                    bail!("server error: {e}");
                }
                if sh
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&e.id)
                    .is_some()
                {
                    sh.return_credit();
                }
                sh.failed.fetch_add(1, Ordering::Relaxed);
                sh.error(format!("server error: {e}"));
            }
            t => sh.corrupt(format!("unexpected {} message from the server", t.name())),
        }
    }
}
