//! PyO3 bindings of `rust_ngram`: the module `sglang_hybrid._ngram`.
//!
//! Thin on purpose: validation of Python-level types (lists, dtypes) lives in `sglang_hybrid/ngram.py`; this
//! layer accepts only 1-D C-contiguous `int32`/`int64` numpy arrays, reads them in place (an `int32` array is
//! used without any copy; `int64` is narrowed once per call), allocates the output arrays once per call and lets
//! the Rust drafter write into them directly. Every call releases the GIL (`Python::detach`) and then takes the
//! drafter's mutex, so several Python threads may call one drafter at once, and a thread waiting for the mutex
//! never holds the GIL (no lock-order deadlock).
//!
//! The drafter's defaults have one owner, `DrafterConfig::default()`: the signature of `NgramCore` evaluates it,
//! `drafter_defaults()` hands it to Python (`sglang_hybrid/ngram.py` builds its signature from that), and the
//! stub `_ngram.pyi` writes no values (`= ...`).

use std::sync::{Mutex, MutexGuard};

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1};
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rust_ngram::{DraftBatch, Drafter, DrafterConfig, DrafterError};

fn to_py(e: DrafterError) -> PyErr {
    match e {
        DrafterError::UnknownRequest(_) => PyKeyError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// `DrafterConfig::default()`: the defaults of `NgramCore`'s signature.
fn dflt() -> DrafterConfig {
    DrafterConfig::default()
}

/// Every field of `cfg` as a dict, in declaration order (`vocab_size` is `None` when unset).
fn config_dict<'py>(py: Python<'py>, cfg: &DrafterConfig) -> PyResult<Bound<'py, PyDict>> {
    // No `..`: a field added to `DrafterConfig` does not compile here until it is exposed too.
    let DrafterConfig {
        max_draft,
        max_nodes,
        min_match,
        max_backoff,
        scan_limit,
        use_corpus,
        corpus_cap_tokens,
        donate_prompts,
        vocab_size,
    } = cfg;
    let d = PyDict::new(py);
    d.set_item("max_draft", max_draft)?;
    d.set_item("max_nodes", max_nodes)?;
    d.set_item("min_match", min_match)?;
    d.set_item("max_backoff", max_backoff)?;
    d.set_item("scan_limit", scan_limit)?;
    d.set_item("use_corpus", use_corpus)?;
    d.set_item("corpus_cap_tokens", corpus_cap_tokens)?;
    d.set_item("donate_prompts", donate_prompts)?;
    d.set_item("vocab_size", vocab_size)?;
    Ok(d)
}

/// The drafter's defaults (`rust_ngram::DrafterConfig::default()`) as a new dict: field name -> value, in the
/// order of `NgramCore`'s arguments.
#[pyfunction]
fn drafter_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    config_dict(py, &DrafterConfig::default())
}

/// Token or id array borrowed from numpy: `int32` in place, `int64` narrowed.
enum IntArray<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> IntArray<'py> {
    fn new(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i32>>() {
            return Ok(IntArray::I32(a));
        }
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i64>>() {
            return Ok(IntArray::I64(a));
        }
        Err(PyTypeError::new_err(format!("{name} must be a 1-D numpy array of dtype int32 or int64")))
    }

    fn not_contiguous(name: &str) -> PyErr {
        PyValueError::new_err(format!("{name} must be C-contiguous (use numpy.ascontiguousarray)"))
    }

    /// Token ids as u32: zero-copy for int32, one narrowing pass for int64; negatives are rejected.
    fn tokens(&self, name: &str) -> PyResult<std::borrow::Cow<'_, [u32]>> {
        match self {
            IntArray::I32(a) => {
                let s = a.as_slice().map_err(|_| Self::not_contiguous(name))?;
                if let Some(&t) = s.iter().find(|&&t| t < 0) {
                    return Err(PyValueError::new_err(format!("{name}: negative token id {t}")));
                }
                // SAFETY: i32 and u32 have the same size and alignment, and every value is non-negative.
                let u = unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u32, s.len()) };
                Ok(std::borrow::Cow::Borrowed(u))
            }
            IntArray::I64(a) => {
                let s = a.as_slice().map_err(|_| Self::not_contiguous(name))?;
                s.iter()
                    .map(|&t| {
                        u32::try_from(t).ok().filter(|&u| u <= i32::MAX as u32).ok_or_else(|| {
                            PyValueError::new_err(format!("{name}: token id {t} out of range [0, 2^31)"))
                        })
                    })
                    .collect::<PyResult<Vec<u32>>>()
                    .map(std::borrow::Cow::Owned)
            }
        }
    }

    /// Request ids as u64 (bit pattern of the int64 value, so any Python int64 id works).
    fn ids(&self, name: &str) -> PyResult<Vec<u64>> {
        Ok(match self {
            IntArray::I32(a) => {
                a.as_slice().map_err(|_| Self::not_contiguous(name))?.iter().map(|&x| x as i64 as u64).collect()
            }
            IntArray::I64(a) => {
                a.as_slice().map_err(|_| Self::not_contiguous(name))?.iter().map(|&x| x as u64).collect()
            }
        })
    }
}

