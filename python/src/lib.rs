//! `corefarm._corefarm`: the PyO3 binding of corefarm-client. The Pythonic
//! surface (argument handling, context manager, `map`, asyncio) lives in
//! python/corefarm; this module exposes the blocking client, releases the
//! GIL around every blocking call, and turns `ClientError`s into the
//! exception classes of `corefarm.errors`.
//!
//! Submitted data is never read without the GIL from memory that Python
//! code may change meanwhile: `bytes` (immutable) are sent straight from
//! their memory, every other buffer is copied first, with the GIL held.

use corefarm_smp::stream::DEFAULT_CLASS;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_client::{Client as RustClient, ClientError, ClientOptions, Output as RustOutput};
use corefarm_smp::{Configuration, CoreInfo};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

mod cowork;
mod group;
mod image;
mod pending;
mod smp;

use pending::{Completions, Pending};

/// Builds the `corefarm.errors` exception for a client error.
fn to_py(e: ClientError) -> PyErr {
    Python::attach(|py| {
        let msg = e.to_string();
        let made = (|| -> PyResult<PyErr> {
            let errors = py.import("corefarm.errors")?;
            let exc = match &e {
                ClientError::Timeout { .. } => errors.getattr("TimeoutError")?.call1((msg,))?,
                ClientError::Configuration { status, reason } => errors
                    .getattr("ConfigurationError")?
                    .call1((msg, *status, reason.clone()))?,
                ClientError::NotConfigured => errors.getattr("ConfigurationError")?.call1((
                    msg,
                    None::<u8>,
                    None::<String>,
                ))?,
                ClientError::Server(m) => errors.getattr("ServerError")?.call1((
                    msg,
                    m.code,
                    m.reason.clone(),
                    (m.id != corefarm_smp::ErrorMsg::NO_ID).then_some(m.id),
                ))?,
                ClientError::Protocol(_) | ClientError::Unexpected(_) => {
                    errors.getattr("ProtocolError")?.call1((msg,))?
                }
                ClientError::InvalidInput(_) => errors.getattr("InputError")?.call1((msg,))?,
                ClientError::Usage(_) => errors.getattr("UsageError")?.call1((msg,))?,
                ClientError::Unsupported(_) => errors.getattr("UnsupportedError")?.call1((msg,))?,
                ClientError::ServerLost { unanswered, .. } => errors
                    .getattr("ServerLostError")?
                    .call1((msg, *unanswered))?,
                ClientError::Resolve { .. }
                | ClientError::Connect { .. }
                | ClientError::Handshake { .. }
                | ClientError::Tls { .. }
                | ClientError::Closed { .. }
                | ClientError::ClosedLocally
                | ClientError::Io { .. } => errors.getattr("ConnectionError")?.call1((msg,))?,
            };
            Ok(PyErr::from_value(exc))
        })();
        made.unwrap_or_else(|import_failed| import_failed)
    })
}

/// The bytes of a data message, readable without the GIL.
enum Payload<'py> {
    /// A `bytes` object: immutable, and kept alive by this reference.
    Immutable(Bound<'py, PyBytes>),
    /// Any other buffer, copied while the GIL is held: another thread may
    /// go on writing to the original without changing what is sent.
    Copied(Vec<u8>),
}

impl<'py> Payload<'py> {
    fn of(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Payload::Immutable(b.clone()));
        }
        Ok(Payload::Copied(byte_buffer(obj)?.to_vec(obj.py())?))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Immutable(b) => b.as_bytes(),
            Payload::Copied(v) => v,
        }
    }
}

