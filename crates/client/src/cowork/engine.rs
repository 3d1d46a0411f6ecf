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
//!
//! When nothing is left to take, the cluster also computes messages local
//! threads are still on ([`policy::worth_backup`]): the first result fills
//! the slot, and a local thread gives up a message whose slot is filled,
//! checking between its inputs.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::{Core, CoreError};

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
    /// Messages local threads took and have not finished, with when each
    /// is expected done (infinite before `X_c` is known).
    local_running: Vec<(usize, f64)>,
    backups: usize,
}

/// One co-worked call: its inputs, the slots its results land in, and
/// the board its local threads and its cluster feeder coordinate on.
struct Job<'a> {
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

impl Job<'_> {
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
/// already checked to be whole numbers of `sizes.0`-byte inputs. A core
/// that panicked is removed from `cores`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<P: ClusterPath>(
    inputs: &[Bytes],
    sizes: (usize, usize),
    cores: &mut Vec<Box<dyn Core>>,
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
    let job = Job {
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
            local_running: Vec::new(),
            backups: 0,
        }),
        cond: Condvar::new(),
        clock,
        knobs,
        prior,
        pinned,
        wait: &wait,
    };
    let start = clock.now();
    let panicked: Vec<bool> = std::thread::scope(|s| {
        let threads: Vec<_> = cores
            .iter_mut()
            .map(|core| {
                let job = &job;
                s.spawn(move || local_worker(job, core.as_mut()))
            })
            .collect();
        cluster_path(&job, cluster);
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or(true))
            .collect()
    });
    // A core that panicked is not run again: it may have been stopped
    // halfway through changing its own state.
    let mut k = 0;
    cores.retain(|_| {
        k += 1;
        !panicked[k - 1]
    });
    let elapsed = clock.now() - start;
    let b = job.board.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = b.abort {
        return Err(e);
    }
    let measured = b.meter.estimates();
    let results = job
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
        backups: b.backups,
        cluster_error: b.cluster_error,
        estimates: job.prior.merged(measured).merged(job.pinned),
        measured,
        seconds: elapsed,
    };
    Ok((results, report))
}

/// One local thread's loop. Returns whether its core panicked: such a core
/// may be left in any state, so the caller drops it.
fn local_worker(job: &Job<'_>, core: &mut dyn Core) -> bool {
    loop {
        let batch: Vec<usize> = {
            let mut b = job.lock();
            loop {
                if b.abort.is_some() {
                    return false;
                }
                if !b.returned.is_empty() {
                    let est = job.estimates(&b);
                    let n = b.returned.len();
                    let k = policy::local_take(&est, n, 0, Side::Done, None, &job.knobs);
                    let batch = b.returned.split_off(n - k);
                    break start_batch(job, &mut b, &est, batch);
                }
                let unassigned = job.inputs.len() - b.next;
                if unassigned > 0 {
                    let est = job.estimates(&b);
                    let (side, inflight) = (b.cluster, b.cluster_inflight);
                    let wait = (side == Side::Waiting).then(|| (job.wait)()).flatten();
                    let k = policy::local_take(&est, unassigned, inflight, side, wait, &job.knobs);
                    if k > 0 {
                        let from = b.next;
                        b.next += k;
                        break start_batch(job, &mut b, &est, (from..from + k).collect());
                    }
                } else if b.cluster == Side::Done {
                    return false;
                }
                // The cluster may still give work back, or leave this
                // thread a share as its own work runs out.
                b = job.cond.wait(b).unwrap_or_else(|p| p.into_inner());
            }
        };
        let t0 = job.clock.now();
        // A message given up for the cluster's copy counts the share of
        // its inputs done: a thread slower than the cluster may give up
        // every message it starts, and still its speed is measured.
        let (mut done, mut answered) = (0.0, 0);
        for &i in &batch {
            let answered_elsewhere = || job.slots[i].get().is_some();
            // A core that panics fails the run like one that returns an
            // error: its thread would otherwise end holding messages no
            // one else takes (the cluster path waited for them forever).
            let (computed, panicked) =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    compute(&job.inputs[i], job.sizes, &mut *core, answered_elsewhere)
                })) {
                    Ok(c) => (c, false),
                    Err(p) => (Err(CoreError::Failed(panic_message(p.as_ref()))), true),
                };
            match computed {
                Ok(Computed::Whole(out)) => {
                    done += 1.0;
                    answered += usize::from(job.slots[i].set(out).is_ok());
                }
                Ok(Computed::GaveUp(share)) => done += share,
                Err(error) => {
                    let mut b = job.lock();
                    b.abort
                        .get_or_insert(CoworkError::Local { index: i, error });
                    job.cond.notify_all();
                    return panicked;
                }
            }
        }
        let busy = job.clock.now() - t0;
        let mut b = job.lock();
        b.meter.local_batch(done, busy);
        b.local_items += answered;
        b.local_running.retain(|(i, _)| !batch.contains(i));
        job.cond.notify_all();
    }
}

