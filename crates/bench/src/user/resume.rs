//! Resuming the benchmarking session after a lost server, as the client
//! library does: the receiver reconnects (the address after the lost one,
//! round-robin, backing off 50 ms doubling to 2 s), runs the hello and the
//! configuration again, takes the new connection over and has every
//! unanswered message sent again under its id, within the new credit,
//! before the sender goes on. A message's inputs are rebuilt from what the
//! receiver checks (the 16-byte tag with the original send time), so the
//! latency of a resent message includes the outage.

use super::*;

/// Opens a configured session on one address: the connection and the
/// credit granted before the configuration's answer.
type Open<R> = dyn FnMut(&str) -> Result<(SendHalf, FrameReader<R>, u64)> + Send;

/// What a run needs to resume: the addresses, which one is in use, how
/// long to try, and how to open a session.
pub(crate) struct Reconnect<R> {
    addrs: Vec<String>,
    current: usize,
    limit: Duration,
    open: Box<Open<R>>,
}

pub(super) fn reconnector<R>(
    addrs: Vec<String>,
    current: usize,
    limit: Duration,
    open: impl FnMut(&str) -> Result<(SendHalf, FrameReader<R>, u64)> + Send + 'static,
) -> Reconnect<R> {
    Reconnect {
        addrs,
        current,
        limit,
        open: Box::new(open),
    }
}

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Replaces the lost connection (on the receiver's thread): returns the
/// new reader once the new connection is configured and a thread is
/// sending the unanswered messages again; fails after the reconnect
/// timeout, saying how many results are missing.
pub(super) fn resume<R>(
    r: &mut Reconnect<R>,
    o: &UserBenchOptions,
    sh: &Arc<RunState>,
    paced: bool,
) -> Result<FrameReader<R>> {
    sh.resuming.store(true, Ordering::Release);
    // The lost server's credit died with it.
    *sh.credits.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    let since = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let mut next = (r.current + 1) % r.addrs.len();
    let (writer, reader, credit) = loop {
        if sh.abort.load(Ordering::Acquire) {
            bail!("the run ended while resuming");
        }
        let i = next;
        next = (next + 1) % r.addrs.len();
        let last = match (r.open)(&r.addrs[i]) {
            Ok(opened) => {
                r.current = i;
                break opened;
            }
            Err(e) => e,
        };
        let left = r.limit.saturating_sub(since.elapsed());
        if left.is_zero() {
            let missing = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).len();
            bail!(
                "lost the server and could not resume within {:?}: {missing} results never \
                 came back (last attempt: {last:#})",
                r.limit
            );
        }
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };
    writer.tcp().set_read_timeout(Some(POLL))?;
    let (gen, resend) = {
        let inflight = sh.inflight.lock().unwrap_or_else(|p| p.into_inner());
        *sh.link.lock().unwrap_or_else(|p| p.into_inner()) = writer;
        let gen = sh.link_gen.fetch_add(1, Ordering::AcqRel) + 1;
        let mut v: Vec<(u32, u64, u32)> = inflight
            .iter()
            .map(|(&id, f)| (id, f.ts, f.count))
            .collect();
        v.sort_unstable_by_key(|m| (m.1, m.0));
        (gen, v)
    };
    *sh.credits.lock().unwrap_or_else(|p| p.into_inner()) = credit;
    sh.credit_cv.notify_all();
    sh.resumes.fetch_add(1, Ordering::Relaxed);
    // Credit comes back with results, which this thread reads: another
    // thread waits for it.
    let (sh2, o2) = (sh.clone(), o.clone());
    thread::Builder::new()
        .name("bench-resend".into())
        .spawn(move || {
            if let Err(e) = send_again(&o2, &sh2, &resend, gen, paced) {
                if !sh2.abort.load(Ordering::Acquire) {
                    sh2.error(format!("sending again after a resume: {e:#}"));
                }
            }
            // Unless the connection was lost again meanwhile.
            if sh2.link_gen.load(Ordering::Acquire) == gen {
                sh2.resuming.store(false, Ordering::Release);
            }
            sh2.credit_cv.notify_all();
        })?;
    Ok(reader)
}

/// Sends each (id, send time, inputs) message again on the connection in
/// use, oldest first, one credit each. Only the tags are checked, so the
/// rest of each input is zeros.
fn send_again(
    o: &UserBenchOptions,
    sh: &RunState,
    msgs: &[(u32, u64, u32)],
    gen: u64,
    paced: bool,
) -> Result<()> {
    let in_size = o.input_size as usize;
    let mut buf = Vec::new();
    for &(id, ts, count) in msgs {
        {
            let mut c = sh.credits.lock().unwrap_or_else(|p| p.into_inner());
            while paced && *c == 0 {
                if sh.abort.load(Ordering::Acquire) || sh.link_gen.load(Ordering::Acquire) != gen {
                    return Ok(());
                }
                c = sh
                    .credit_cv
                    .wait_timeout(c, POLL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if paced {
                *c -= 1;
            }
        }
        buf.clear();
        buf.resize(in_size * count as usize, 0);
        for (i, input) in buf.chunks_exact_mut(in_size).enumerate() {
            stamp(input, ts, id, i as u32);
        }
        let mut w = sh.link.lock().unwrap_or_else(|p| p.into_inner());
        if sh.link_gen.load(Ordering::Acquire) != gen {
            // Lost again: the next resume sends what is still unanswered.
            return Ok(());
        }
        write_data_borrowed(&mut *w, id, &buf).context("writing a data message again")?;
    }
    Ok(())
}
