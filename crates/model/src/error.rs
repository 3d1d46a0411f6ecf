//! Why a model's input cannot be used: parameters out of range, a name that
//! is no operation or tree, a calibration file that is unreadable or invalid.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A partition's throughput that is not finite and positive.
    #[error("{name} = {value} items/s: a throughput must be finite and > 0")]
    Throughput { name: &'static str, value: f64 },
    /// A partition's time that is not finite and non-negative.
    #[error("{name} = {value} s: a time must be finite and >= 0")]
    Time { name: &'static str, value: f64 },
    #[error("unknown algorithm {0:?} (linear, binomial, star)")]
    UnknownAlgo(String),
    #[error(
        "unknown operation {0:?} (bcast, reduce, allreduce, allgather, barrier, scatter, gather)"
    )]
    UnknownOp(String),
    /// A calibration that is not JSON of the calibration's shape.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A calibration written by another version of the model.
    #[error("format {found:?}, expected {expected:?}")]
    Format {
        found: String,
        expected: &'static str,
    },
    /// A calibration's chunk size of 0 or above 1 GiB.
    #[error("chunk of {0} bytes")]
    Chunk(u64),
    /// A calibration's parameter that is negative or not finite.
    #[error("parameter {0} is not a finite non-negative number")]
    Parameter(f64),
    /// A calibration file that could not be read. (The causes below are
    /// part of the message, not chained sources, so the text reads the
    /// same whether it is printed alone or with its chain.)
    #[error("{}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A calibration file read but refused (`error` says why).
    #[error("{}: {error}", path.display())]
    Invalid {
        path: PathBuf,
        error: Box<ModelError>,
    },
}
