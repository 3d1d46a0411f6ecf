//! Soak users: each thread connects, configures the benchmarking core with
//! random sizes and delay, streams a random number of tagged data messages,
//! checks every result against its input's tag, asks the server how many
//! results it sent (a duplicate shows there), and leaves; then again.
//! Every wait longer than [`UserConfig::slow`] (for a result, from its
//! message's submission; for a configuration, from the connect) is kept
//! with its times, so the campaign can hold it against the faults it
//! overlapped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use corefarm_client::{Client, ClientError, ClientOptions, Pending};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bytes of each input that the benchmarking core echoes (seed 000 §4.2.2).
const TAG: usize = 16;

/// What users saw, summed over all threads.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct UserTotals {
    pub sessions: u64,
    /// Data messages sent and inputs in them.
    pub messages: u64,
    pub inputs: u64,
    /// Results whose every output echoed its input's tag.
    pub results_ok: u64,
    /// Results with a wrong length or a tag of another input.
    pub results_wrong: u64,
    /// Results the server counted for a session beyond the messages it sent.
    pub duplicates: u64,
    /// Messages whose result did not arrive within the result timeout in a
    /// session that was otherwise alive.
    pub missing: u64,
    /// Sessions that ended with an error, and the messages they had in
    /// flight then (unanswered, but the user was told).
    pub session_errors: u64,
    pub unanswered_in_failed_sessions: u64,
    /// The first few session errors, verbatim.
    pub errors: Vec<String>,
    /// The longest a user waited for a result, a configuration or credit.
    pub max_wait_ms: u64,
}

/// A wait longer than [`UserConfig::slow`].
#[derive(Debug, Clone)]
pub struct Wait {
    pub user: u32,
    pub session: u32,
    /// What for: "the result of message 17", "its configuration".
    pub what: String,
    pub from: Instant,
    pub to: Instant,
}

pub struct UserConfig {
    /// User u's server address (a list with a standby), or its proxy's.
    pub addrs: Vec<String>,
    pub result_timeout: Duration,
    pub window: usize,
    /// The user secret, when the server runs with `--auth-file`.
    pub secret: Option<corefarm_smp::auth::Secret>,
    /// Waits longer than this are kept in `waits`.
    pub slow: Duration,
    pub waits: Mutex<Vec<Wait>>,
    /// Server faults waiting for their first result.
    pub stalls: Arc<Stalls>,
}

/// The user-visible stall of each server fault: from the kill to the
/// first correct result any user received after it.
#[derive(Debug, Default)]
pub struct Stalls {
    /// Faults still without a result: users look only when it is not 0.
    open: std::sync::atomic::AtomicUsize,
    /// (kill, first result after it).
    pub all: Mutex<Vec<(Instant, Option<Instant>)>>,
}

impl Stalls {
    pub fn begin(&self, at: Instant) {
        self.all.lock().unwrap().push((at, None));
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    fn result(&self, now: Instant) {
        if self.open.load(Ordering::Relaxed) == 0 {
            return;
        }
        for s in self.all.lock().unwrap().iter_mut() {
            if s.1.is_none() && s.0 <= now {
                s.1 = Some(now);
                self.open.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Each fault's stall in milliseconds, `None` for one no result ever
    /// followed.
    pub fn millis(&self) -> Vec<Option<u64>> {
        self.all
            .lock()
            .unwrap()
            .iter()
            .map(|(a, b)| b.map(|b| b.duration_since(*a).as_millis() as u64))
            .collect()
    }
}

impl UserConfig {
    fn waited(&self, s: &mut UserTotals, w: Wait) {
        let d = w.to.duration_since(w.from);
        s.max_wait_ms = s.max_wait_ms.max(d.as_millis() as u64);
        if d > self.slow {
            self.waits.lock().unwrap().push(w);
        }
    }
}

/// Runs user `u` until `stop` is set.
pub fn run_user(
    u: u32,
    seed: u64,
    cfg: &UserConfig,
    stop: &AtomicBool,
    totals: &Mutex<UserTotals>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (u64::from(u) << 32));
    let mut session = 0u32;
    while !stop.load(Ordering::Relaxed) {
        session += 1;
        let mut s = UserTotals {
            sessions: 1,
            ..Default::default()
        };
        if let Err(e) = run_session(u, session, &mut rng, cfg, stop, &mut s) {
            s.session_errors += 1;
            s.errors.push(format!("user {u} session {session}: {e}"));
        }
        merge(&mut totals.lock().unwrap(), s);
        // A short random pause, so connects and leaves interleave.
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..100)));
    }
}

fn merge(into: &mut UserTotals, s: UserTotals) {
    into.sessions += s.sessions;
    into.messages += s.messages;
    into.inputs += s.inputs;
    into.results_ok += s.results_ok;
    into.results_wrong += s.results_wrong;
    into.duplicates += s.duplicates;
    into.missing += s.missing;
    into.session_errors += s.session_errors;
    into.unanswered_in_failed_sessions += s.unanswered_in_failed_sessions;
    into.max_wait_ms = into.max_wait_ms.max(s.max_wait_ms);
    for e in s.errors {
        if into.errors.len() < 20 {
            into.errors.push(e);
        }
    }
}

