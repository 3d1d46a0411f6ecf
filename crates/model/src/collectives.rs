//! Latency of a group's collectives, calibrated on the machine that runs them.
//!
//! Seed 003 §5.4.2 gives broadcast latency in stages of P — (2 + n − 1)·P
//! for the linear and star trees, (2 + log2 n)·P for the binomial tree — and
//! adds (n − 1)·O or log2(n)·O of combining for a reduce; seed 001 §IV gives
//! the time of one hop as latency plus packet size over bandwidth
//! (T_l + T_r + p/B_l). corefarm cuts blocks into chunks that every tree
//! forwards as they arrive, so with c chunks of s bytes the critical path is
//!
//! | tree | chunk stages S |
//! |---|---|
//! | linear (pipelined chain) | c + n − 2 |
//! | binomial | ⌈log2 n⌉·c |
//! | star | (n − 1)·c |
//!
//! (for c = 1 these are the seed's n − 1 and log2 n; its "+2", getting the
//! data in and out, is the fixed cost t0 of a command here). One stage costs
//! P(s) = hop + s·byte (seed 001's per-hop model), fitted per tree since a
//! chain stage (receive and forward) and a root's extra send differ in cost
//! on real machines; a reduce adds
//! O(s) = combine + s·combine_byte per stage. Two terms go beyond the seeds
//! because a test machine runs every member on a few shared CPUs, where the
//! total work of all members, not only the critical path, takes time: `msg`
//! per chunk message sent by anyone and `work_byte` per byte moved or
//! combined by anyone. `scatter`/`gather` from the user pass through the
//! server once per rank (`relay`, `relay_byte`). Two more were added when
//! the model was checked against a second run (docs/collectives.md, "The
//! model"): `member`, per member of a command (the server sends it to each
//! member and waits for each reply: small calls over 16 members took
//! 3–5× those over 2), and `allgather_byte`, per byte an allgather moves
//! beyond `work_byte` (its blocks are n times a rank's buffer, and it moved
//! 2–3.5 GB/s where the other operations moved 4–6). Together they took
//! the points within 20 % of a separate run from 188–191 of 292 to
//! 219–237 (three pairs of runs).
//!
//! Every term is linear in its parameter, so [`fit`] is a weighted least
//! squares ([`crate::lsq::nnls`]) with weights 1/t (relative error).

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// The tree a collective runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    Linear,
    Binomial,
    Star,
}

impl Algo {
    pub const ALL: [Algo; 3] = [Algo::Linear, Algo::Binomial, Algo::Star];

    pub fn name(self) -> &'static str {
        match self {
            Algo::Linear => "linear",
            Algo::Binomial => "binomial",
            Algo::Star => "star",
        }
    }
}

impl std::str::FromStr for Algo {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        Algo::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| ModelError::UnknownAlgo(s.to_string()))
    }
}

/// A group operation. `Scatter` and `Gather` are the user's, through the
/// server (one command per rank); the others run among the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Bcast,
    Reduce,
    Allreduce,
    Allgather,
    Barrier,
    Scatter,
    Gather,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Bcast,
        Op::Reduce,
        Op::Allreduce,
        Op::Allgather,
        Op::Barrier,
        Op::Scatter,
        Op::Gather,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Bcast => "bcast",
            Op::Reduce => "reduce",
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
            Op::Barrier => "barrier",
            Op::Scatter => "scatter",
            Op::Gather => "gather",
        }
    }

    /// Whether the tree matters (the user's scatter/gather have none).
    pub fn has_tree(self) -> bool {
        !matches!(self, Op::Scatter | Op::Gather)
    }
}

impl std::str::FromStr for Op {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        Op::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| ModelError::UnknownOp(s.to_string()))
    }
}

/// One call: `bytes` is each rank's buffer (as in MPI's per-rank counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub op: Op,
    pub algo: Algo,
    pub n: u32,
    pub bytes: u64,
}