/// Rust n-gram drafter core (use `sglang_hybrid.ngram.NgramDrafter`, which validates Python inputs).
#[pyclass(frozen, module = "sglang_hybrid._ngram")]
struct NgramCore {
    inner: Mutex<Drafter>,
    /// The configuration the drafter was built with (immutable; read without the mutex).
    cfg: DrafterConfig,
}

fn lock(m: &Mutex<Drafter>) -> PyResult<MutexGuard<'_, Drafter>> {
    m.lock().map_err(|_| PyRuntimeError::new_err("ngram drafter poisoned by an earlier panic"))
}

type Out<'py> = (
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray2<i32>>,
    Bound<'py, PyArray2<i8>>,
);

impl NgramCore {
    /// Runs one batched proposal into Rust-owned buffers, then hands each buffer to numpy without copying.
    ///
    /// Why not `PyArray::zeros` + `readwrite()`: that costs eight numpy allocations plus eight dynamic borrow
    /// registrations per call (~2 us), a large share of a one-request step; `into_pyarray` moves each `Vec` into an
    /// array that owns it.
    fn propose_common<'py>(
        &self,
        py: Python<'py>,
        req_ids: &Bound<'py, PyAny>,
        width: usize,
        tree: bool,
    ) -> PyResult<Out<'py>> {
        let ids = IntArray::new(req_ids, "req_ids")?.ids("req_ids")?;
        let b = ids.len();
        let inner = &self.inner;
        let out = py.detach(|| -> PyResult<DraftBatch> {
            let mut out = DraftBatch::new(b, width);
            let mut dr = lock(inner)?;
            if tree {
                dr.propose_tree(&ids, width, &mut out.rows()).map_err(to_py)?;
            } else {
                dr.propose(&ids, width, &mut out.rows()).map_err(to_py)?;
            }
            Ok(out)
        })?;
        fn arr2<'py, T: numpy::Element>(py: Python<'py>, v: Vec<T>, b: usize, w: usize) -> Bound<'py, PyArray2<T>> {
            numpy::ndarray::Array2::from_shape_vec((b, w), v).expect("b * w elements").into_pyarray(py)
        }
        let DraftBatch { tokens, parents, depth, match_len, count, total, source, lengths, .. } = out;
        Ok((
            arr2(py, tokens, b, width),
            lengths.into_pyarray(py),
            arr2(py, parents, b, width),
            arr2(py, depth, b, width),
            arr2(py, match_len, b, width),
            arr2(py, count, b, width),
            arr2(py, total, b, width),
            arr2(py, source, b, width),
        ))
    }
}

