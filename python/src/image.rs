//! Configuration images from Python: the same checks as
//! `corefarm image inspect`. Building runs `corefarm image build` as a
//! command (python/corefarm/__init__.py), so this extension links the image
//! reader only, not the compiler driver.

use bytes::Bytes;
use corefarm_cores::image::Image;
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
