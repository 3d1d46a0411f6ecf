//! Configuration images from Python: the same builder and checks as
//! `corefarm image build` / `corefarm image inspect`.

use std::path::PathBuf;

use bytes::Bytes;
use corefarm_cores::image::Image;
use corefarm_cores::{build_image as build, BuildSpec};
use corefarm_smp::CoreInfo;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

fn image_error(msg: String) -> PyErr {
    Python::attach(|py| {
        py.import("corefarm.errors")
            .and_then(|m| m.getattr("ImageError"))
            .and_then(|c| c.call1((msg.clone(),)))
            .map(PyErr::from_value)
            .unwrap_or_else(|_| PyValueError::new_err(msg))
    })
}

/// Builds an image; compiles the HLS source (g++) and/or the Verilog
/// (Verilator) for this machine. Releases the GIL while compiling.
#[pyfunction]
#[pyo3(signature = (*, input_size, output_size, cores=1, name=None, hls=None, entry=None,
                    verilog=None, top=None, rbf=None, core_table=None))]
#[allow(clippy::too_many_arguments)]
pub fn build_image<'py>(
    py: Python<'py>,
    input_size: u32,
    output_size: u32,
    cores: u32,
    name: Option<String>,
    hls: Option<PathBuf>,
    entry: Option<String>,
    verilog: Option<Vec<PathBuf>>,
    top: Option<String>,
    rbf: Option<PathBuf>,
    core_table: Option<Vec<(u32, u32, u32)>>,
) -> PyResult<Bound<'py, PyBytes>> {
    if hls.is_some() != entry.is_some() {
        return Err(PyValueError::new_err("hls= and entry= go together"));
    }
    if verilog.is_some() != top.is_some() {
        return Err(PyValueError::new_err("verilog= and top= go together"));
    }
    if hls.is_none() && verilog.is_none() && rbf.is_none() {
        return Err(PyValueError::new_err(
            "nothing to build: give hls=, verilog= or rbf=",
        ));
    }
    let name = name
        .or_else(|| entry.clone())
        .or_else(|| top.clone())
        .unwrap_or_else(|| "image".into());
    let spec = BuildSpec {
        name,
        input_size,
        output_size,
        cores,
        core_table: core_table.map(|t| {
            t.into_iter()
                .map(|(control, input, output)| CoreInfo {
                    control,
                    input,
                    output,
                })
                .collect()
        }),
        hls: hls.zip(entry),
        verilog: verilog.zip(top),
        rbf,
    };
    let bytes = py
        .detach(|| build(&spec))
        .map_err(|e| image_error(e.to_string()))?;
    Ok(PyBytes::new(py, &bytes))
}

/// The manifest of an image as JSON text plus, per artifact, whether its
/// checksum holds (`None` if it holds, else the reason).
#[pyfunction]
pub fn inspect_image(image: &[u8]) -> PyResult<(String, Vec<Option<String>>)> {
    let img =
        Image::parse(Bytes::copy_from_slice(image)).map_err(|e| image_error(e.to_string()))?;
    let manifest = serde_json::to_string(&img.manifest).map_err(|e| image_error(e.to_string()))?;
    let checks = img
        .verify()
        .into_iter()
        .map(|r| r.err().map(|e| e.to_string()))
        .collect();
    Ok((manifest, checks))
}