/// Whether the interpreter has begun finalizing; callable without the GIL.
/// `Py_IsFinalizing` (3.13+) or `_Py_IsFinalizing` (3.8-3.12), looked up
/// once in the running interpreter; `false` where neither can be found.
pub(crate) fn interpreter_finalizing() -> bool {
    use std::sync::OnceLock;
    type IsFinalizing = unsafe extern "C" fn() -> c_int;
    static FUNC: OnceLock<Option<IsFinalizing>> = OnceLock::new();
    #[cfg(unix)]
    fn lookup() -> Option<IsFinalizing> {
        extern "C" {
            fn dlsym(
                handle: *mut std::ffi::c_void,
                symbol: *const std::os::raw::c_char,
            ) -> *mut std::ffi::c_void;
        }
        // RTLD_DEFAULT: the global scope, where the interpreter's symbols are.
        #[cfg(any(target_os = "macos", target_os = "ios"))]
        let default = -2isize as *mut std::ffi::c_void;
        #[cfg(not(any(target_os = "macos", target_os = "ios")))]
        let default = std::ptr::null_mut();
        [c"Py_IsFinalizing", c"_Py_IsFinalizing"]
            .into_iter()
            .find_map(|name| {
                // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
                let f = unsafe { dlsym(default, name.as_ptr()) };
                // SAFETY: both symbols are `int f(void)` in every CPython
                // that exports them.
                (!f.is_null()).then(|| unsafe { std::mem::transmute::<_, IsFinalizing>(f) })
            })
    }
    #[cfg(not(unix))]
    fn lookup() -> Option<IsFinalizing> {
        None
    }
    // SAFETY: the function only reads the runtime's finalizing state (an
    // atomic), which is allowed without the GIL.
    FUNC.get_or_init(lookup)
        .is_some_and(|f| unsafe { f() } != 0)
}

/// `py.detach(f)` for every blocking call of this module, made safe at
/// interpreter exit. CPython (up to 3.13) ends a thread that takes the GIL
/// back once finalization has begun with `pthread_exit`, whose unwinding
/// PyO3's panic guard catches: the process aborts ("FATAL: exception not
/// rethrown", SIGABRT). A daemon thread blocked in `recv`, `Pending.result`,
/// `map` or the asyncio dispatcher's wait would do that as the interpreter
/// exits. Such a thread is parked for good instead (what CPython 3.14 does
/// itself); the thread finalizing the interpreter carries on as usual.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    // With the GIL held, only the finalizing thread can see finalization.
    let finalizer = interpreter_finalizing();
    py.detach(move || {
        let r = f();
        if !finalizer && interpreter_finalizing() {
            loop {
                std::thread::park();
            }
        }
        r
    })
}

/// Runs a blocking wait in slices with the GIL released, so that Ctrl-C (a
/// pending signal) interrupts it and other threads run meanwhile.
/// `attempt(slice)` returns `Ok(None)` when the slice ran out.
pub(crate) fn wait_in_slices<T>(
    py: Python<'_>,
    timeout: Option<f64>,
    during: &'static str,
    mut attempt: impl FnMut(Duration) -> Result<Option<T>, ClientError> + Send,
) -> PyResult<T>
where
    T: Send,
{
    const SLICE: Duration = Duration::from_millis(100);
    let deadline = secs(timeout)?.map(|t| (Instant::now() + t, t));
    loop {
        let slice = match deadline {
            None => SLICE,
            Some((d, _)) => d.saturating_duration_since(Instant::now()).min(SLICE),
        };
        match detach(py, || attempt(slice)) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {
                if let Some((d, total)) = deadline {
                    if Instant::now() >= d {
                        return Err(to_py(ClientError::Timeout {
                            after: total,
                            during,
                        }));
                    }
                }
                py.check_signals()?;
            }
            Err(e) => return Err(to_py(e)),
        }
    }
}

/// `Ok(None)` for a timeout, so that `wait_in_slices` goes on waiting.
pub(crate) fn timeout_to_none<T>(r: Result<T, ClientError>) -> Result<Option<T>, ClientError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ClientError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A contiguous byte view of any buffer-protocol object (the Python layer
/// casts other formats to bytes first).
fn byte_buffer(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("data must be a C-contiguous buffer"));
    }
    Ok(buf)
}

