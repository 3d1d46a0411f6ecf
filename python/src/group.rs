//! `RawGroup`: the binding of `corefarm_client::group::Group`. The Pythonic
//! surface (mpi4py names, numpy arrays, element types remembered per
//! buffer) is python/corefarm/group.py. Every call releases the GIL.

use std::sync::Mutex;

use bytes::Bytes;
use corefarm_client::group::{Algorithm, Calibration, Group, GroupError, GroupOptions};
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{BenchmarkConfig, DType, ReduceOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{byte_buffer, configuration, to_py};

fn group_err(e: GroupError) -> PyErr {
    match e {
        GroupError::Client(c) => to_py(c),
        e => Python::attach(|py| {
            let msg = e.to_string();
            let made = (|| -> PyResult<PyErr> {
                let errors = py.import("corefarm.errors")?;
                let exc = match &e {
                    GroupError::Timeout { waiting, .. } => errors
                        .getattr("GroupTimeoutError")?
                        .call1((msg, waiting.first().copied(), None::<String>))?,
                    GroupError::Failed { rank, node, op, .. } => errors
                        .getattr("GroupError")?
                        .call1((msg, *rank, node.clone(), op.clone()))?,
                    GroupError::Closed(_) => errors.getattr("GroupError")?.call1((msg,))?,
                    GroupError::Usage(_) => errors.getattr("UsageError")?.call1((msg,))?,
                    GroupError::DirectOverTls => {
                        errors.getattr("UnsupportedError")?.call1((msg,))?
                    }
                    GroupError::Client(_) => unreachable!("mapped above"),
                };
                Ok(PyErr::from_value(exc))
            })();
            made.unwrap_or_else(|import_failed| import_failed)
        }),
    }
}

/// A collective's class: None is the default (the client checks the range).
fn class(priority: Option<u8>) -> u8 {
    priority.unwrap_or(DEFAULT_CLASS)
}

/// An element type by its name here ("f32") or numpy's ("float32"; the
/// Python layer also takes dtype objects and codes such as "<f4").
fn dtype(s: &str) -> PyResult<DType> {
    const NUMPY: [(&str, &str); 10] = [
        ("int8", "i8"),
        ("int16", "i16"),
        ("int32", "i32"),
        ("int64", "i64"),
        ("uint8", "u8"),
        ("uint16", "u16"),
        ("uint32", "u32"),
        ("uint64", "u64"),
        ("float32", "f32"),
        ("float64", "f64"),
    ];
    let short = NUMPY.iter().find(|(n, _)| *n == s).map_or(s, |(_, t)| t);
    DType::ALL
        .iter()
        .copied()
        .find(|d| d.name() == short)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown element type {s:?} (i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, \
                 or numpy's names such as \"float32\")"
            ))
        })
}

fn reduce_op(s: &str) -> PyResult<ReduceOp> {
    match s {
        "sum" => Ok(ReduceOp::Sum),
        "prod" => Ok(ReduceOp::Prod),
        "min" => Ok(ReduceOp::Min),
        "max" => Ok(ReduceOp::Max),
        _ => Err(PyValueError::new_err(format!(
            "unknown reduction {s:?} (sum, prod, min, max)"
        ))),
    }
}

fn algo(s: &str) -> PyResult<Algorithm> {
    s.parse::<Algorithm>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A group of nodes (see corefarm.Group, which wraps it).
#[pyclass(module = "corefarm._corefarm")]
pub struct RawGroup {
    inner: Mutex<Option<Group>>,
}

impl RawGroup {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Group) -> Result<T, GroupError> + Send,
    ) -> PyResult<T> {
        crate::detach(py, || {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some(g) => f(g),
                None => Err(GroupError::Closed("closed by this client".into())),
            }
        })
        .map_err(group_err)
    }
}

