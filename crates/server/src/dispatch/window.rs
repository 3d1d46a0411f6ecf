//! The credit policy's window: how many messages a node may have in
//! flight, found by measuring what each window delivers. A user session's
//! nodes all hold the same window, judged on their results together (an
//! epoch needs each node's share of results): windows of their own competed
//! for what the nodes share — the user's link, the server's CPU — and one
//! node's window grew by taking its neighbours' share of it.
//!
//! Whatever the node's rhythm — a corefarm node that pipelines reading,
//! computing and writing, or a seed node that reads one message, works,
//! then writes — and whatever the bottleneck (the node's cores, the links,
//! the round trip through the server), delivered rate `r` grows with the
//! window `w` until the window covers the round trip, then stays flat while
//! latency (`w / r`, Little's law) keeps growing. The window climbs that
//! curve by trying a neighbour now and then and keeping it if it scores
//! better on
//!
//! ```text
//! score(w) = (1 + κ)·ln r(w) − κ·ln w      (κ = LATENCY_WEIGHT)
//! ```
//!
//! which is ln(r · (r / w)^κ): throughput, with a small price on latency.
//! Below the knee `r ∝ w` and the score grows with `w`; past it `r` is
//! flat and the score falls — so the climb stops at the smallest window
//! that reaches the plateau (where a 1 % larger window would buy less than
//! κ / (1 + κ) % more throughput). No model of the node is needed, only its
//! results: a signal taken from the node's side (a result that finds the
//! node idle) misses a node that goes idle between the server's refills,
//! which is how a sequential seed node starved a window that thought it
//! was big enough.
//!
//! Measuring: an *epoch* is a run of results after the window last changed
//! (the first `w` are skipped, the pipeline still holding the old window's
//! messages), long enough to time: at least `2·w` and [`MIN_EPOCH_RESULTS`]
//! results over at least [`MIN_EPOCH`]. Only epochs in which the window was
//! the limit count — the node had its whole window in flight now and then,
//! or the user was out of credit; a user that never fills the window says
//! nothing about it.
//!
//! Starting: a new window doubles after every epoch whose rate grew by at
//! least [`STARTUP_GROWTH`] over the best before it, as BBR's start-up
//! doubles its rate while the delivery rate keeps up: below the knee a
//! doubled window doubles the rate, far beyond any epoch's noise, so the
//! climb needs no bracketing trials. The first epoch that grows less ends
//! it at the best-scoring window it measured, and trials take over. A
//! window that began far below its knee (large messages, where one trial
//! takes seconds) otherwise spent a short session there. A
//! start-up still doubling when the byte budget caps it stays at the cap
//! and waits the longest before a trial: the half window was just measured
//! to lose, and the trials downward it began with at once cost large
//! messages a tenth of their throughput over a short session. So does a
//! window that starts at the cap (messages of megabytes).
//!
//! Judging: a trial alternates epochs of the neighbour and of the current
//! window, current first and last, and scores each neighbour epoch against
//! the mean of the current window's epochs on either side of it. Other work
//! on the machine comes and goes over tens of milliseconds and moves every
//! window's rate alike: the bracketing cancels such drift, and a pair whose
//! two bracketing epochs disagree (by more than [`SAME_CONDITIONS`] or
//! twice the epochs' usual spread) saw the machine change under it and is
//! left out. One epoch's noise on a loaded machine is as large as the gain a
//! trial looks for (two consecutive epochs of one window differ by a tenth
//! or more), so the verdict goes on the pairs' mean: as soon as it stands
//! [`CONFIDENCE`] standard errors clear of the bar, else after
//! [`MAX_PAIRS`]. Upward the bar is a margin, since every wrong step up
//! costs latency; downward a tie is enough, for the latency. After a failed
//! trial the next waits twice as many epochs (up to [`MAX_PROBE_GAP`]), so
//! a settled window spends little time on worse neighbours; a success tries
//! again at once, twice as far upward, so a window far below its knee gets
//! there in a few trials.

use std::time::Duration;

/// Largest adaptive window, in messages, whatever their size: bounds the
/// in-flight table of small messages.
pub const MAX_WINDOW: u32 = 256;

/// Smallest adaptive window: one message in service plus the next one
/// ready, so that a node never waits for the server's round trip to learn
/// it needs more (a smaller window only saves latency the node would lose
/// in throughput).
pub const MIN_WINDOW: u32 = 2;

/// κ: the price of latency in the score. At 0.15 a window 25 % larger must
/// bring 2.9 % more throughput; one message more than two (50 % larger,
/// latency up by half where the node is the bottleneck) must bring 5.4 %.
pub const LATENCY_WEIGHT: f64 = 0.15;

