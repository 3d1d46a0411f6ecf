//! The splitter's threads. Work is handed out from one shared cursor: each
//! local thread (one `Core` each) and the cluster path (the caller's
//! thread) take the next batch when they are ready for more, sized by
//! `policy`, so the faster side takes more. Results land in one slot per
//! input, so the order is the input order whoever computed them.
//!
//! The cluster path waits, checking after every local batch, until the
//! cluster is configured for this function (Algorithm 2 lines 7–12: work
//! goes on locally in small batches meanwhile). If the cluster fails — a
//! lost connection, an error for one message, a result of the wrong size —
//! it stops taking work and everything it had not returned is given back to
//! the local threads, which stay until the cluster path has finished.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::Core;

use super::policy::{self, Clock, Estimates, Knobs, Meter, Side};
use super::{CoworkError, CoworkReport};
use crate::ClientError;

/// The cluster side as the engine sees it (the real one is a `Client`).
pub(crate) trait ClusterPath: Sync {
    type Ticket;
    /// Whether the cluster runs this function now.
    fn ready(&self) -> bool;
    /// While not ready: seconds until it is expected to be, if a
    /// configuration is on its way (infinite when there is no estimate
    /// yet); `None` when none is, so it may never be.
    fn expected_wait(&self) -> Option<f64> {
        None
    }
    /// Not ready: asks for this function, if the path may (called on
    /// every check; at most one request is on its way).
    fn request(&self) {}
    /// Sends one data message; blocks while out of credit.
    fn submit(&self, data: &Bytes) -> Result<Self::Ticket, ClientError>;
    /// That message's result.
    fn wait(&self, ticket: Self::Ticket) -> Result<Bytes, ClientError>;
}

struct Board {
    /// Next input no one has taken.
    next: usize,
    /// Inputs the cluster took but did not return a result for.
    returned: Vec<usize>,
    cluster: Side,
    cluster_inflight: usize,
    /// A local core failed: the run is over.
    abort: Option<CoworkError>,
    meter: Meter,
    local_items: usize,
    cluster_items: usize,
    cluster_error: Option<String>,
}

struct Shared<'a> {
    inputs: &'a [Bytes],
    /// Bytes of output per byte of input (output_size / input_size).
    sizes: (usize, usize),
    slots: Vec<OnceLock<Bytes>>,
    board: Mutex<Board>,
    cond: Condvar,
    clock: &'a dyn Clock,
    knobs: Knobs,
    /// Values known before the run (earlier runs), and values the caller
    /// pinned (they win over measurements).
    prior: Estimates,
    pinned: Estimates,
    /// The cluster path's [`ClusterPath::expected_wait`].
    wait: &'a (dyn Fn() -> Option<f64> + Sync),
}

impl Shared<'_> {
    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn estimates(&self, b: &Board) -> Estimates {
        self.prior.merged(b.meter.estimates()).merged(self.pinned)
    }

    fn output_len(&self, i: usize) -> usize {
        self.inputs[i].len() / self.sizes.0 * self.sizes.1
    }
}

/// Runs `inputs` on `cores` (one thread each) and `cluster`. The inputs are
/// already checked to be whole numbers of `sizes.0`-byte inputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<P: ClusterPath>(
    inputs: &[Bytes],
    sizes: (usize, usize),
    cores: &mut [Box<dyn Core>],
    cluster: &P,
    clock: &dyn Clock,
    knobs: Knobs,
    prior: Estimates,
    pinned: Estimates,
) -> Result<(Vec<Bytes>, CoworkReport), CoworkError> {
    let knobs = Knobs {
        threads: cores.len(),
        window: knobs.window.max(1),
        ..knobs
    };
    let wait = || cluster.expected_wait();
    let mut meter = Meter::new(cores.len());
    meter.o_0 = prior.o_0;
    let sh = Shared {
        inputs,
        sizes,
        slots: (0..inputs.len()).map(|_| OnceLock::new()).collect(),
        board: Mutex::new(Board {
            next: 0,
            returned: Vec::new(),
            cluster: Side::Waiting,
            cluster_inflight: 0,
            abort: None,
            meter,
            local_items: 0,
            cluster_items: 0,
            cluster_error: None,
        }),
        cond: Condvar::new(),
        clock,
        knobs,
        prior,
        pinned,
        wait: &wait,
    };
    let start = clock.now();
    std::thread::scope(|s| {
        for core in cores.iter_mut() {
            let sh = &sh;
            s.spawn(move || local_worker(sh, core.as_mut()));
        }
        cluster_path(&sh, cluster);
    });
    let elapsed = clock.now() - start;
    let b = sh.board.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = b.abort {
        return Err(e);
    }
    let measured = b.meter.estimates();
    let results = sh
        .slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .expect("every input has a result once no side failed")
        })
        .collect();
    let report = CoworkReport {
        local_items: b.local_items,
        cluster_items: b.cluster_items,
        cluster_error: b.cluster_error,
        estimates: sh.prior.merged(measured).merged(sh.pinned),
        measured,
        seconds: elapsed,
    };
    Ok((results, report))
}