/// What a panicking core said, as an error message.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    format!("the core panicked: {what}")
}

/// Marks `batch` as taken by a local thread, each message expected done
/// one local message time after the one before it.
fn start_batch(job: &Job<'_>, b: &mut Board, est: &Estimates, batch: Vec<usize>) -> Vec<usize> {
    b.meter.local_start();
    let now = job.clock.now();
    // X_c counts all local threads; one thread does 1/threads of it.
    let per = est
        .x_c
        .filter(|x| *x > 0.0)
        .map_or(f64::INFINITY, |x| job.knobs.threads.max(1) as f64 / x);
    for (n, &i) in batch.iter().enumerate() {
        b.local_running.push((i, now + per * (n + 1) as f64));
    }
    batch
}

/// What a local thread made of one message.
#[derive(Debug, PartialEq)]
enum Computed {
    Whole(Bytes),
    /// Its result came from the cluster first, with this share of the
    /// message's inputs done.
    GaveUp(f64),
}

/// One message (`sizes.0`-byte inputs to `sizes.1`-byte outputs) through
/// `core`, given up once `answered` says its result came from the cluster
/// (asked before every input: a core cannot be stopped inside one).
fn compute(
    input: &[u8],
    sizes: (usize, usize),
    core: &mut dyn Core,
    answered: impl Fn() -> bool,
) -> Result<Computed, CoreError> {
    let n = input.len() / sizes.0;
    let mut out = vec![0u8; n * sizes.1];
    for (k, (inp, o)) in input
        .chunks(sizes.0)
        .zip(out.chunks_mut(sizes.1.max(1)))
        .enumerate()
    {
        if answered() {
            return Ok(Computed::GaveUp(k as f64 / n as f64));
        }
        core.process(inp, o)?;
    }
    Ok(Computed::Whole(Bytes::from(out)))
}

/// How often a waiting cluster path looks again, besides after every
/// local batch (a configuration may be answered in the middle of a long one).
const READY_POLL: Duration = Duration::from_millis(1);

/// Waits until the cluster runs this function or no work is left to take;
/// re-checks after every local batch and every [`READY_POLL`]. True if the
/// cluster is ready.
fn wait_ready<P: ClusterPath>(job: &Job<'_>, cluster: &P) -> bool {
    loop {
        if cluster.ready() {
            return true;
        }
        let over = |b: &Board| {
            // With nothing left to take, a cluster configured while a local
            // thread is still on a message can take a backup copy of it.
            let copyable = job.knobs.backup && !b.local_running.is_empty();
            b.abort.is_some() || (b.next >= job.inputs.len() && !copyable)
        };
        // No request for a call with nothing (left) to do.
        if over(&job.lock()) {
            return false;
        }
        cluster.request();
        let b = job.lock();
        if over(&b) {
            return false;
        }
        // Local threads holding back for a configuration on its way look
        // again too: it may have failed, or be overdue.
        job.cond.notify_all();
        let waited = job.cond.wait_timeout(b, READY_POLL);
        drop(waited.unwrap_or_else(|p| p.into_inner()));
    }
}

fn cluster_path<P: ClusterPath>(job: &Job<'_>, cluster: &P) {
    let failure = if wait_ready(job, cluster) {
        job.lock().cluster = Side::Active;
        feed_cluster(job, cluster).err()
    } else {
        None
    };
    let mut b = job.lock();
    b.cluster = Side::Done;
    if let Some((e, unfinished)) = failure {
        b.cluster_inflight = 0;
        b.returned.extend(unfinished);
        b.cluster_error = Some(e);
    }
    job.cond.notify_all();
}

/// A message at the cluster.
struct InFlight<T> {
    i: usize,
    ticket: T,
    sent: f64,
    /// A copy of a message a local thread is on.
    backup: bool,
}

/// Up to `room` messages local threads are on that the cluster should
/// compute too, those expected done last first.
fn backups(job: &Job<'_>, b: &Board, est: &Estimates, copied: &[usize], room: usize) -> Vec<usize> {
    let now = job.clock.now();
    let mut due: Vec<(usize, f64)> = b
        .local_running
        .iter()
        .copied()
        .filter(|&(i, finish)| {
            !copied.contains(&i)
                && job.slots[i].get().is_none()
                && policy::worth_backup(finish, now, est.d_a)
        })
        .collect();
    due.sort_by(|a, b| b.1.total_cmp(&a.1));
    due.into_iter().take(room).map(|(i, _)| i).collect()
}