/// A probe upward must beat its reference by this much (log units): every
/// wrong step up costs latency.
const UP_MARGIN: f64 = 0.01;

/// Pairs of epochs (the tried window's, then the current one's) a trial
/// measures before a verdict on their mean, and how few may end it early
/// when their mean stands [`CONFIDENCE`] standard errors clear.
const MAX_PAIRS: u32 = 4;
const MIN_PAIRS: u32 = 2;
const CONFIDENCE: f64 = 2.0;

/// Pairs a trial may leave out (their bracketing epochs disagreed) before
/// it is given up for later.
const MAX_DROPPED_PAIRS: u32 = 2;

/// Results an epoch needs at least, whatever the window.
pub const MIN_EPOCH_RESULTS: u32 = 16;

/// Time an epoch spans at least: shorter spans time scheduler noise.
pub const MIN_EPOCH: Duration = Duration::from_millis(10);

/// Most epochs between probes, reached after failed probes.
pub const MAX_PROBE_GAP: u32 = 16;

/// Two epochs of one window may differ by this much (log units) and still
/// be taken for the same conditions: a trial whose reference epochs differ
/// more saw the machine change under it, and says nothing.
pub const SAME_CONDITIONS: f64 = 0.08;

/// A start-up epoch must beat the best rate before it by this factor for
/// the window to double again: a doubling below the knee brings about 2×,
/// one past it about 1×, and one epoch's noise stays well inside 1.25×.
pub const STARTUP_GROWTH: f64 = 1.25;

/// Windows a start-up remembers (it doubles from 1 to [`MAX_WINDOW`]).
const STARTUP_STEPS: usize = 9;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Doubling while the rate keeps up; `seen` holds the epochs measured
    /// so far as (window, score), and `best` the best ln rate among them.
    Startup {
        seen: [(u32, f64); STARTUP_STEPS],
        n: usize,
        best: f64,
    },
    /// At the window that last scored best; probes after `gap` epochs.
    Cruise,
    /// A trial of `to` against `from`, epochs of each taking turns: at
    /// `to` while `at_to`, else back at `from`. `before` is `from`'s epoch
    /// before the one at `to`, `tried` that one's score; `pairs` holds the
    /// differences measured so far.
    Trial {
        from: u32,
        to: u32,
        up: bool,
        at_to: bool,
        before: f64,
        tried: f64,
        pairs: Pairs,
    },
}

/// The window of a session's nodes (credit policy); the shared scheduler
/// keeps one per node.
#[derive(Debug, Clone)]
pub struct Window {
    cur: u32,
    /// Fixed windows never adapt (`--credit-window fixed`).
    adaptive: bool,
    phase: Phase,
    /// The last epoch's score at `cur`, and the mean difference between
    /// consecutive epochs of one window: how noisy one epoch's score is.
    last: Option<f64>,
    spread: f64,
    /// Step of the next probe after a successful one (0: the default).
    stride: u32,
    /// Epochs in cruise since the last probe, and how many to wait.
    quiet: u32,
    gap: u32,
    /// The next probe goes up (else down); alternates while both fail.
    next_up: bool,
    /// Nodes whose results feed the epochs (each holds `cur` in flight).
    nodes: u32,
    /// Results still to skip before the epoch starts counting.
    skip: u32,
    /// The epoch so far: first result's time, results, and those the
    /// window limited.
    start: Option<Duration>,
    results: u32,
    limited: u32,
}

/// One result, as the window sees it.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// When it came back, on any monotonic clock.
    pub at: Duration,
    /// Messages still in flight at the node after it.
    pub left: usize,
    /// The user is out of credit: it waits for the windows, so they limit
    /// it even if this node never looked full.
    pub user_blocked: bool,
    /// Largest window allowed now (the byte budget over the message size).
    pub cap: u32,
    /// Nodes sharing the window: their results together make the epochs.
    pub nodes: u32,
}

impl Window {
    pub fn new(initial: u32, adaptive: bool) -> Self {
        let cur = initial.clamp(1, MAX_WINDOW);
        Window {
            cur,
            adaptive,
            // A new window has no measure yet: it doubles while that pays.
            phase: Phase::Startup {
                seen: [(0, 0.0); STARTUP_STEPS],
                n: 0,
                best: f64::NEG_INFINITY,
            },
            last: None,
            spread: 0.0,
            stride: 0,
            quiet: 0,
            gap: 0,
            next_up: true,
            nodes: 1,
            skip: cur,
            start: None,
            results: 0,
            limited: 0,
        }
    }

    /// Messages the node may have in flight.
    pub fn get(&self) -> u32 {
        self.cur
    }