/// One value per tree.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PerTree {
    pub linear: f64,
    pub binomial: f64,
    pub star: f64,
}

impl PerTree {
    pub fn same(v: f64) -> PerTree {
        PerTree {
            linear: v,
            binomial: v,
            star: v,
        }
    }

    pub fn get(&self, a: Algo) -> f64 {
        match a {
            Algo::Linear => self.linear,
            Algo::Binomial => self.binomial,
            Algo::Star => self.star,
        }
    }
}

/// The fitted parameters, in seconds (and seconds per byte).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Params {
    /// Fixed cost of one group command: user → server → members and back.
    pub t0: f64,
    /// Per chunk stage on the critical path (seed 001: T_l + T_r, plus
    /// software), per tree: a chain stage is receive-and-forward, a star
    /// stage one more send of the root.
    pub hop: PerTree,
    /// Per byte per stage (seed 001: 1/B_l), per tree.
    pub byte: PerTree,
    /// Per combining stage of a reduce (seed 003's O, fixed part).
    pub combine: f64,
    /// Per byte combined per stage (O's size-dependent part).
    pub combine_byte: f64,
    /// Per chunk message sent by any member (shared CPUs).
    pub msg: f64,
    /// Per byte moved or combined by any member (shared CPUs).
    pub work_byte: f64,
    /// Per command relayed by the server (the user's scatter/gather).
    pub relay: f64,
    /// Per byte relayed by the server.
    pub relay_byte: f64,
    /// Per member of a group command (the server's fan-out and the replies).
    pub member: f64,
    /// Per byte an allgather moves, beyond `work_byte`.
    pub allgather_byte: f64,
}

const K: usize = 15;
/// Index of the first per-tree hop and byte parameters.
const HOP: usize = 9;
const BYTE: usize = 11;
const MEMBER: usize = 13;
const ALLGATHER_BYTE: usize = 14;

fn tree_index(a: Algo) -> usize {
    match a {
        Algo::Linear => 0,
        Algo::Binomial => 1,
        Algo::Star => 2,
    }
}

impl Params {
    fn to_vec(self) -> [f64; K] {
        [
            self.t0,
            self.hop.linear,
            self.byte.linear,
            self.combine,
            self.combine_byte,
            self.msg,
            self.work_byte,
            self.relay,
            self.relay_byte,
            self.hop.binomial,
            self.hop.star,
            self.byte.binomial,
            self.byte.star,
            self.member,
            self.allgather_byte,
        ]
    }

    fn from_vec(v: &[f64]) -> Params {
        Params {
            t0: v[0],
            hop: PerTree {
                linear: v[1],
                binomial: v[HOP],
                star: v[HOP + 1],
            },
            byte: PerTree {
                linear: v[2],
                binomial: v[BYTE],
                star: v[BYTE + 1],
            },
            combine: v[3],
            combine_byte: v[4],
            msg: v[5],
            work_byte: v[6],
            relay: v[7],
            relay_byte: v[8],
            member: v[MEMBER],
            allgather_byte: v[ALLGATHER_BYTE],
        }
    }

    /// Seed 003's P for one stage of `algo` moving `s` bytes.
    pub fn p(&self, algo: Algo, s: f64) -> f64 {
        self.hop.get(algo) + s * self.byte.get(algo)
    }

    /// Seed 003's O for combining `s` bytes.
    pub fn o(&self, s: f64) -> f64 {
        self.combine + s * self.combine_byte
    }
}

fn log2_ceil(n: u32) -> f64 {
    f64::from(n.max(1).next_power_of_two().trailing_zeros())
}

/// Chunk stages on the critical path of a broadcast (or reduce) of `c` chunks.
pub fn stages(algo: Algo, n: u32, c: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    match algo {
        Algo::Linear => c + f64::from(n) - 2.0,
        Algo::Binomial => log2_ceil(n) * c,
        Algo::Star => f64::from(n - 1) * c,
    }
}

