//! `corefarm._corefarm.Cowork`: the client's CPU/cluster co-working
//! (corefarm_client::Cowork) for python/corefarm/cowork.py. The inputs are
//! copied into owned buffers with the GIL held, then the whole run happens
//! with the GIL released.

use bytes::Bytes;
use corefarm_client::{Cowork as RustCowork, CoworkError, CoworkOptions, CoworkReport, Estimates};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::{byte_buffer, to_py, Client};

/// Raises `corefarm.errors.<class>(msg)`.
fn raise(class: &str, msg: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("corefarm.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((msg,)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

fn cowork_err(e: CoworkError) -> PyErr {
    match e {
        CoworkError::Client(e) => to_py(e),
        e @ CoworkError::Load(_) => raise("ConfigurationError", e.to_string()),
        e @ CoworkError::Input { .. } => raise("InputError", e.to_string()),
        e @ CoworkError::Local { .. } => raise("Error", e.to_string()),
    }
}

fn estimates<'py>(py: Python<'py>, e: &Estimates) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x_c", e.x_c)?;
    d.set_item("x_a", e.x_a)?;
    d.set_item("x_a_beside", e.x_a_beside)?;
    d.set_item("d_a", e.d_a)?;
    d.set_item("o_c", e.o_c)?;
    d.set_item("o_0", e.o_0)?;
    Ok(d)
}

fn report<'py>(py: Python<'py>, r: &CoworkReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("local_items", r.local_items)?;
    d.set_item("cluster_items", r.cluster_items)?;
    d.set_item("backups", r.backups)?;
    d.set_item("cluster_error", r.cluster_error.clone())?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("break_even", r.break_even())?;
    d.set_item("estimates", estimates(py, &r.estimates)?)?;
    d.set_item("measured", estimates(py, &r.measured)?)?;
    Ok(d)
}

/// One function loaded on this machine for co-working with a cluster.
#[pyclass(frozen, module = "corefarm._corefarm")]
pub struct Cowork {
    inner: RustCowork,
}

fn options(
    threads: usize,
    local_batch_max: usize,
    jobs: usize,
    configure: bool,
    backup: bool,
) -> CoworkOptions {
    CoworkOptions {
        threads,
        local_batch_max,
        jobs,
        configure,
        backup,
        ..CoworkOptions::default()
    }
}

#[pymethods]
impl Cowork {
    /// Cowork(input_size, output_size, cores, image, *, threads=0,
    /// local_batch_max=16, jobs=6, configure=False, backup=True): `cores` is
    /// a list of (control, input, output) base addresses, as for
    /// `Client.configure`. `configure=True`: `map` sends this configuration
    /// when the client holds another one and computes locally until the
    /// server answers. `backup=False`: no backup copies to the cluster of
    /// the messages local threads are still on.
    #[new]
    #[pyo3(signature = (input_size, output_size, cores, image, *, threads=0, local_batch_max=16, jobs=6, configure=false, backup=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        input_size: u32,
        output_size: u32,
        cores: Vec<(u32, u32, u32)>,
        image: &Bound<'_, PyAny>,
        threads: usize,
        local_batch_max: usize,
        jobs: usize,
        configure: bool,
        backup: bool,
    ) -> PyResult<Self> {
        let cfg = crate::configuration(
            input_size,
            output_size,
            cores,
            Bytes::from(byte_buffer(image)?.to_vec(py)?),
        );
        let opts = options(threads, local_batch_max, jobs, configure, backup);
        let inner = crate::detach(py, || RustCowork::load(&cfg, opts)).map_err(cowork_err)?;
        Ok(Cowork { inner })
    }

    /// Loads the configuration `client` was last configured with.
    #[staticmethod]
    #[pyo3(signature = (client, *, threads=0, local_batch_max=16, jobs=6, configure=false, backup=true))]
    #[allow(clippy::too_many_arguments)]
    fn for_client(
        py: Python<'_>,
        client: &Client,
        threads: usize,
        local_batch_max: usize,
        jobs: usize,
        configure: bool,
        backup: bool,
    ) -> PyResult<Self> {
        let opts = options(threads, local_batch_max, jobs, configure, backup);
        let inner = crate::detach(py, || RustCowork::for_client(&client.inner, opts))
            .map_err(cowork_err)?;
        Ok(Cowork { inner })
    }

    /// Whether `client` is configured with this function right now.
    fn matches(&self, client: &Client) -> bool {
        client
            .inner
            .configuration()
            .is_some_and(|c| c == *self.inner.configuration())
    }

    /// map(client, inputs, window) -> (list of bytes, report dict).
    /// `inputs`: a list of C-contiguous byte buffers (copied here).
    fn map<'py>(
        &self,
        py: Python<'py>,
        client: &Client,
        inputs: Vec<Bound<'py, PyAny>>,
        window: usize,
    ) -> PyResult<(Vec<Bound<'py, PyBytes>>, Bound<'py, PyDict>)> {
        let owned: Vec<Bytes> = inputs
            .iter()
            .map(|o| match o.cast::<PyBytes>() {
                Ok(b) => Ok(Bytes::copy_from_slice(b.as_bytes())),
                Err(_) => Ok(Bytes::from(byte_buffer(o)?.to_vec(py)?)),
            })
            .collect::<PyResult<_>>()?;
        let run = crate::detach(py, || client.inner.map_cowork(&owned, window, &self.inner))
            .map_err(cowork_err)?;
        let results = run.results.iter().map(|b| PyBytes::new(py, b)).collect();
        Ok((results, report(py, &run.report)?))
    }

    /// Uses `x_a` messages/s as the cluster throughput (None: measure it).
    #[pyo3(signature = (x_a))]
    fn set_cluster_throughput(&self, x_a: Option<f64>) {
        self.inner.set_cluster_throughput(x_a);
    }

    #[getter]
    fn estimates<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        estimates(py, &self.inner.estimates())
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    #[getter]
    fn description(&self) -> String {
        self.inner.description().to_string()
    }
}