/// A timeout in seconds as a `Duration`: `inf` (or anything past
/// `MAX_WAIT`) waits as long as `MAX_WAIT`, since deadlines further out
/// overflow the clock (a panic, not an error); negative or NaN is a
/// ValueError.
pub(crate) fn duration(s: f64) -> PyResult<Duration> {
    /// About 31 700 years: "forever" for any caller.
    const MAX_WAIT: f64 = 1e12;
    if s.is_nan() || s < 0.0 {
        return Err(PyValueError::new_err(format!("invalid timeout {s}")));
    }
    Ok(Duration::from_secs_f64(s.min(MAX_WAIT)))
}

pub(crate) fn secs(t: Option<f64>) -> PyResult<Option<Duration>> {
    t.map(duration).transpose()
}

/// One result: `id`, `count` (outputs), `data` (bytes). Supports the buffer
/// protocol, so `memoryview(out)` / `numpy.frombuffer(out)` do not copy;
/// that memory is where the message arrived, after its 4-byte id, so it is
/// not necessarily 8-byte aligned (numpy marks such an array unaligned and
/// still computes right). `.data` and `client.array(out)` are aligned copies.
#[pyclass(frozen, module = "corefarm._corefarm")]
struct Output {
    /// The id of the data message this result answers.
    #[pyo3(get)]
    id: u32,
    /// How many whole outputs of the configured output size `data` holds
    /// (a streaming handler's result may be any length: `len(data)` //
    /// output size, not the number of inputs).
    #[pyo3(get)]
    count: u32,
    data: Bytes,
}

#[pymethods]
impl Output {
    /// The outputs as `bytes` (a copy; `memoryview(out)` is not).
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// `id, data = out`
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let t = PyTuple::new(
            py,
            [
                self.id.into_pyobject(py)?.into_any(),
                self.data(py).into_any(),
            ],
        )?;
        Ok(t.as_any().try_iter()?.into_any())
    }

    fn __repr__(&self) -> String {
        format!(
            "Output(id={}, count={}, {} bytes)",
            self.id,
            self.count,
            self.data.len()
        )
    }

    /// # Safety
    /// Called by Python's buffer protocol with `view` either null or valid
    /// for writes (PEP 3118).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyValueError::new_err("NULL view in getbuffer"));
        }
        let data = &slf.get().data;
        // SAFETY: `view` is non-null and valid per the protocol; the memory
        // is a `Bytes` that never moves or changes, exported read-only
        // (FillInfo refuses a writable request), and the view holds a
        // reference to this frozen object, which owns the `Bytes`, until
        // Python releases it.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::os::raw::c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Nothing to release: the view's reference to this object keeps the
    /// memory alive, and Python drops that reference itself.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl From<RustOutput> for Output {
    fn from(o: RustOutput) -> Self {
        Output {
            id: o.id,
            count: o.count,
            data: o.data,
        }
    }
}

/// A connection to a corefarm server (see `corefarm.connect`).
#[pyclass(frozen, module = "corefarm._corefarm")]
struct Client {
    inner: RustClient,
    /// How long a submission waits for credit before a timeout error.
    io_timeout: Option<Duration>,
}

impl Client {
    /// Sends with `attempt`, which never waits for credit: while the server
    /// grants none, waits for it in slices with the GIL released, so that
    /// Ctrl-C interrupts a submission (as it does `recv`) and other threads
    /// run meanwhile. Gives up after the connection's `io_timeout`, as the
    /// Rust client's blocking submission does.
    fn with_credit<T: Send>(
        &self,
        py: Python<'_>,
        class: u8,
        mut attempt: impl FnMut() -> Result<Option<T>, ClientError> + Send,
    ) -> PyResult<T> {
        const SLICE: Duration = Duration::from_millis(100);
        let limit = || self.io_timeout.and_then(|t| Instant::now().checked_add(t));
        let mut deadline = limit();
        loop {
            if let Some(v) = detach(py, &mut attempt).map_err(to_py)? {
                return Ok(v);
            }
            // Replacing a lost server is bounded by reconnect_timeout; the
            // io_timeout starts afresh once it is back.
            if self.inner.resuming() {
                deadline = limit();
            }
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let credit = detach(py, || self.inner.wait_for_credit(class, slice)).map_err(to_py)?;
            if !credit && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(to_py(ClientError::Timeout {
                    after: self.io_timeout.unwrap_or_default(),
                    during: "waiting for credit from the server",
                }));
            }
            py.check_signals()?;
        }
    }
}