    /// A result came back.
    pub fn on_result(&mut self, a: Answer) {
        if !self.adaptive {
            return;
        }
        let cap = a.cap.clamp(1, MAX_WINDOW);
        let nodes = a.nodes.max(1);
        if nodes != self.nodes {
            // A node came or went: the rate changes with it, not with the
            // window; the epoch starts afresh once the pipeline has refilled.
            self.nodes = nodes;
            self.set(self.cur, self.phase);
            return;
        }
        if self.cur > cap {
            // The budget shrank under the window: obey it, measure afresh.
            self.set(cap, Phase::Cruise);
            return;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        let start = *self.start.get_or_insert(a.at);
        self.results += 1;
        // The window was full just before this result left it. Results
        // come in bursts (a node's socket read in one go, then the refill),
        // so only a burst's first finds it full: that one counts.
        if a.user_blocked || a.left + 1 >= self.cur as usize {
            self.limited += 1;
        }
        let span = a.at.saturating_sub(start);
        let needed = MIN_EPOCH_RESULTS
            .max(2 * self.cur)
            .saturating_mul(self.nodes);
        if self.results < needed || span < MIN_EPOCH {
            return;
        }
        // Full at least once every two windows' worth of results: bursts up
        // to a window long still count, a user who never fills it does not.
        let limited = 2 * self.cur as u64 * self.limited as u64 >= self.results as u64;
        // Results after the first, over the time since it.
        let rate = (self.results - 1) as f64 / span.as_secs_f64();
        tracing::trace!(
            window = self.cur,
            results = self.results,
            span_us = span.as_micros() as u64,
            rate = rate as u64,
            limited,
            "credit window epoch"
        );
        self.start = None;
        self.results = 0;
        self.limited = 0;
        if limited {
            if let Phase::Startup { .. } = self.phase {
                self.start_up(rate, cap);
            } else {
                self.judge(score(rate, self.cur), cap);
            }
        }
    }

    /// One start-up epoch at `cur` delivered `rate`: double again while
    /// the rate keeps up, else settle on the best-scoring window seen.
    fn start_up(&mut self, rate: f64, cap: u32) {
        let Phase::Startup {
            mut seen,
            mut n,
            best,
        } = self.phase
        else {
            return;
        };
        let lr = rate.max(f64::MIN_POSITIVE).ln();
        if n < STARTUP_STEPS {
            seen[n] = (self.cur, score(rate, self.cur));
            n += 1;
        }
        let next = self.cur.saturating_mul(2).min(cap);
        let grew = lr >= best + STARTUP_GROWTH.ln();
        if grew && next > self.cur && n < STARTUP_STEPS {
            self.set(next, Phase::Startup { seen, n, best: lr });
            return;
        }
        if grew && next == self.cur {
            // Still doubling its rate when the byte budget stopped it (or
            // starting at the budget: messages of megabytes): the cap, not
            // the knee, ended the start-up, and the window below was just
            // measured delivering less than 1 / STARTUP_GROWTH of this one,
            // or never measured. Trials downward would likely lose
            // throughput (with messages this large a trial's epochs take a
            // good part of a second each), and upward is the cap: wait the
            // longest before one.
            self.gap = MAX_PROBE_GAP;
            self.next_up = false;
            self.set(self.cur, Phase::Cruise);
            self.last = Some(score(rate, self.cur));
            return;
        }
        let (w, s) = seen[..n]
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("one epoch at least");
        // Trials go on from there, at once and downward first: the
        // doubling that ended it was up already.
        self.gap = 0;
        self.next_up = false;
        self.set(w, Phase::Cruise);
        if w == self.cur {
            self.last = Some(s);
        }
    }

    /// One epoch at `cur` scored `s`.
    fn judge(&mut self, s: f64, cap: u32) {
        let floor = MIN_WINDOW.min(cap);
        match self.phase {
            // Start-up epochs go to `start_up`.
            Phase::Startup { .. } => {}
            Phase::Trial {
                from,
                to,
                up,
                at_to: true,
                before,
                pairs,
                ..
            } => {
                let phase = Phase::Trial {
                    from,
                    to,
                    up,
                    at_to: false,
                    before,
                    tried: s,
                    pairs,
                };
                self.set(from, phase);
            }
            Phase::Trial {
                from,
                to,
                up,
                at_to: false,
                before,
                tried,
                mut pairs,
            } => {
                if (s - before).abs() > SAME_CONDITIONS.max(2.0 * self.spread) {
                    // The machine changed under this pair: it says nothing.
                    pairs.dropped += 1;
                } else {
                    pairs.add(tried - (before + s) / 2.0);
                }
                let Some(better) = pairs.verdict(up) else {
                    if pairs.dropped > MAX_DROPPED_PAIRS {
                        // Conditions keep changing: try again later.
                        self.phase = Phase::Cruise;
                        self.quiet = 0;
                        self.last = Some(s);
                        return;
                    }
                    let phase = Phase::Trial {
                        from,
                        to,
                        up,
                        at_to: true,
                        before: s,
                        tried,
                        pairs,
                    };
                    self.set(to, phase);
                    return;
                };
                self.phase = Phase::Cruise;
                self.quiet = 0;
                self.last = Some(s);
                let step = to.abs_diff(self.cur);
                if better {
                    // Go on the same way at once: twice as far up, so a
                    // window far below its knee gets there in a few
                    // trials; down by the same step.
                    self.gap = 0;
                    self.next_up = up;
                    self.stride = if up { step.saturating_mul(2) } else { step };
                    self.set(to, Phase::Cruise);
                } else {
                    self.gap = (self.gap * 2).clamp(1, MAX_PROBE_GAP);
                    self.next_up = !up;
                    self.stride = 0;
                }
            }
            Phase::Cruise => {
                if let Some(last) = self.last {
                    self.spread += ((s - last).abs() - self.spread) / 8.0;
                }
                self.last = Some(s);
                self.quiet += 1;
                if self.quiet > self.gap {
                    self.quiet = 0;
                    let up = self.next_up;
                    // Half the window up, an eighth down: a step up must
                    // be long enough for its gain to stand out of the
                    // spread (short ones left the window below its knee);
                    // a step down short enough to stay near it.
                    let step = match self.stride {
                        0 if up => (self.cur / 2).max(1),
                        0 => (self.cur / 8).max(1),
                        n => n,
                    };
                    if !self.probe(up, step, s, floor, cap)
                        && !self.probe(!up, (self.cur / 8).max(1), s, floor, cap)
                    {
                        // Pinned between floor and cap: nothing to try.
                        self.gap = MAX_PROBE_GAP;
                    }
                }
            }
        }
    }

    /// Starts a probe `step` away; false if the window cannot move that way.
    fn probe(&mut self, up: bool, step: u32, before: f64, floor: u32, cap: u32) -> bool {
        let to = if up {
            self.cur.saturating_add(step).min(cap)
        } else {
            self.cur.saturating_sub(step).max(floor)
        };
        if to == self.cur {
            return false;
        }
        let phase = Phase::Trial {
            from: self.cur,
            to,
            up,
            at_to: true,
            before,
            tried: 0.0,
            pairs: Pairs::default(),
        };
        self.set(to, phase);
        true
    }

    fn set(&mut self, to: u32, phase: Phase) {
        // The messages in flight still follow the old window for a while.
        self.skip = self.cur.max(to).saturating_mul(self.nodes);
        if to != self.cur {
            // Consecutive epochs of one window only.
            self.last = None;
        }
        self.cur = to;
        self.phase = phase;
        if phase == Phase::Cruise {
            self.quiet = 0;
        }
        self.start = None;
        self.results = 0;
        self.limited = 0;
    }
}

/// A trial's differences so far: each is the score of an epoch at the
/// tried window less the mean of the current window's epochs on either
/// side of it, so that a machine drifting slower or faster over the trial
/// cancels out.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Pairs {
    n: u32,
    sum: f64,
    sum_sq: f64,
    /// Pairs whose bracketing epochs disagreed, left out.
    dropped: u32,
}