#[pymethods]
impl RawGroup {
    #[staticmethod]
    #[pyo3(signature = (addr, nodes, topology, timeout, connect_timeout, name=None, model=None, no_model=false, secret=None, secret_file=None, tls_ca=None, tls_server_name=None, user=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        addr: String,
        nodes: u32,
        topology: String,
        timeout: f64,
        connect_timeout: f64,
        name: Option<String>,
        model: Option<String>,
        no_model: bool,
        secret: Option<String>,
        secret_file: Option<std::path::PathBuf>,
        tls_ca: Option<std::path::PathBuf>,
        tls_server_name: Option<String>,
        user: Option<String>,
    ) -> PyResult<RawGroup> {
        use corefarm_smp::auth::Secret;
        // As `connect`: an explicit user, else COREFARM_USER.
        let user = match user {
            Some(u) => corefarm_smp::auth::check_user_name(&u).map(|()| Some(u)),
            None => corefarm_smp::auth::user_from_env(),
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        // As `connect`: an explicit secret, else a file, else the environment.
        let secret = match secret {
            Some(s) => Some(Secret::new(&s)),
            None => Secret::from_file_or_env(secret_file.as_deref()).transpose(),
        }
        .transpose()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let secs = crate::duration;
        let mut o = GroupOptions::new(nodes);
        (
            o.topology,
            o.timeout,
            o.connect_timeout,
            o.name,
            o.secret,
            o.user,
        ) = (
            topology,
            secs(timeout)?,
            secs(connect_timeout)?,
            name,
            secret,
            user,
        );
        // As `connect`: the CA and name, or plain TCP.
        o.tls = crate::client_tls(tls_ca, tls_server_name)?;
        if no_model {
            o.model = None;
        } else if let Some(path) = model {
            let c = Calibration::load(std::path::Path::new(&path))
                .map_err(|e| PyValueError::new_err(format!("model: {e}")))?;
            o.model = Some(std::sync::Arc::new(c));
        }
        let g = crate::detach(py, || Group::open(&addr, o)).map_err(group_err)?;
        Ok(RawGroup {
            inner: Mutex::new(Some(g)),
        })
    }

    /// [(rank, name, peer address)] in rank order.
    fn members(&self, py: Python<'_>) -> PyResult<Vec<(u32, String, String)>> {
        self.with(py, |g| {
            Ok(g.members()
                .iter()
                .map(|m| (m.rank, m.name.clone(), m.peer.clone()))
                .collect())
        })
    }

    fn put(
        &self,
        py: Python<'_>,
        rank: u32,
        name: &str,
        dt: &str,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (dt, data) = (dtype(dt)?, Bytes::from(byte_buffer(data)?.to_vec(py)?));
        self.with(py, |g| g.put(rank, name, dt, data))
    }

    fn get<'py>(&self, py: Python<'py>, rank: u32, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.with(py, |g| g.get(rank, name))?;
        Ok(PyBytes::new(py, &b))
    }

    fn free(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.with(py, |g| g.free(name))
    }

    fn scatter_rows(
        &self,
        py: Python<'_>,
        name: &str,
        dt: &str,
        data: &Bound<'_, PyAny>,
        row_bytes: usize,
    ) -> PyResult<Vec<usize>> {
        let (dt, data) = (dtype(dt)?, byte_buffer(data)?.to_vec(py)?);
        self.with(py, |g| g.scatter_rows(name, dt, &data, row_bytes))
    }

    fn gather<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let parts = self.with(py, |g| g.gather(name))?;
        Ok(parts.iter().map(|p| PyBytes::new(py, p)).collect())
    }

    // Collectives take `priority`: their class on the links between the
    // members, 0 (most urgent) to 7; None is the default class 4. A class
    // over 7 is a `UsageError` from the client, before anything is sent.

    #[pyo3(signature = (name, dt, data, al, *, priority=None))]
    fn bcast_from_user(
        &self,
        py: Python<'_>,
        name: &str,
        dt: &str,
        data: &Bound<'_, PyAny>,
        al: &str,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let (dt, al, data) = (
            dtype(dt)?,
            algo(al)?,
            Bytes::from(byte_buffer(data)?.to_vec(py)?),
        );
        let class = class(priority);
        self.with(py, |g| g.bcast_from_user(name, dt, data, al.class(class)))
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (root, src, dst, dt, al, *, priority=None))]
    fn bcast(
        &self,
        py: Python<'_>,
        root: u32,
        src: &str,
        dst: &str,
        dt: &str,
        al: &str,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let (dt, al, class) = (dtype(dt)?, algo(al)?, class(priority));
        self.with(py, |g| g.bcast(root, src, dst, dt, al.class(class)))
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (root, src, dst, dt, op, al, *, priority=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        root: u32,
        src: &str,
        dst: &str,
        dt: &str,
        op: &str,
        al: &str,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let (dt, op, al) = (dtype(dt)?, reduce_op(op)?, algo(al)?);
        let class = class(priority);
        self.with(py, |g| g.reduce(root, src, dst, dt, op, al.class(class)))
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (src, dst, dt, op, al, *, priority=None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        src: &str,
        dst: &str,
        dt: &str,
        op: &str,
        al: &str,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let (dt, op, al) = (dtype(dt)?, reduce_op(op)?, algo(al)?);
        let class = class(priority);
        self.with(py, |g| g.allreduce(src, dst, dt, op, al.class(class)))
    }

    #[pyo3(signature = (src, dst, al, *, priority=None))]
    fn allgather(
        &self,
        py: Python<'_>,
        src: &str,
        dst: &str,
        al: &str,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let (al, class) = (algo(al)?, class(priority));
        self.with(py, |g| g.allgather(src, dst, al.class(class)))
    }

    #[pyo3(signature = (al, *, priority=None))]
    fn barrier(&self, py: Python<'_>, al: &str, priority: Option<u8>) -> PyResult<()> {
        let (al, class) = (algo(al)?, class(priority));
        self.with(py, |g| g.barrier(al.class(class)))
    }

    /// Whether the server relays a collective's class to the nodes.
    fn priorities(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |g| Ok(g.priorities()))
    }

    fn configure(
        &self,
        py: Python<'_>,
        input_size: u32,
        output_size: u32,
        cores: Vec<(u32, u32, u32)>,
        bitstream: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let bits = Bytes::from(byte_buffer(bitstream)?.to_vec(py)?);
        let cfg = configuration(input_size, output_size, cores, bits);
        self.with(py, |g| g.configure(&cfg))
    }

    fn configure_benchmark(
        &self,
        py: Python<'_>,
        input_size: u32,
        output_size: u32,
        delay_us: u32,
    ) -> PyResult<()> {
        let cfg = BenchmarkConfig {
            input_size,
            output_size,
            delay_us,
        }
        .to_configuration();
        self.with(py, |g| g.configure(&cfg))
    }

    #[pyo3(signature = (input, output, operand=None))]
    fn run(
        &self,
        py: Python<'_>,
        input: &str,
        output: &str,
        operand: Option<&str>,
    ) -> PyResult<()> {
        self.with(py, |g| g.run_with(input, operand, output))
    }

    /// Streams `inputs` (data messages) straight to the members' peer ports,
    /// `window` in flight per member; outputs in input order, exactly once.
    /// `priority`: their class, 0 (most urgent) to 7; None is the default 4.
    #[pyo3(signature = (inputs, window, *, priority=None))]
    fn direct_map<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, PyAny>>,
        window: usize,
        priority: Option<u8>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let data = inputs
            .iter()
            .map(|i| Ok(Bytes::from(byte_buffer(i)?.to_vec(py)?)))
            .collect::<PyResult<Vec<Bytes>>>()?;
        let class = priority.unwrap_or(corefarm_smp::stream::DEFAULT_CLASS);
        let out = self.with(py, |g| g.direct(window)?.map_with(&data, class))?;
        Ok(out.iter().map(|o| PyBytes::new(py, o)).collect())
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // The lock is taken without the GIL: another thread's command may
        // hold it for as long as that command runs.
        crate::detach(py, || {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            g.map_or(Ok(()), |g| g.close())
        })
        .map_err(group_err)
    }
}