/// The TLS settings of `tls_ca=` and `tls_server_name=` (`connect` and
/// `group` alike); `None`: plain TCP. ValueError for a name without a CA
/// or a CA file that cannot be used.
pub(crate) fn client_tls(
    tls_ca: Option<std::path::PathBuf>,
    tls_server_name: Option<String>,
) -> PyResult<Option<corefarm_smp::tls::ClientTls>> {
    if tls_server_name.is_some() && tls_ca.is_none() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "tls_server_name needs tls_ca (the CA that signed the server's certificate)",
        ));
    }
    tls_ca
        .map(|ca| corefarm_smp::tls::ClientTls::from_ca_file(&ca, tls_server_name.as_deref()))
        .transpose()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (addr, *, legacy=false, nodes=None, name=None, connect_timeout=Some(10.0), io_timeout=None, max_message=None, secret=None, secret_file=None, tls_ca=None, tls_server_name=None, chunks=false, chunk_size=None, reconnect_timeout=Some(30.0), user=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addr: String,
        legacy: bool,
        nodes: Option<u32>,
        name: Option<String>,
        connect_timeout: Option<f64>,
        io_timeout: Option<f64>,
        max_message: Option<u32>,
        secret: Option<String>,
        secret_file: Option<std::path::PathBuf>,
        tls_ca: Option<std::path::PathBuf>,
        tls_server_name: Option<String>,
        chunks: bool,
        chunk_size: Option<u32>,
        reconnect_timeout: Option<f64>,
        user: Option<String>,
    ) -> PyResult<Self> {
        use corefarm_smp::auth::Secret;
        // An explicit user, else COREFARM_USER; none: the anonymous tenant.
        let user = match user {
            Some(u) => corefarm_smp::auth::check_user_name(&u).map(|()| Some(u)),
            None => corefarm_smp::auth::user_from_env(),
        }
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        // An explicit secret, else a file, else COREFARM_SECRET / COREFARM_SECRET_FILE.
        let secret = match secret {
            Some(s) => Some(Secret::new(&s)),
            None => Secret::from_file_or_env(secret_file.as_deref()).transpose(),
        }
        .transpose()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let tls = client_tls(tls_ca, tls_server_name)?;
        let mut opts = ClientOptions {
            secret,
            user,
            tls,
            legacy,
            nodes,
            name: name.or_else(|| Some("python".into())),
            connect_timeout: secs(connect_timeout)?,
            io_timeout: secs(io_timeout)?,
            chunks,
            chunk_size,
            reconnect_timeout: secs(reconnect_timeout)?,
            ..Default::default()
        };
        if let Some(m) = max_message {
            opts.max_message = m;
        }
        let io_timeout = opts.io_timeout;
        let inner = detach(py, || RustClient::connect(&addr, opts)).map_err(to_py)?;
        Ok(Client { inner, io_timeout })
    }

    /// configure(input_size, output_size, cores, bitstream): `cores` is a
    /// list of (control, input, output) base addresses.
    fn configure(
        &self,
        py: Python<'_>,
        input_size: u32,
        output_size: u32,
        cores: Vec<(u32, u32, u32)>,
        bitstream: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let buf = byte_buffer(bitstream)?;
        // The configuration is sent once; a copy of the image is fine.
        let cfg = configuration(input_size, output_size, cores, Bytes::from(buf.to_vec(py)?));
        detach(py, || self.inner.configure(&cfg)).map_err(to_py)
    }

    fn configure_benchmark(
        &self,
        py: Python<'_>,
        input_size: u32,
        output_size: u32,
        delay_us: u32,
    ) -> PyResult<()> {
        detach(py, || {
            self.inner
                .configure_benchmark(input_size, output_size, delay_us)
        })
        .map_err(to_py)
    }

    /// submit(data) -> id; the result comes from `recv`. `data`: `bytes`
    /// (sent from its memory) or any C-contiguous buffer (copied first).
    /// `priority`: class 0 (most urgent) to 7; None is the default class 4.
    #[pyo3(signature = (data, *, priority=None))]
    fn submit(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        priority: Option<u8>,
    ) -> PyResult<u32> {
        let payload = Payload::of(data)?;
        let bytes = payload.as_slice();
        let class = priority.unwrap_or(DEFAULT_CLASS);
        self.with_credit(py, class, || {
            self.inner.try_submit_slice_with(None, bytes, class)
        })
    }

    #[pyo3(signature = (id, data, *, priority=None))]
    fn submit_with_id(
        &self,
        py: Python<'_>,
        id: u32,
        data: &Bound<'_, PyAny>,
        priority: Option<u8>,
    ) -> PyResult<()> {
        let payload = Payload::of(data)?;
        let bytes = payload.as_slice();
        let class = priority.unwrap_or(DEFAULT_CLASS);
        self.with_credit(py, class, || {
            self.inner.try_submit_slice_with(Some(id), bytes, class)
        })
        .map(drop)
    }

    /// submit_pending(data) -> Pending: the result goes to that handle only.
    #[pyo3(signature = (data, *, priority=None))]
    fn submit_pending(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        priority: Option<u8>,
    ) -> PyResult<Pending> {
        let payload = Payload::of(data)?;
        let bytes = payload.as_slice();
        let class = priority.unwrap_or(DEFAULT_CLASS);
        self.with_credit(py, class, || {
            self.inner.submit_slice_pending_with(bytes, class, true)
        })
        .map(Pending::from)
    }

    /// The chunk size agreed with the server, or None without `chunks`.
    #[getter]
    fn chunk_size(&self) -> Option<u32> {
        self.inner.chunk_size()
    }

    /// try_submit_pending(data) -> Pending or None: None, sending nothing,
    /// when the server grants no credit right now (never waits for credit).
    #[pyo3(signature = (data, *, priority=None))]
    fn try_submit_pending(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        priority: Option<u8>,
    ) -> PyResult<Option<Pending>> {
        let payload = Payload::of(data)?;
        let bytes = payload.as_slice();
        let class = priority.unwrap_or(DEFAULT_CLASS);
        detach(py, || {
            self.inner.submit_slice_pending_with(bytes, class, true)
        })
        .map(|p| p.map(Pending::from))
        .map_err(to_py)
    }

    /// recv(timeout=None) -> Output; timeout in seconds.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Output> {
        wait_in_slices(py, timeout, "waiting for a result", |slice| {
            timeout_to_none(self.inner.recv(Some(slice)))
        })
        .map(Output::from)
    }

    /// recv_notification(timeout=None) -> (id, set, bytes) or None: the
    /// oldest handler notification; None after `timeout` s, or once the
    /// connection has ended and none is left.
    #[pyo3(signature = (timeout=None))]
    fn recv_notification(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<(u32, u8, Py<PyBytes>)>> {
        const SLICE: Duration = Duration::from_millis(100);
        let deadline = secs(timeout)?.map(|t| Instant::now() + t);
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let began = Instant::now();
            if let Some(n) = detach(py, || self.inner.recv_notification(Some(slice))) {
                return Ok(Some((n.id, n.set, PyBytes::new(py, &n.data).unbind())));
            }
            // Only an ended connection answers None before the slice is up.
            let closed = began.elapsed() < slice;
            if closed || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            // Between slices: Ctrl-C interrupts a long wait.
            py.check_signals()?;
        }
    }

    /// Notifications dropped because the client's queue (1024) was full.
    #[getter]
    fn notifications_dropped(&self) -> u64 {
        self.inner.notifications_dropped()
    }

    /// status() -> the server's status as a JSON string.
    fn status(&self, py: Python<'_>) -> PyResult<String> {
        let s = detach(py, || self.inner.status()).map_err(to_py)?;
        Ok(String::from_utf8_lossy(&s.encode()).into_owned())
    }

    #[getter]
    fn has_status(&self) -> bool {
        self.inner.has_status()
    }

    /// Test hook: waits until `n` threads block in `recv`; False on timeout.
    fn _wait_blocked_receivers(&self, py: Python<'_>, n: usize, timeout: f64) -> PyResult<bool> {
        let t = secs(Some(timeout))?.unwrap_or_default();
        Ok(detach(py, || self.inner.wait_for_blocked_receivers(n, t)))
    }

    /// Test hook: waits until `n` submissions wait for credit; False on timeout.
    fn _wait_credit_waiters(&self, py: Python<'_>, n: usize, timeout: f64) -> PyResult<bool> {
        let t = secs(Some(timeout))?.unwrap_or_default();
        Ok(detach(py, || self.inner.wait_for_credit_waiters(n, t)))
    }

    fn close(&self, py: Python<'_>) {
        detach(py, || self.inner.close());
    }

    #[getter]
    fn nodes(&self) -> Option<u32> {
        self.inner.nodes()
    }

    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings()
    }

    #[getter]
    fn credit_mode(&self) -> bool {
        self.inner.credit_mode()
    }

    /// (input_size, output_size) of the configuration in force, or None.
    #[getter]
    fn sizes(&self) -> Option<(u32, u32)> {
        self.inner.sizes()
    }

    /// The server's hello as a JSON string, or None in legacy mode.
    #[getter]
    fn server_hello(&self) -> Option<String> {
        self.inner
            .server_hello()
            .map(|h| String::from_utf8_lossy(&h.encode()).into_owned())
    }

    #[getter]
    fn addr(&self) -> String {
        self.inner.addr().to_string()
    }

    /// Times the session was resumed after losing its server.
    #[getter]
    fn resumes(&self) -> u64 {
        self.inner.resumes()
    }

    /// The address of the server in use now.
    #[getter]
    fn server_addr(&self) -> String {
        self.inner.server_addr()
    }
}