/// Σ over ranks of the tree depth: how many links a gathered block crosses.
fn depth_sum(algo: Algo, n: u32) -> f64 {
    (1..n)
        .map(|r| match algo {
            Algo::Linear => f64::from(r),
            Algo::Binomial => f64::from(r.count_ones()),
            Algo::Star => 1.0,
        })
        .sum()
}

fn depth(algo: Algo, n: u32) -> f64 {
    match algo {
        Algo::Linear => f64::from(n.saturating_sub(1)),
        Algo::Binomial => log2_ceil(n),
        Algo::Star => f64::from(u32::from(n > 1)),
    }
}

/// Feature vector of a call: the coefficient of each parameter.
pub fn features(shape: Shape, chunk: u64) -> [f64; K] {
    let Shape { op, algo, n, bytes } = shape;
    let chunk = chunk.max(1);
    let mut x = [0.0; K];
    let nf = f64::from(n);
    let others = f64::from(n.saturating_sub(1));
    // Feature slots of this tree's hop and byte parameters.
    let (hop, byte) = match tree_index(algo) {
        0 => (1, 2),
        i => (HOP + i - 1, BYTE + i - 1),
    };
    // (stages, stage bytes, chunk messages, bytes moved) of a broadcast of `m` bytes.
    let bcast = |m: u64, x: &mut [f64; K]| {
        let c = m.div_ceil(chunk).max(1) as f64;
        let s = m as f64 / c;
        let st = stages(algo, n, c);
        x[hop] += st;
        x[byte] += st * s;
        x[5] += others * c;
        x[6] += others * m as f64;
    };
    let reduce = |m: u64, x: &mut [f64; K]| {
        bcast(m, x);
        let c = m.div_ceil(chunk).max(1) as f64;
        let st = stages(algo, n, c);
        x[3] += st;
        x[4] += st * m as f64 / c;
        x[6] += others * m as f64;
    };
    match op {
        Op::Bcast => bcast(bytes, &mut x),
        Op::Reduce => reduce(bytes, &mut x),
        Op::Allreduce => {
            reduce(bytes, &mut x);
            bcast(bytes, &mut x);
        }
        Op::Barrier => {
            reduce(0, &mut x);
            bcast(0, &mut x);
        }
        Op::Allgather => {
            // Gather to rank 0: the root takes in every other block chunk by
            // chunk, after the depth of the tree; then a broadcast of n blocks.
            let c = bytes.div_ceil(chunk).max(1) as f64;
            let st = others * c + (depth(algo, n) - 1.0).max(0.0);
            x[hop] += st;
            x[byte] += st * bytes as f64 / c;
            x[5] += depth_sum(algo, n) * c;
            x[6] += depth_sum(algo, n) * bytes as f64;
            x[ALLGATHER_BYTE] = (depth_sum(algo, n) + others * nf) * bytes as f64;
            bcast(bytes.saturating_mul(u64::from(n)), &mut x);
        }
        Op::Scatter | Op::Gather => {
            x[7] = nf;
            x[8] = nf * bytes as f64;
            return x;
        }
    }
    x[0] = 1.0;
    x[MEMBER] = nf;
    x
}

/// Predicted seconds of a call.
pub fn predict(p: &Params, shape: Shape, chunk: u64) -> f64 {
    features(shape, chunk)
        .iter()
        .zip(p.to_vec())
        .map(|(x, b)| x * b)
        .sum()
}

/// One measurement: the median of repeated calls.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    #[serde(flatten)]
    pub shape: Shape,
    pub seconds: f64,
}

/// Parameters minimising the relative error over `samples`; `None` without
/// usable samples or when they cannot separate the parameters they touch.
pub fn fit(samples: &[Sample], chunk: u64) -> Option<Params> {
    let ok: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.seconds.is_finite() && s.seconds > 0.0)
        .collect();
    let rows: Vec<Vec<f64>> = ok
        .iter()
        .map(|s| features(s.shape, chunk).to_vec())
        .collect();
    let y: Vec<f64> = ok.iter().map(|s| s.seconds).collect();
    let w: Vec<f64> = y.iter().map(|t| 1.0 / t).collect();
    crate::lsq::nnls(&rows, &y, &w).map(|v| Params::from_vec(&v))
}

