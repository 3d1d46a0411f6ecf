//! Configuration images from Python: the same checks as
//! `corefarm image inspect`. Building runs `corefarm image build` as a
//! command (python/corefarm/__init__.py), so this extension links the image
//! reader only, not the compiler driver.

use bytes::Bytes;
use corefarm_cores::dtype::DataType;
use corefarm_cores::image::Image;
use corefarm_cores::spin::HandlerSet;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn image_error(msg: String) -> PyErr {
    Python::attach(|py| {
        py.import("corefarm.errors")
            .and_then(|m| m.getattr("ImageError"))
            .and_then(|c| c.call1((msg.clone(),)))
            .map(PyErr::from_value)
            .unwrap_or_else(|_| PyValueError::new_err(msg))
    })
}

/// The manifest of an image as JSON text plus, per artifact, whether its
/// checksum holds (`None` if it holds, else the reason), and the signature
/// as JSON text (`key`, `valid`, `error`) if the image is signed.
#[pyfunction]
pub fn inspect_image(image: &[u8]) -> PyResult<(String, Vec<Option<String>>, Option<String>)> {
    let img =
        Image::parse(Bytes::copy_from_slice(image)).map_err(|e| image_error(e.to_string()))?;
    let manifest = serde_json::to_string(&img.manifest).map_err(|e| image_error(e.to_string()))?;
    let checks = img
        .verify()
        .into_iter()
        .map(|r| r.err().map(|e| e.to_string()))
        .collect();
    let signature = img.signature.as_ref().map(|rec| {
        let r = corefarm_cores::signature::verify(&img, rec);
        serde_json::json!({"key": rec.key.to_string(), "valid": r.is_ok(), "error": r.err().map(|e| e.to_string())})
            .to_string()
    });
    Ok((manifest, checks, signature))
}

/// A type spec (`int64[1]`, `float32[64,64]`) as (element type, shape),
/// read by the parser of `corefarm image build --output-type`; a bad one
/// is a ValueError saying the form and the element types.
#[pyfunction]
pub fn parse_type(spec: &str) -> PyResult<(String, Vec<u32>)> {
    let t: DataType = spec
        .parse()
        .map_err(|e: corefarm_cores::dtype::DataTypeError| PyValueError::new_err(e.to_string()))?;
    Ok((t.dtype.name().to_string(), t.shape))
}

/// The result types an image's handler sets declare (docs/streams.md,
/// `result_type`), and which set a message goes to: the node's own
/// matching of the same rulesets.
#[pyclass(frozen, module = "corefarm._corefarm")]
pub struct ResultTypes {
    inner: corefarm_cores::spin::ResultTypes,
}

#[pymethods]
impl ResultTypes {
    /// Per handler set, in manifest order: its declared result type as
    /// (element type, shape), or None.
    fn declared(&self) -> Vec<Option<(String, Vec<u32>)>> {
        self.inner
            .declared()
            .map(|t| t.map(|t| (t.dtype.name().to_string(), t.shape.clone())))
            .collect()
    }

    /// The index of the handler set that takes message `data` (any
    /// contiguous buffer), or None when no ruleset matches it. Reads only
    /// the words the rules look at.
    fn select(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let buf = crate::byte_buffer(data)?;
        let cells = buf
            .as_slice(py)
            .ok_or_else(|| PyValueError::new_err("data must be a C-contiguous buffer"))?;
        let head: Vec<u8> = cells
            .iter()
            .take(self.inner.head_len())
            .map(|c| c.get())
            .collect();
        Ok(self.inner.select(&head).map(|(i, _)| i))
    }
}

/// The result types of an image's `handler_sets` (the manifest's list as
/// JSON text), or None when no set declares one. Sets that break the
/// manifest's rules raise ImageError naming the set.
#[pyfunction]
pub fn result_types(handler_sets: &str) -> PyResult<Option<ResultTypes>> {
    let sets: Vec<HandlerSet> = serde_json::from_str(handler_sets)
        .map_err(|e| image_error(format!("handler_sets: {e}")))?;
    Ok(corefarm_cores::spin::ResultTypes::of(&sets)
        .map_err(|e| image_error(e.to_string()))?
        .map(|inner| ResultTypes { inner }))
}