/// The default core table of docs/interfaces.md for `n` cores.
#[pyfunction]
fn default_core_table(n: u32, input_size: u32, output_size: u32) -> PyResult<Vec<(u32, u32, u32)>> {
    Ok(
        corefarm_client::default_core_table(n, input_size, output_size)
            .map_err(|e| to_py(ClientError::InvalidInput(e.to_string())))?
            .into_iter()
            .map(|c| (c.control, c.input, c.output))
            .collect(),
    )
}

#[pymodule]
fn _corefarm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Output>()?;
    m.add_class::<Pending>()?;
    m.add_class::<Completions>()?;
    m.add_class::<cowork::Cowork>()?;
    m.add_class::<group::RawGroup>()?;
    m.add_function(wrap_pyfunction!(default_core_table, m)?)?;
    m.add_function(wrap_pyfunction!(image::inspect_image, m)?)?;
    m.add_function(wrap_pyfunction!(image::parse_type, m)?)?;
    m.add_function(wrap_pyfunction!(image::result_types, m)?)?;
    m.add_class::<image::ResultTypes>()?;
    m.add_function(wrap_pyfunction!(smp::decode, m)?)?;
    m.add_function(wrap_pyfunction!(smp::encode, m)?)?;
    m.add("DEFAULT_MAX_MESSAGE", corefarm_smp::DEFAULT_MAX_MESSAGE)?;
    Ok(())
}

/// A configuration from Python's arguments: sizes, (control, input, output)
/// core table entries and the bitstream.
pub(crate) fn configuration(
    input_size: u32,
    output_size: u32,
    cores: Vec<(u32, u32, u32)>,
    bitstream: Bytes,
) -> Configuration {
    Configuration {
        input_size,
        output_size,
        cores: cores
            .into_iter()
            .map(|(control, input, output)| CoreInfo {
                control,
                input,
                output,
            })
            .collect(),
        bitstream,
    }
}