fn local_worker(sh: &Shared<'_>, core: &mut dyn Core) {
    loop {
        let batch: Vec<usize> = {
            let mut b = sh.lock();
            loop {
                if b.abort.is_some() {
                    return;
                }
                if !b.returned.is_empty() {
                    let est = sh.estimates(&b);
                    let n = b.returned.len();
                    let k = policy::local_take(&est, n, 0, Side::Done, None, &sh.knobs);
                    b.meter.local_start();
                    break b.returned.split_off(n - k);
                }
                let unassigned = sh.inputs.len() - b.next;
                if unassigned > 0 {
                    let est = sh.estimates(&b);
                    let (side, inflight) = (b.cluster, b.cluster_inflight);
                    let wait = (side == Side::Waiting).then(|| (sh.wait)()).flatten();
                    let k = policy::local_take(&est, unassigned, inflight, side, wait, &sh.knobs);
                    if k > 0 {
                        b.meter.local_start();
                        let from = b.next;
                        b.next += k;
                        break (from..from + k).collect();
                    }
                } else if b.cluster == Side::Done {
                    return;
                }
                // The cluster may still give work back, or leave this
                // thread a share as its own work runs out.
                b = sh.cond.wait(b).unwrap_or_else(|p| p.into_inner());
            }
        };
        let t0 = sh.clock.now();
        for &i in &batch {
            let input = &sh.inputs[i];
            let mut out = vec![0u8; sh.output_len(i)];
            let chunks = input
                .chunks(sh.sizes.0)
                .zip(out.chunks_mut(sh.sizes.1.max(1)));
            for (inp, o) in chunks {
                if let Err(error) = core.process(inp, o) {
                    let mut b = sh.lock();
                    b.abort
                        .get_or_insert(CoworkError::Local { index: i, error });
                    sh.cond.notify_all();
                    return;
                }
            }
            let _ = sh.slots[i].set(Bytes::from(out));
        }
        let secs = sh.clock.now() - t0;
        let mut b = sh.lock();
        b.meter.local_batch(batch.len(), secs);
        b.local_items += batch.len();
        sh.cond.notify_all();
    }
}

/// How often a waiting cluster path looks again, besides after every
/// local batch (a configuration may be answered in the middle of a long one).
const READY_POLL: Duration = Duration::from_millis(1);

/// Waits until the cluster runs this function or no work is left to take;
/// re-checks after every local batch and every [`READY_POLL`]. True if the
/// cluster is ready.
fn wait_ready<P: ClusterPath>(sh: &Shared<'_>, cluster: &P) -> bool {
    loop {
        if cluster.ready() {
            return true;
        }
        cluster.request();
        let b = sh.lock();
        if b.abort.is_some() || b.next >= sh.inputs.len() {
            return false;
        }
        // Local threads holding back for a configuration on its way look
        // again too: it may have failed, or be overdue.
        sh.cond.notify_all();
        let waited = sh.cond.wait_timeout(b, READY_POLL);
        drop(waited.unwrap_or_else(|p| p.into_inner()));
    }
}

fn cluster_path<P: ClusterPath>(sh: &Shared<'_>, cluster: &P) {
    let failure = if wait_ready(sh, cluster) {
        sh.lock().cluster = Side::Active;
        feed_cluster(sh, cluster).err()
    } else {
        None
    };
    let mut b = sh.lock();
    b.cluster = Side::Done;
    if let Some((e, unfinished)) = failure {
        b.cluster_inflight = 0;
        b.returned.extend(unfinished);
        b.cluster_error = Some(e);
    }
    sh.cond.notify_all();
}

/// Keeps the cluster busy with its share; on failure returns the reason
/// and the inputs it took without returning their results.
fn feed_cluster<P: ClusterPath>(sh: &Shared<'_>, cluster: &P) -> Result<(), (String, Vec<usize>)> {
    let mut inflight: VecDeque<(usize, P::Ticket, f64)> = VecDeque::new();
    let mut first_submit = true;
    let unfinished = |inflight: &VecDeque<(usize, P::Ticket, f64)>, rest: &[usize]| {
        inflight
            .iter()
            .map(|e| e.0)
            .chain(rest.iter().copied())
            .collect::<Vec<_>>()
    };
    loop {
        let took: Vec<usize> = {
            let mut b = sh.lock();
            if b.abort.is_some() {
                return Ok(());
            }
            let est = sh.estimates(&b);
            let unassigned = sh.inputs.len() - b.next;
            let k = policy::cluster_take(&est, unassigned, inflight.len(), &sh.knobs);
            let from = b.next;
            b.next += k;
            b.cluster_inflight += k;
            (from..from + k).collect()
        };
        for (n, &i) in took.iter().enumerate() {
            let t = sh.clock.now();
            match cluster.submit(&sh.inputs[i]) {
                Ok(ticket) => inflight.push_back((i, ticket, t)),
                Err(e) => return Err((e.to_string(), unfinished(&inflight, &took[n..]))),
            }
            if first_submit {
                first_submit = false;
                let mut b = sh.lock();
                // O_c: what starting to co-work costs the CPU beyond O_0.
                b.meter.o_c = Some(b.meter.o_0.unwrap_or(0.0) + (sh.clock.now() - t));
            }
        }
        let Some((i, ticket, sent)) = inflight.pop_front() else {
            return Ok(());
        };
        let result = cluster.wait(ticket);
        let arrived = sh.clock.now();
        let data = match result {
            Ok(d) if d.len() == sh.output_len(i) => d,
            Ok(d) => {
                let why = format!(
                    "the cluster returned {} bytes for input {i}, expected {}",
                    d.len(),
                    sh.output_len(i)
                );
                return Err((why, unfinished(&inflight, &[i])));
            }
            Err(e) => return Err((e.to_string(), unfinished(&inflight, &[i]))),
        };
        let _ = sh.slots[i].set(data);
        let mut b = sh.lock();
        b.meter.cluster_result(sent, arrived);
        if inflight.is_empty() {
            b.meter.cluster_idle();
        }
        b.cluster_items += 1;
        b.cluster_inflight -= 1;
        // What is left may now be the local threads' share.
        sh.cond.notify_all();
    }
}