impl Pairs {
    fn add(&mut self, d: f64) {
        self.n += 1;
        self.sum += d;
        self.sum_sq += d * d;
    }

    /// Whether the tried window is better: once the mean difference
    /// stands [`CONFIDENCE`] standard errors clear of the bar, or after
    /// [`MAX_PAIRS`] on the mean alone. Upward the bar is a margin (every
    /// wrong step up costs latency); downward a tie is enough, for the
    /// latency. `None`: measure another pair.
    fn verdict(&self, up: bool) -> Option<bool> {
        if self.n < MIN_PAIRS {
            return None;
        }
        let n = self.n as f64;
        let mean = self.sum / n;
        let var = ((self.sum_sq - n * mean * mean) / (n - 1.0)).max(0.0);
        let se = (var / n).sqrt();
        let bar = if up { UP_MARGIN } else { 0.0 };
        if mean - CONFIDENCE * se > bar {
            Some(true)
        } else if mean + CONFIDENCE * se < bar {
            Some(false)
        } else if self.n >= MAX_PAIRS {
            Some(if up { mean > bar } else { mean >= bar })
        } else {
            None
        }
    }
}

fn score(rate: f64, w: u32) -> f64 {
    (1.0 + LATENCY_WEIGHT) * rate.max(f64::MIN_POSITIVE).ln() - LATENCY_WEIGHT * (w as f64).ln()
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