#[pymethods]
impl NgramCore {
    /// Every omitted argument takes its value from `DrafterConfig::default()` (see `drafter_defaults()`).
    #[new]
    #[pyo3(signature = (
        max_draft = dflt().max_draft,
        max_nodes = dflt().max_nodes,
        min_match = dflt().min_match,
        max_backoff = dflt().max_backoff,
        scan_limit = dflt().scan_limit,
        use_corpus = dflt().use_corpus,
        corpus_cap_tokens = dflt().corpus_cap_tokens,
        donate_prompts = dflt().donate_prompts,
        vocab_size = dflt().vocab_size,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_draft: usize,
        max_nodes: usize,
        min_match: u32,
        max_backoff: usize,
        scan_limit: usize,
        use_corpus: bool,
        corpus_cap_tokens: usize,
        donate_prompts: bool,
        vocab_size: Option<u32>,
    ) -> PyResult<Self> {
        let cfg = DrafterConfig {
            max_draft,
            max_nodes,
            min_match,
            max_backoff,
            scan_limit,
            use_corpus,
            corpus_cap_tokens,
            donate_prompts,
            vocab_size,
        };
        let d = Drafter::new(cfg.clone()).map_err(to_py)?;
        Ok(NgramCore { inner: Mutex::new(d), cfg })
    }

    #[getter]
    fn max_draft(&self) -> usize {
        self.cfg.max_draft
    }

    #[getter]
    fn max_nodes(&self) -> usize {
        self.cfg.max_nodes
    }

    /// The configuration this core was built with, as a new dict (the keys of `drafter_defaults()`).
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, &self.cfg)
    }

    /// Registers `req_id` with its prompt (1-D int32/int64 array).
    fn start(&self, py: Python<'_>, req_id: i64, prompt: &Bound<'_, PyAny>) -> PyResult<()> {
        let a = IntArray::new(prompt, "prompt")?;
        let toks = a.tokens("prompt")?;
        let toks: &[u32] = &toks;
        let inner = &self.inner;
        py.detach(|| lock(inner)?.start(req_id as u64, toks).map_err(to_py))
    }

    /// Appends accepted tokens to `req_id`.
    fn extend(&self, py: Python<'_>, req_id: i64, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let a = IntArray::new(tokens, "tokens")?;
        let toks = a.tokens("tokens")?;
        let toks: &[u32] = &toks;
        let inner = &self.inner;
        py.detach(|| lock(inner)?.extend(req_id as u64, toks).map_err(to_py))
    }

    /// Appends `tokens[offsets[b]:offsets[b+1]]` to `req_ids[b]` for all b in one call (ids distinct).
    fn extend_batch(
        &self,
        py: Python<'_>,
        req_ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = IntArray::new(req_ids, "req_ids")?.ids("req_ids")?;
        let a = IntArray::new(tokens, "tokens")?;
        let toks = a.tokens("tokens")?;
        let toks: &[u32] = &toks;
        let offs = IntArray::new(offsets, "offsets")?.ids("offsets")?;
        if offs.iter().any(|&o| o as i64 <= -1) {
            return Err(PyValueError::new_err("offsets must be non-negative"));
        }
        let offs: Vec<usize> = offs.into_iter().map(|o| o as usize).collect();
        let inner = &self.inner;
        py.detach(|| lock(inner)?.extend_batch(&ids, toks, &offs).map_err(to_py))
    }

    /// Chain drafts: (tokens, lengths, parents, depth, match_len, count, total, source).
    fn propose<'py>(&self, py: Python<'py>, req_ids: &Bound<'py, PyAny>, k: usize) -> PyResult<Out<'py>> {
        self.propose_common(py, req_ids, k, false)
    }

    /// Tree drafts: (tokens, lengths, parents, depth, match_len, count, total, source).
    fn propose_tree<'py>(&self, py: Python<'py>, req_ids: &Bound<'py, PyAny>, n_nodes: usize) -> PyResult<Out<'py>> {
        self.propose_common(py, req_ids, n_nodes, true)
    }

    /// Finishes `req_id` (optionally donating its response to the shared corpus) and frees its automaton.
    #[pyo3(signature = (req_id, donate=true))]
    fn finish(&self, py: Python<'_>, req_id: i64, donate: bool) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| lock(inner)?.finish(req_id as u64, donate).map_err(to_py))
    }

    /// Forgets `req_id`.
    fn remove(&self, py: Python<'_>, req_id: i64) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| lock(inner)?.remove(req_id as u64).map_err(to_py))
    }

    /// Adds one document to the static corpus.
    fn add_corpus(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let a = IntArray::new(tokens, "tokens")?;
        let toks = a.tokens("tokens")?;
        let toks: &[u32] = &toks;
        let inner = &self.inner;
        py.detach(|| lock(inner)?.add_corpus(toks).map_err(to_py))
    }

    fn contains(&self, py: Python<'_>, req_id: i64) -> PyResult<bool> {
        let inner = &self.inner;
        py.detach(|| Ok(lock(inner)?.contains(req_id as u64)))
    }

    fn context_len(&self, py: Python<'_>, req_id: i64) -> PyResult<usize> {
        let inner = &self.inner;
        py.detach(|| lock(inner)?.context_len(req_id as u64).map_err(to_py))
    }

    fn num_requests(&self, py: Python<'_>) -> PyResult<usize> {
        let inner = &self.inner;
        py.detach(|| Ok(lock(inner)?.num_requests()))
    }

    fn memory_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        let inner = &self.inner;
        py.detach(|| Ok(lock(inner)?.memory_bytes()))
    }

    fn request_memory_bytes(&self, py: Python<'_>, req_id: i64) -> PyResult<usize> {
        let inner = &self.inner;
        py.detach(|| lock(inner)?.request_memory_bytes(req_id as u64).map_err(to_py))
    }

    /// (donated tokens held, static tokens held, corpus bytes, generation rotations so far).
    fn corpus_stats(&self, py: Python<'_>) -> PyResult<(usize, usize, usize, u64)> {
        let inner = &self.inner;
        py.detach(|| {
            let d = lock(inner)?;
            let c = d.corpus();
            let stat = c.slot(rust_ngram::SLOT_STATIC).map_or(0, |s| s.len());
            Ok((c.donated_tokens(), stat, c.memory_bytes(), c.rotations()))
        })
    }
}

/// Rust suffix-automaton n-gram drafter (see `sglang_hybrid.ngram`).
#[pymodule]
fn _ngram(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NgramCore>()?;
    m.add_function(wrap_pyfunction!(drafter_defaults, m)?)?;
    m.add("SEPARATOR", rust_ngram::SEPARATOR)?;
    Ok(())
}