/// Relative error (predicted − measured) / measured of each sample.
pub fn errors(p: &Params, samples: &[Sample], chunk: u64) -> Vec<f64> {
    samples
        .iter()
        .map(|s| (predict(p, s.shape, chunk) - s.seconds) / s.seconds)
        .collect()
}

/// Identifies the file format; bumped when the parameters change meaning.
pub const FORMAT: &str = "corefarm-collectives-model/2";

/// A calibration as `corefarm model calibrate` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: String,
    /// Bytes per chunk the nodes pipelined with.
    pub chunk: u64,
    pub params: Params,
    /// Root-mean-square and largest relative error over `samples`.
    pub rms_error: f64,
    pub max_error: f64,
    /// Unix time of the calibration.
    pub created: u64,
    /// Where it was measured (e.g. "embedded cluster, 2 CPUs").
    pub on: String,
    pub samples: Vec<Sample>,
}

impl Calibration {
    /// Fits `samples` and records the fit's errors.
    pub fn from_samples(samples: Vec<Sample>, chunk: u64, on: String) -> Option<Calibration> {
        let params = fit(&samples, chunk)?;
        let e = errors(&params, &samples, chunk);
        let rms = (e.iter().map(|x| x * x).sum::<f64>() / e.len() as f64).sqrt();
        let max = e.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(Calibration {
            format: FORMAT.into(),
            chunk,
            params,
            rms_error: rms,
            max_error: max,
            created,
            on,
            samples,
        })
    }

    pub fn predict(&self, shape: Shape) -> f64 {
        predict(&self.params, shape, self.chunk)
    }

    /// The tree with the lowest predicted latency for `op` over `n` members
    /// with `bytes` per rank (ties: the earlier of binomial, linear, star).
    pub fn best(&self, op: Op, n: u32, bytes: u64) -> Algo {
        [Algo::Binomial, Algo::Linear, Algo::Star]
            .into_iter()
            .map(|algo| (algo, self.predict(Shape { op, algo, n, bytes })))
            .fold(None, |b: Option<(Algo, f64)>, (a, t)| match b {
                Some((_, bt)) if bt <= t => b,
                _ => Some((a, t)),
            })
            .map_or(Algo::Binomial, |(a, _)| a)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a calibration serialises")
    }

    /// Parses and checks a calibration (a file anyone could have edited).
    pub fn from_json(s: &str) -> Result<Calibration, ModelError> {
        let c: Calibration = serde_json::from_str(s)?;
        if c.format != FORMAT {
            return Err(ModelError::Format {
                found: c.format,
                expected: FORMAT,
            });
        }
        if c.chunk == 0 || c.chunk > 1 << 30 {
            return Err(ModelError::Chunk(c.chunk));
        }
        if let Some(v) = c
            .params
            .to_vec()
            .iter()
            .find(|v| !v.is_finite() || **v < 0.0)
        {
            return Err(ModelError::Parameter(*v));
        }
        Ok(c)
    }

    pub fn load(path: &std::path::Path) -> Result<Calibration, ModelError> {
        let s = std::fs::read_to_string(path).map_err(|error| ModelError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Calibration::from_json(&s).map_err(|e| ModelError::Invalid {
            path: path.to_path_buf(),
            error: Box::new(e),
        })
    }

    /// The default file, if it exists and is valid.
    pub fn load_default() -> Option<Calibration> {
        Calibration::load(&default_path()?).ok()
    }
}

/// `$XDG_CACHE_HOME/corefarm/collectives-model.json`, else under `~/.cache`.
pub fn default_path() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("corefarm").join("collectives-model.json"))
}

#[cfg(test)]
#[path = "collectives_tests.rs"]
mod tests;