/// Keeps the cluster busy with its share; on failure returns the reason
/// and the inputs it took without returning their results.
fn feed_cluster<P: ClusterPath>(job: &Job<'_>, cluster: &P) -> Result<(), (String, Vec<usize>)> {
    let mut inflight: VecDeque<InFlight<P::Ticket>> = VecDeque::new();
    let mut copied: Vec<usize> = Vec::new();
    let mut first_submit = true;
    // A backup's message is still a local thread's: never given back.
    let unfinished = |inflight: &VecDeque<InFlight<P::Ticket>>, rest: &[usize], backup: bool| {
        inflight
            .iter()
            .filter(|e| !e.backup)
            .map(|e| e.i)
            .chain(rest.iter().copied().filter(|_| !backup))
            .collect::<Vec<_>>()
    };
    loop {
        let (took, backup): (Vec<usize>, bool) = {
            let mut b = job.lock();
            if b.abort.is_some() {
                return Ok(());
            }
            let est = job.estimates(&b);
            let unassigned = job.inputs.len() - b.next;
            let k = policy::cluster_take(&est, unassigned, inflight.len(), &job.knobs);
            if k == 0 && unassigned == 0 && b.returned.is_empty() && job.knobs.backup {
                let room = job.knobs.window.saturating_sub(inflight.len());
                let copies = backups(job, &b, &est, &copied, room);
                b.backups += copies.len();
                copied.extend_from_slice(&copies);
                (copies, true)
            } else {
                let from = b.next;
                b.next += k;
                b.cluster_inflight += k;
                ((from..from + k).collect(), false)
            }
        };
        for (n, &i) in took.iter().enumerate() {
            let t = job.clock.now();
            match cluster.submit(&job.inputs[i]) {
                Ok(ticket) => inflight.push_back(InFlight {
                    i,
                    ticket,
                    sent: t,
                    backup,
                }),
                Err(e) => return Err((e.to_string(), unfinished(&inflight, &took[n..], backup))),
            }
            if first_submit {
                first_submit = false;
                let mut b = job.lock();
                // O_c: what starting to co-work costs the CPU beyond O_0.
                b.meter.o_c = Some(b.meter.o_0.unwrap_or(0.0) + (job.clock.now() - t));
            }
        }
        // A backup answered locally meanwhile: its ticket is dropped (the
        // client discards the result when it comes).
        while inflight
            .front()
            .is_some_and(|e| e.backup && job.slots[e.i].get().is_some())
        {
            inflight.pop_front();
        }
        let Some(InFlight {
            i,
            ticket,
            sent,
            backup,
        }) = inflight.pop_front()
        else {
            return Ok(());
        };
        let result = cluster.wait(ticket);
        let arrived = job.clock.now();
        let data = match result {
            Ok(d) if d.len() == job.output_len(i) => d,
            Ok(d) => {
                let why = format!(
                    "the cluster returned {} bytes for input {i}, expected {}",
                    d.len(),
                    job.output_len(i)
                );
                return Err((why, unfinished(&inflight, &[i], backup)));
            }
            Err(e) => return Err((e.to_string(), unfinished(&inflight, &[i], backup))),
        };
        let answered = job.slots[i].set(data).is_ok();
        let mut b = job.lock();
        b.meter.cluster_result(sent, arrived);
        if inflight.is_empty() {
            b.meter.cluster_idle();
        }
        b.cluster_items += usize::from(answered);
        if !backup {
            b.cluster_inflight -= 1;
        }
        // What is left may now be the local threads' share.
        job.cond.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles each byte; counts its calls.
    struct Doubler(usize);

    impl Core for Doubler {
        fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
            self.0 += 1;
            for (o, i) in output.iter_mut().zip(input) {
                *o = i.wrapping_mul(2);
            }
            Ok(())
        }
    }

    #[test]
    fn a_message_answered_elsewhere_is_given_up_between_inputs() {
        let input = [1u8, 2, 3, 4, 5, 6];
        let mut core = Doubler(0);
        let out = compute(&input, (2, 2), &mut core, || false).unwrap();
        let whole = Bytes::from_static(&[2, 4, 6, 8, 10, 12]);
        assert_eq!(out, Computed::Whole(whole));
        assert_eq!(core.0, 3);

        // Answered after the first input: the other two are not computed.
        let mut core = Doubler(0);
        let asked = std::cell::Cell::new(0);
        let answered = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        let out = compute(&input, (2, 2), &mut core, answered).unwrap();
        assert_eq!(out, Computed::GaveUp(1.0 / 3.0));
        assert_eq!(core.0, 1);

        // Answered before it began: the core is never called.
        let mut core = Doubler(0);
        let out = compute(&input, (2, 2), &mut core, || true).unwrap();
        assert_eq!(out, Computed::GaveUp(0.0));
        assert_eq!(core.0, 0);
    }
}