fn tag(u: u32, session: u32, msg: u32, input: u32) -> [u8; TAG] {
    let mut t = [0u8; TAG];
    for (i, v) in [u, session, msg, input].into_iter().enumerate() {
        t[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    t
}

/// Connects as a user program that knows its server may be restarting
/// does: a connection that fails in a way a new attempt may cure (refused
/// while the server is down, say) is tried again, backing off from 50 ms to
/// 1 s, for as long as a session resumes (the client's default
/// `reconnect_timeout`). Once connected, the client itself resumes.
fn connect(addr: &str, opts: ClientOptions, stop: &AtomicBool) -> Result<Client, ClientError> {
    let bound = opts.reconnect_timeout.unwrap_or_default();
    let deadline = Instant::now() + bound;
    let mut backoff = Duration::from_millis(50);
    loop {
        match Client::connect(addr, opts.clone()) {
            Err(e)
                if e.retryable() && Instant::now() < deadline && !stop.load(Ordering::Relaxed) =>
            {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

fn run_session(
    u: u32,
    session: u32,
    rng: &mut StdRng,
    cfg: &UserConfig,
    stop: &AtomicBool,
    s: &mut UserTotals,
) -> anyhow::Result<()> {
    let connecting = Instant::now();
    let client = connect(
        &cfg.addrs[u as usize],
        ClientOptions {
            nodes: Some(rng.gen_range(1..=2)),
            name: Some(format!("soak-user-{u}")),
            io_timeout: Some(cfg.result_timeout),
            secret: cfg.secret.clone(),
            ..Default::default()
        },
        stop,
    )?;
    let input_size = [64u32, 1024, 8192, 65536][rng.gen_range(0..4)];
    let output_size = [16u32, 64, 256][rng.gen_range(0..3)];
    client.configure_benchmark(input_size, output_size, rng.gen_range(0..300))?;
    cfg.waited(
        s,
        Wait {
            user: u,
            session,
            what: "its configuration".into(),
            from: connecting,
            to: Instant::now(),
        },
    );
    let count = rng.gen_range(1..=4u32);
    let messages = rng.gen_range(20..200u32);
    let make = |m: u32| -> Bytes {
        let mut b = BytesMut::with_capacity((count * input_size) as usize);
        for i in 0..count {
            b.put_slice(&tag(u, session, m, i));
            b.put_bytes(0xA5, input_size as usize - TAG);
        }
        b.freeze()
    };
    let check = |m: u32, data: &[u8]| -> bool {
        data.len() == (count * output_size) as usize
            && (0..count).all(|i| {
                let at = (i * output_size) as usize;
                data[at..at + TAG] == tag(u, session, m, i)
            })
    };
    let mut in_flight: std::collections::VecDeque<(u32, Instant, Pending)> = Default::default();
    let mut next = 0u32;
    while next < messages || !in_flight.is_empty() {
        while next < messages && in_flight.len() < cfg.window && !stop.load(Ordering::Relaxed) {
            // A submission waits for the server's credit: a session held
            // there is as stuck as one waiting for a result.
            let submitting = Instant::now();
            let r = client.submit_pending(make(next));
            cfg.waited(
                s,
                Wait {
                    user: u,
                    session,
                    what: format!("credit to send message {next}"),
                    from: submitting,
                    to: Instant::now(),
                },
            );
            match r {
                Ok(p) => in_flight.push_back((next, Instant::now(), p)),
                Err(e) => {
                    s.unanswered_in_failed_sessions += in_flight.len() as u64;
                    return Err(e.into());
                }
            }
            s.messages += 1;
            s.inputs += u64::from(count);
            next += 1;
        }
        if stop.load(Ordering::Relaxed) {
            // Finish what is in flight, send nothing more.
            next = messages;
        }
        let Some((m, sent, p)) = in_flight.pop_front() else {
            break;
        };
        let r = p.wait(Some(cfg.result_timeout));
        cfg.waited(
            s,
            Wait {
                user: u,
                session,
                what: format!("the result of message {m}"),
                from: sent,
                to: Instant::now(),
            },
        );
        match r {
            Ok(out) if check(m, &out.data) => {
                s.results_ok += 1;
                cfg.stalls.result(Instant::now());
            }
            Ok(_) => s.results_wrong += 1,
            Err(corefarm_client::ClientError::Timeout { .. }) => {
                s.missing += 1 + in_flight.len() as u64;
                anyhow::bail!("no result for message {m} within {:?}", cfg.result_timeout);
            }
            Err(e) => {
                s.unanswered_in_failed_sessions += 1 + in_flight.len() as u64;
                return Err(e.into());
            }
        }
    }
    // Exactly once: the server's count of results sent to this session
    // equals the messages sent (a duplicate would not reach `Pending`).
    // A resumed session's server counts only its own results, and one lost
    // just now cannot be asked: the client's dedupe by id covers those.
    match client.status() {
        Ok(status) if client.resumes() == 0 => {
            let me = status
                .you
                .and_then(|id| status.users.iter().find(|x| x.id == id));
            if let Some(me) = me {
                let sent = u64::from(next);
                s.duplicates += me.results.saturating_sub(sent);
            }
        }
        Ok(_) => {}
        Err(e) if e.retryable() => {}
        Err(e) => return Err(e.into()),
    }
    client.close();
    Ok(())
}

/// Spawns `n` user threads; they run until `stop` is set.
pub fn spawn_users(
    n: u32,
    seed: u64,
    cfg: Arc<UserConfig>,
    stop: Arc<AtomicBool>,
    totals: Arc<Mutex<UserTotals>>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|u| {
            let (cfg, stop, totals) = (cfg.clone(), stop.clone(), totals.clone());
            std::thread::spawn(move || run_user(u, seed, &cfg, &stop, &totals))
        })
        .collect()
}
