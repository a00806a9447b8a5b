//! Multi-request drafter: request lifecycle, shared corpus, batched chain and tree proposals.

use std::collections::HashMap;
use std::fmt;

use crate::automaton::{Match, SuffixAutomaton};
use crate::corpus::{rematch, Corpus, CorpusChange, CORPUS_SLOTS, SLOT_ACTIVE, SLOT_OLD};
use crate::draft::{chain_draft, chain_draft_group, tree_draft, DraftToken, Source, TreeParams};

/// Configuration of a [`Drafter`]. Every field has a sensible default ([`DrafterConfig::default`]).
///
/// ```
/// use rust_ngram::{Drafter, DrafterConfig};
/// let cfg = DrafterConfig { max_draft: 4, vocab_size: Some(32_000), ..Default::default() };
/// assert_eq!((cfg.max_nodes, cfg.min_match, cfg.use_corpus), (64, 1, true));
/// let d = Drafter::new(cfg.clone()).unwrap();
/// assert_eq!(d.config(), &cfg);
/// assert!(Drafter::new(DrafterConfig { min_match: 0, ..Default::default() }).is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterConfig {
    /// Largest chain length `k` accepted by [`Drafter::propose`] (default 8).
    pub max_draft: usize,
    /// Largest tree size accepted by [`Drafter::propose_tree`] (default 64).
    pub max_nodes: usize,
    /// Shortest match worth drafting from (default 1, must be >= 1: the empty context predicts nothing).
    pub min_match: u32,
    /// Shorter contexts consulted per tree node (default 1).
    pub max_backoff: usize,
    /// Out-transitions examined per context in trees (default 32).
    pub scan_limit: usize,
    /// Consult the shared corpus (default true).
    pub use_corpus: bool,
    /// Cap on donated corpus tokens (default 1 << 20), see [`Corpus`].
    pub corpus_cap_tokens: usize,
    /// [`Drafter::finish`] with `donate` donates the whole context, prompt and response as one document, instead
    /// of the response alone (default true: on real chat it lifts acceptance, see `docs/ngram.md`). The prompt
    /// enters the corpus only when its request finishes, so a request never matches its own donated prompt.
    pub donate_prompts: bool,
    /// When set, token ids must be below it. Ids must always be `<= i32::MAX`.
    pub vocab_size: Option<u32>,
}

impl Default for DrafterConfig {
    /// The drafter's defaults, written only here: [`TreeParams::default`] and the Python binding
    /// (`sglang_hybrid._ngram.drafter_defaults()`, the signatures of `NgramCore` and `NgramDrafter`) read them.
    fn default() -> Self {
        DrafterConfig {
            max_draft: 8,
            max_nodes: 64,
            min_match: 1,
            max_backoff: 1,
            scan_limit: 32,
            use_corpus: true,
            corpus_cap_tokens: 1 << 20,
            donate_prompts: true,
            vocab_size: None,
        }
    }
}

/// Why a [`Drafter`] call was rejected. A rejected call changes nothing.
///
/// ```
/// use rust_ngram::{Drafter, DrafterConfig, DrafterError};
/// let mut d = Drafter::new(DrafterConfig { vocab_size: Some(100), ..Default::default() }).unwrap();
/// d.start(1, &[1, 2]).unwrap();
/// let e = d.extend(1, &[3, 100]).unwrap_err();
/// assert_eq!(e, DrafterError::TokenOutOfRange { token: 100, vocab_size: Some(100) });
/// assert_eq!(e.to_string(), "token id 100 out of range [0, 100)");
/// assert_eq!(d.context_len(1), Ok(2)); // the valid token 3 was not appended either
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrafterError {
    /// The request id is not registered.
    UnknownRequest(u64),
    /// `start` with an id that is already registered.
    DuplicateRequest(u64),
    /// The request was finished: it accepts no more tokens.
    Finished(u64),
    /// A token id is above `i32::MAX` or not below `vocab_size`.
    TokenOutOfRange {
        /// The offending id.
        token: u64,
        /// The configured vocabulary size, if any.
        vocab_size: Option<u32>,
    },
    /// Any other argument problem (sizes, `k`, `n_nodes`, duplicate ids where not allowed).
    InvalidArgument(String),
}

impl fmt::Display for DrafterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrafterError::UnknownRequest(id) => write!(f, "unknown request id {id}"),
            DrafterError::DuplicateRequest(id) => write!(f, "request id {id} is already started"),
            DrafterError::Finished(id) => write!(f, "request id {id} is finished and accepts no tokens"),
            DrafterError::TokenOutOfRange { token, vocab_size: Some(v) } => {
                write!(f, "token id {token} out of range [0, {v})")
            }
            DrafterError::TokenOutOfRange { token, vocab_size: None } => {
                write!(f, "token id {token} out of range [0, 2^31)")
            }
            DrafterError::InvalidArgument(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for DrafterError {}

/// Result alias of this module.
///
/// ```
/// use rust_ngram::{Drafter, DrafterConfig, DrafterError, Result};
/// fn context_or_zero(d: &Drafter, id: u64) -> Result<usize> {
///     match d.context_len(id) {
///         Err(DrafterError::UnknownRequest(_)) => Ok(0),
///         other => other,
///     }
/// }
/// let d = Drafter::new(DrafterConfig::default()).unwrap();
/// assert_eq!(context_or_zero(&d, 3), Ok(0));
/// ```
pub type Result<T> = std::result::Result<T, DrafterError>;

#[derive(Clone, Debug)]
struct Request {
    sam: SuffixAutomaton,
    prompt_len: usize,
    corpus: [Match; CORPUS_SLOTS],
    finished: bool,
}

/// Output rows of a batched proposal, borrowed from caller-owned buffers (numpy arrays in the binding).
///
/// Layout: every per-token slice is `[B * width]` row-major (`B` = number of ids); `lengths` is `[B]`. Rows are
/// fully overwritten: valid entries form a prefix of each row; padding holds `-1` in `tokens`/`parents` and 0 in
/// the features.
///
/// ```
/// use rust_ngram::{DraftRows, Drafter, DrafterConfig};
/// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
/// d.start(1, &[4, 5, 6, 4, 5]).unwrap();
/// d.start(2, &[7, 8]).unwrap(); // nothing repeats: an empty row
/// let (b, k) = (2, 3);
/// let (mut tokens, mut parents, mut depth) = (vec![0; b * k], vec![0; b * k], vec![0; b * k]);
/// let (mut match_len, mut count, mut total) = (vec![0; b * k], vec![0; b * k], vec![0; b * k]);
/// let (mut source, mut lengths) = (vec![0i8; b * k], vec![0; b]);
/// let mut rows = DraftRows {
///     width: k,
///     tokens: &mut tokens,
///     parents: &mut parents,
///     depth: &mut depth,
///     match_len: &mut match_len,
///     count: &mut count,
///     total: &mut total,
///     source: &mut source,
///     lengths: &mut lengths,
/// };
/// d.propose(&[1, 2], k, &mut rows).unwrap();
/// assert_eq!(lengths, [3, 0]);
/// assert_eq!(tokens, [6, 4, 5, -1, -1, -1]);
/// assert_eq!(parents[..3], [-1, 0, 1]);
/// assert_eq!(depth[..3], [1, 2, 3]);
/// ```
pub struct DraftRows<'a> {
    /// Columns per row (`k` or `n_nodes`).
    pub width: usize,
    /// Drafted token ids.
    pub tokens: &'a mut [i32],
    /// Parent index in the row (`-1` = child of the last committed token).
    pub parents: &'a mut [i32],
    /// 1-based depth.
    pub depth: &'a mut [i32],
    /// Matched context length when drafted.
    pub match_len: &'a mut [i32],
    /// Occurrences of the token after the matched context.
    pub count: &'a mut [i32],
    /// Occurrences of the matched context with any continuation.
    pub total: &'a mut [i32],
    /// 0 = own context, 1 = shared corpus.
    pub source: &'a mut [i8],
    /// Valid entries per row.
    pub lengths: &'a mut [i32],
}

/// Owned version of [`DraftRows`] for Rust callers.
///
/// ```
/// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
/// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
/// d.start(1, &[1, 2, 3, 1, 2]).unwrap();
/// d.start(2, &[4, 4]).unwrap();
/// let mut out = DraftBatch::new(2, 3);
/// d.propose(&[1, 2], 3, &mut out.rows()).unwrap();
/// assert_eq!(out.lengths, [3, 3]);
/// assert_eq!(out.tokens, [3, 1, 2, 4, 4, 4]);
/// assert_eq!(out.match_len[..3], [2, 3, 4]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftBatch {
    /// Columns per row.
    pub width: usize,
    /// See [`DraftRows::tokens`].
    pub tokens: Vec<i32>,
    /// See [`DraftRows::parents`].
    pub parents: Vec<i32>,
    /// See [`DraftRows::depth`].
    pub depth: Vec<i32>,
    /// See [`DraftRows::match_len`].
    pub match_len: Vec<i32>,
    /// See [`DraftRows::count`].
    pub count: Vec<i32>,
    /// See [`DraftRows::total`].
    pub total: Vec<i32>,
    /// See [`DraftRows::source`].
    pub source: Vec<i8>,
    /// See [`DraftRows::lengths`].
    pub lengths: Vec<i32>,
}

impl DraftBatch {
    /// Buffers for `batch` rows of `width` columns, filled with padding (`-1` tokens and parents, 0 elsewhere).
    ///
    /// ```
    /// use rust_ngram::DraftBatch;
    /// let out = DraftBatch::new(2, 3);
    /// assert_eq!((out.width, out.tokens.len(), out.lengths.len()), (3, 6, 2));
    /// assert_eq!(out.tokens, [-1; 6]); // already padding: -1 tokens and parents, 0 elsewhere
    /// assert_eq!(out.count, [0; 6]);
    /// ```
    pub fn new(batch: usize, width: usize) -> Self {
        let n = batch * width;
        DraftBatch {
            width,
            tokens: vec![-1; n],
            parents: vec![-1; n],
            depth: vec![0; n],
            match_len: vec![0; n],
            count: vec![0; n],
            total: vec![0; n],
            source: vec![0; n],
            lengths: vec![0; batch],
        }
    }

    /// Borrows the buffers as [`DraftRows`].
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 1]).unwrap();
    /// let mut out = DraftBatch::new(1, 2);
    /// let rows = out.rows();
    /// assert_eq!((rows.width, rows.tokens.len(), rows.lengths.len()), (2, 2, 1));
    /// d.propose(&[1], 2, &mut out.rows()).unwrap();
    /// assert_eq!(out.tokens, [2, 1]);
    /// ```
    pub fn rows(&mut self) -> DraftRows<'_> {
        DraftRows {
            width: self.width,
            tokens: &mut self.tokens,
            parents: &mut self.parents,
            depth: &mut self.depth,
            match_len: &mut self.match_len,
            count: &mut self.count,
            total: &mut self.total,
            source: &mut self.source,
            lengths: &mut self.lengths,
        }
    }

    /// The valid draft tokens of row `b`.
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 1]).unwrap();
    /// d.start(2, &[3]).unwrap(); // nothing to copy from
    /// let mut out = DraftBatch::new(2, 4);
    /// d.propose(&[1, 2], 4, &mut out.rows()).unwrap();
    /// assert_eq!(out.row_tokens(0), &[2, 1, 2, 1]); // the loop "1 2" continued
    /// assert!(out.row_tokens(1).is_empty());
    /// assert_eq!(out.tokens[4..], [-1; 4]); // the padding row_tokens leaves out
    /// ```
    pub fn row_tokens(&self, b: usize) -> &[i32] {
        &self.tokens[b * self.width..b * self.width + self.lengths[b] as usize]
    }
}

struct Row<'a> {
    tokens: &'a mut [i32],
    parents: &'a mut [i32],
    depth: &'a mut [i32],
    match_len: &'a mut [i32],
    count: &'a mut [i32],
    total: &'a mut [i32],
    source: &'a mut [i8],
    length: &'a mut i32,
}

impl Row<'_> {
    fn write(&mut self, drafts: &[DraftToken]) {
        self.tokens.fill(-1);
        self.parents.fill(-1);
        self.depth.fill(0);
        self.match_len.fill(0);
        self.count.fill(0);
        self.total.fill(0);
        self.source.fill(0);
        for (j, d) in drafts.iter().enumerate() {
            self.tokens[j] = d.token as i32;
            self.parents[j] = d.parent;
            self.depth[j] = d.depth as i32;
            self.match_len[j] = d.match_len.min(i32::MAX as u32) as i32;
            self.count[j] = d.count as i32;
            self.total[j] = d.total as i32;
            self.source[j] = d.source as i8;
        }
        *self.length = drafts.len() as i32;
    }
}

fn split_rows<'a>(out: &'a mut DraftRows<'_>, batch: usize) -> Vec<Row<'a>> {
    let w = out.width;
    let mut rows = Vec::with_capacity(batch);
    let it = out
        .tokens
        .chunks_mut(w)
        .zip(out.parents.chunks_mut(w))
        .zip(out.depth.chunks_mut(w))
        .zip(out.match_len.chunks_mut(w))
        .zip(out.count.chunks_mut(w))
        .zip(out.total.chunks_mut(w))
        .zip(out.source.chunks_mut(w))
        .zip(out.lengths.iter_mut());
    for (((((((tokens, parents), depth), match_len), count), total), source), length) in it {
        rows.push(Row { tokens, parents, depth, match_len, count, total, source, length });
    }
    rows
}

/// The corpus slot and match a row drafts from, `None` for the request's own context.
type CorpusPick = Option<(usize, Match)>;

#[derive(Clone, Copy)]
enum Kind {
    Chain,
    Tree,
}

/// Per-request suffix automata plus a shared corpus; the engine-facing drafter.
///
/// Lifecycle of a request: [`start`](Self::start) (prompt) → any number of [`extend`](Self::extend) (accepted
/// tokens) and proposals → [`finish`](Self::finish) (optionally donating the context to the shared corpus: prompt
/// and response, or the response alone with [`DrafterConfig::donate_prompts`] off; the automaton's memory is
/// released) → [`remove`](Self::remove) (forgets the id). A finished request still answers proposals, with empty
/// rows.
///
/// Draft source: the request's own context, unless a corpus automaton matches a strictly longer suffix of the
/// context (then the corpus, marked `source = 1`). Every call validates all of its arguments before changing
/// anything, so a rejected call leaves every request as it was.
///
/// ```
/// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
/// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
/// d.start(7, &[10, 11, 12, 13, 10, 11]).unwrap();
/// let mut out = DraftBatch::new(1, 4);
/// d.propose(&[7], 4, &mut out.rows()).unwrap();
/// assert_eq!(out.row_tokens(0), &[12, 13, 10, 11]);
/// d.extend(7, &[12]).unwrap();
/// d.finish(7, true).unwrap(); // the response [12] goes to the shared corpus
/// d.remove(7).unwrap();
/// assert_eq!(d.num_requests(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct Drafter {
    cfg: DrafterConfig,
    requests: Map<Request>,
    corpus: Corpus,
}

#[cfg(feature = "parallel")]
const PAR_MIN: usize = 8;

/// Hash of request ids: one multiply-xorshift (ids come from the serving engine, not from an adversary), much
/// cheaper per lookup than the default SipHash on the batched path (a few lookups per request and step).
#[derive(Clone, Copy, Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
}

type Map<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Mutable references to the requests `ids` (distinct, all registered), in the order of `ids`.
///
/// Why not remove and re-insert them (the simple way to hold several `&mut` of one map): that moves every
/// request's record (about 200 bytes) twice per batched call and hashes each id twice; one pass over the map
/// hands out the references in place.
fn batch_mut<'a>(requests: &'a mut Map<Request>, ids: &[u64]) -> Vec<&'a mut Request> {
    let pos: Map<usize> = ids.iter().enumerate().map(|(b, &id)| (id, b)).collect();
    let mut out: Vec<Option<&'a mut Request>> = ids.iter().map(|_| None).collect();
    for (id, r) in requests.iter_mut() {
        if let Some(&b) = pos.get(id) {
            out[b] = Some(r);
        }
    }
    out.into_iter().map(|r| r.expect("ids are registered")).collect()
}

/// Requests per parallel task of a batched call (chains of a chunk are drafted in lockstep, see
/// `chain_draft_group`; extensions of a chunk prefetch for each other).
const CHUNK: usize = 16;

impl Drafter {
    /// A drafter with the given configuration; rejects `max_draft`, `max_nodes` or `min_match` of 0 and a
    /// `vocab_size` outside `[1, 2^31]`.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, DrafterError};
    /// let d = Drafter::new(DrafterConfig::default()).unwrap();
    /// assert_eq!(d.num_requests(), 0);
    /// let bad = Drafter::new(DrafterConfig { max_draft: 0, ..Default::default() });
    /// assert!(matches!(bad, Err(DrafterError::InvalidArgument(_))));
    /// assert!(Drafter::new(DrafterConfig { vocab_size: Some(0), ..Default::default() }).is_err());
    /// ```
    pub fn new(cfg: DrafterConfig) -> Result<Self> {
        if cfg.max_draft == 0 || cfg.max_nodes == 0 || cfg.min_match == 0 {
            return Err(DrafterError::InvalidArgument("max_draft, max_nodes and min_match must be >= 1".into()));
        }
        if cfg.vocab_size == Some(0) || cfg.vocab_size.is_some_and(|v| v > i32::MAX as u32 + 1) {
            return Err(DrafterError::InvalidArgument("vocab_size must be in [1, 2^31]".into()));
        }
        let corpus = Corpus::new(cfg.corpus_cap_tokens);
        Ok(Drafter { cfg, requests: Map::default(), corpus })
    }

    /// The configuration.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let d = Drafter::new(DrafterConfig { max_draft: 4, ..Default::default() }).unwrap();
    /// assert_eq!(d.config().max_draft, 4);
    /// assert_eq!(d.config().max_nodes, DrafterConfig::default().max_nodes);
    /// ```
    pub fn config(&self) -> &DrafterConfig {
        &self.cfg
    }

    /// The shared corpus (read-only).
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, SLOT_ACTIVE};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2]).unwrap();
    /// d.extend(1, &[3]).unwrap();
    /// d.finish(1, true).unwrap();
    /// assert_eq!(d.corpus().slot(SLOT_ACTIVE).unwrap().len(), 4); // 1 2 3 and the separator
    /// ```
    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let limit = self.cfg.vocab_size.unwrap_or(i32::MAX as u32 + 1);
        match tokens.iter().find(|&&t| t >= limit) {
            Some(&t) => Err(DrafterError::TokenOutOfRange { token: t as u64, vocab_size: self.cfg.vocab_size }),
            None => Ok(()),
        }
    }

    /// Registers request `id` with its prompt (may be empty).
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, DrafterError};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 3]).unwrap();
    /// d.start(2, &[]).unwrap(); // an empty prompt is fine
    /// assert_eq!(d.start(1, &[4]), Err(DrafterError::DuplicateRequest(1)));
    /// assert_eq!(d.context_len(1), Ok(3)); // unchanged
    /// ```
    pub fn start(&mut self, id: u64, prompt: &[u32]) -> Result<()> {
        if self.requests.contains_key(&id) {
            return Err(DrafterError::DuplicateRequest(id));
        }
        self.check_tokens(prompt)?;
        let sam = SuffixAutomaton::from_tokens(prompt);
        let mut corpus = [Match::default(); CORPUS_SLOTS];
        if self.cfg.use_corpus {
            for (i, m) in corpus.iter_mut().enumerate() {
                if let Some(c) = self.corpus.slot(i) {
                    *m = rematch(c, prompt);
                }
            }
        }
        self.requests.insert(id, Request { sam, prompt_len: prompt.len(), corpus, finished: false });
        Ok(())
    }

    fn extend_one(corpus: &Corpus, use_corpus: bool, r: &mut Request, tokens: &[u32]) {
        r.sam.extend_from_slice(tokens);
        if use_corpus {
            for (i, m) in r.corpus.iter_mut().enumerate() {
                if let Some(c) = corpus.slot(i) {
                    *m = tokens.iter().fold(*m, |m, &t| c.advance(m, t));
                }
            }
        }
    }

    /// Appends accepted tokens (any number, including none) to request `id`.
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig, DrafterError};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 3, 1]).unwrap();
    /// d.extend(1, &[2]).unwrap();
    /// d.extend(1, &[]).unwrap();
    /// assert_eq!(d.context_len(1), Ok(5));
    /// let mut out = DraftBatch::new(1, 2);
    /// d.propose(&[1], 2, &mut out.rows()).unwrap();
    /// assert_eq!(out.row_tokens(0), &[3, 1]); // after "1 2"
    /// d.finish(1, false).unwrap();
    /// assert_eq!(d.extend(1, &[3]), Err(DrafterError::Finished(1)));
    /// ```
    pub fn extend(&mut self, id: u64, tokens: &[u32]) -> Result<()> {
        self.check_tokens(tokens)?;
        let r = self.requests.get_mut(&id).ok_or(DrafterError::UnknownRequest(id))?;
        if r.finished {
            return Err(DrafterError::Finished(id));
        }
        Self::extend_one(&self.corpus, self.cfg.use_corpus, r, tokens);
        Ok(())
    }

    /// Appends `tokens[offsets[b]..offsets[b + 1]]` to request `ids[b]` for every `b`, in parallel with the
    /// `parallel` feature. `offsets` has `ids.len() + 1` non-decreasing entries ending at `tokens.len()`; ids must
    /// be distinct.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2]).unwrap();
    /// d.start(2, &[5]).unwrap();
    /// d.extend_batch(&[1, 2], &[3, 6, 7], &[0, 1, 3]).unwrap(); // [3] to request 1, [6, 7] to request 2
    /// assert_eq!((d.context_len(1), d.context_len(2)), (Ok(3), Ok(3)));
    /// // A repeated id is rejected, and nothing is appended.
    /// assert!(d.extend_batch(&[1, 1], &[4, 5], &[0, 1, 2]).is_err());
    /// assert_eq!(d.context_len(1), Ok(3));
    /// ```
    pub fn extend_batch(&mut self, ids: &[u64], tokens: &[u32], offsets: &[usize]) -> Result<()> {
        if offsets.len() != ids.len() + 1
            || offsets[0] != 0
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets[ids.len()] != tokens.len()
        {
            return Err(DrafterError::InvalidArgument(
                "offsets must have len(ids) + 1 non-decreasing entries from 0 to len(tokens)".into(),
            ));
        }
        self.check_tokens(tokens)?;
        let mut seen: Map<()> = Map::with_capacity_and_hasher(ids.len(), Default::default());
        for &id in ids {
            let r = self.requests.get(&id).ok_or(DrafterError::UnknownRequest(id))?;
            if r.finished {
                return Err(DrafterError::Finished(id));
            }
            if seen.insert(id, ()).is_some() {
                return Err(DrafterError::InvalidArgument(format!("request id {id} appears twice in one batch")));
            }
        }
        let mut work: Vec<(u64, &mut Request, &[u32])> = batch_mut(&mut self.requests, ids)
            .into_iter()
            .enumerate()
            .map(|(b, r)| (ids[b], r, &tokens[offsets[b]..offsets[b + 1]]))
            .collect();
        let corpus = &self.corpus;
        let use_corpus = self.cfg.use_corpus;
        // In chunks, each request prefetching what the request two places later touches first, so that the
        // cache misses of different requests overlap.
        const AHEAD: usize = 2;
        let job = |chunk: &mut [(u64, &mut Request, &[u32])]| {
            for g in 0..chunk.len() {
                if let Some((_, r, t)) = chunk.get(g + AHEAD) {
                    if let Some(&t0) = t.first() {
                        r.sam.prefetch_push(t0);
                    }
                }
                let (_, r, t) = &mut chunk[g];
                Self::extend_one(corpus, use_corpus, r, t);
            }
        };
        #[cfg(feature = "parallel")]
        if work.len() >= PAR_MIN {
            use rayon::prelude::*;
            work.par_chunks_mut(CHUNK).for_each(job);
        } else {
            work.chunks_mut(CHUNK).for_each(job);
        }
        #[cfg(not(feature = "parallel"))]
        work.chunks_mut(CHUNK).for_each(job);
        Ok(())
    }

    fn apply_corpus_change(&mut self, change: CorpusChange) {
        for r in self.requests.values_mut() {
            if r.finished {
                continue;
            }
            if change.rotated {
                r.corpus[SLOT_OLD] = r.corpus[SLOT_ACTIVE];
                r.corpus[SLOT_ACTIVE] = Match::default();
            }
            for i in 0..CORPUS_SLOTS {
                if change.grown[i] {
                    if let Some(c) = self.corpus.slot(i) {
                        r.corpus[i] = rematch(c, r.sam.tokens());
                    }
                }
            }
        }
    }

    /// Adds a document to the static external corpus (outside the cap, never evicted). Validated, then ignored when
    /// [`DrafterConfig::use_corpus`] is off or the document is empty.
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig, Source};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.add_corpus(&[10, 11, 12, 13]).unwrap();
    /// d.start(1, &[9, 10, 11]).unwrap();
    /// let mut out = DraftBatch::new(1, 3);
    /// d.propose(&[1], 3, &mut out.rows()).unwrap();
    /// assert_eq!(out.row_tokens(0), &[12, 13]); // stops at the end of the document
    /// assert_eq!(out.source[0], Source::Corpus as i8);
    /// ```
    pub fn add_corpus(&mut self, tokens: &[u32]) -> Result<()> {
        self.check_tokens(tokens)?;
        if !self.cfg.use_corpus || tokens.is_empty() {
            return Ok(());
        }
        let change = self.corpus.add_static(tokens);
        self.apply_corpus_change(change);
        Ok(())
    }

    /// Finishes request `id`: optionally donates to the shared corpus its response (tokens after the prompt), or
    /// with [`DrafterConfig::donate_prompts`] its whole context (prompt + response, one document), then releases
    /// its automaton. The id stays registered (proposals give empty rows) until `remove`.
    ///
    /// Own-prompt guard: the donation happens only here, after the request stopped matching the corpus (a finished
    /// request holds no corpus match and drafts nothing), so no request ever drafts from its own donated text, and
    /// the `Source` and counts of its drafts describe its own context and *other* requests' text only.
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig, Source};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap(); // donate_prompts: true
    /// d.start(1, &[10, 11, 12, 13]).unwrap(); // the prompt
    /// d.extend(1, &[14]).unwrap(); // the response
    /// d.finish(1, true).unwrap();
    /// assert_eq!(d.corpus().donated_tokens(), 6); // prompt + response + separator
    /// d.start(2, &[7, 10, 11]).unwrap(); // another request quoting the first prompt
    /// let mut out = DraftBatch::new(1, 3);
    /// d.propose(&[2], 3, &mut out.rows()).unwrap();
    /// assert_eq!(out.row_tokens(0), &[12, 13, 14]); // copied across the prompt/response boundary
    /// assert_eq!(out.source[0], Source::Corpus as i8);
    /// ```
    pub fn finish(&mut self, id: u64, donate: bool) -> Result<()> {
        let r = self.requests.get_mut(&id).ok_or(DrafterError::UnknownRequest(id))?;
        if r.finished {
            return Err(DrafterError::Finished(id));
        }
        let sam = std::mem::take(&mut r.sam);
        r.finished = true;
        r.corpus = [Match::default(); CORPUS_SLOTS];
        if donate && self.cfg.use_corpus {
            let from = if self.cfg.donate_prompts { 0 } else { r.prompt_len };
            let change = self.corpus.donate(&sam.tokens()[from..]);
            drop(sam);
            self.apply_corpus_change(change);
        }
        Ok(())
    }

    /// Forgets request `id` (finished or not) and frees everything it held.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, DrafterError};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1]).unwrap();
    /// d.remove(1).unwrap(); // finishing first is optional
    /// assert!(!d.contains(1));
    /// assert_eq!(d.remove(1), Err(DrafterError::UnknownRequest(1)));
    /// d.start(1, &[2]).unwrap(); // the id can be used again
    /// ```
    pub fn remove(&mut self, id: u64) -> Result<()> {
        self.requests.remove(&id).map(|_| ()).ok_or(DrafterError::UnknownRequest(id))
    }

    /// True when `id` is registered (started and not removed).
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1]).unwrap();
    /// d.finish(1, false).unwrap();
    /// assert!(d.contains(1)); // finished but not removed
    /// d.remove(1).unwrap();
    /// assert!(!d.contains(1));
    /// ```
    pub fn contains(&self, id: u64) -> bool {
        self.requests.contains_key(&id)
    }

    /// Registered requests (finished ones included until removed).
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[]).unwrap();
    /// d.start(2, &[]).unwrap();
    /// d.finish(2, false).unwrap();
    /// assert_eq!(d.num_requests(), 2); // finished requests count until removed
    /// d.remove(2).unwrap();
    /// assert_eq!(d.num_requests(), 1);
    /// ```
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Context length (prompt + accepted tokens) of request `id`; 0 once finished.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, DrafterError};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 3]).unwrap();
    /// d.extend(1, &[4]).unwrap();
    /// assert_eq!(d.context_len(1), Ok(4));
    /// d.finish(1, false).unwrap();
    /// assert_eq!(d.context_len(1), Ok(0)); // the automaton was released
    /// assert_eq!(d.context_len(9), Err(DrafterError::UnknownRequest(9)));
    /// ```
    pub fn context_len(&self, id: u64) -> Result<usize> {
        self.requests.get(&id).map(|r| r.sam.len()).ok_or(DrafterError::UnknownRequest(id))
    }

    /// Heap bytes held by request `id`'s automaton.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig, SuffixAutomaton};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &(0..1000).collect::<Vec<u32>>()).unwrap();
    /// assert!(d.request_memory_bytes(1).unwrap() > 1000 * 4);
    /// d.finish(1, false).unwrap(); // releases the automaton: an empty one remains
    /// assert_eq!(d.request_memory_bytes(1), Ok(SuffixAutomaton::new().memory_bytes()));
    /// ```
    pub fn request_memory_bytes(&self, id: u64) -> Result<usize> {
        self.requests.get(&id).map(|r| r.sam.memory_bytes()).ok_or(DrafterError::UnknownRequest(id))
    }

    /// Heap bytes held by all requests and the corpus (approximate for the hash map of requests).
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// let empty = d.memory_bytes();
    /// d.start(1, &(0..1000).collect::<Vec<u32>>()).unwrap();
    /// assert!(d.memory_bytes() >= empty + d.request_memory_bytes(1).unwrap());
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.requests.values().map(|r| r.sam.memory_bytes()).sum::<usize>()
            + self.requests.capacity() * std::mem::size_of::<(u64, Request)>()
            + self.corpus.memory_bytes()
    }

    /// Chain drafts of `k` tokens (`1 <= k <= max_draft`) for each of `ids` (repeats allowed) into `out`
    /// (`width == k`, slices of `ids.len() * k` and `ids.len()`).
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig { max_draft: 4, ..Default::default() }).unwrap();
    /// d.start(1, &[1, 2, 3, 1, 2]).unwrap();
    /// d.start(2, &[5, 6]).unwrap();
    /// let mut out = DraftBatch::new(3, 2);
    /// d.propose(&[1, 2, 1], 2, &mut out.rows()).unwrap(); // repeated ids are allowed
    /// assert_eq!(out.row_tokens(0), &[3, 1]);
    /// assert!(out.row_tokens(1).is_empty()); // "6" never occurred before
    /// assert_eq!(out.row_tokens(2), out.row_tokens(0));
    /// assert!(d.propose(&[1], 5, &mut DraftBatch::new(1, 5).rows()).is_err()); // k > max_draft
    /// ```
    pub fn propose(&mut self, ids: &[u64], k: usize, out: &mut DraftRows<'_>) -> Result<()> {
        if k == 0 || k > self.cfg.max_draft {
            return Err(DrafterError::InvalidArgument(format!(
                "k = {k} out of range [1, max_draft = {}]",
                self.cfg.max_draft
            )));
        }
        self.propose_impl(ids, k, Kind::Chain, out)
    }

    /// Tree drafts of up to `n_nodes` nodes (`1 <= n_nodes <= max_nodes`) for each of `ids` into `out`.
    ///
    /// ```
    /// use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
    /// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    /// d.start(1, &[1, 2, 3, 1, 2, 4, 1, 2]).unwrap(); // "1 2" was followed by 3 and by 4
    /// let mut out = DraftBatch::new(1, 4);
    /// d.propose_tree(&[1], 4, &mut out.rows()).unwrap();
    /// let n = out.lengths[0] as usize;
    /// // Both continuations are children of the root (-1), the most recent one first.
    /// assert_eq!((out.tokens[0], out.parents[0]), (4, -1));
    /// assert!((1..n).any(|i| out.tokens[i] == 3 && out.parents[i] == -1));
    /// assert!((0..n).all(|i| out.parents[i] < i as i32 && out.depth[i] >= 1));
    /// ```
    pub fn propose_tree(&mut self, ids: &[u64], n_nodes: usize, out: &mut DraftRows<'_>) -> Result<()> {
        if n_nodes == 0 || n_nodes > self.cfg.max_nodes {
            return Err(DrafterError::InvalidArgument(format!(
                "n_nodes = {n_nodes} out of range [1, max_nodes = {}]",
                self.cfg.max_nodes
            )));
        }
        self.propose_impl(ids, n_nodes, Kind::Tree, out)
    }

    fn tree_params(&self) -> TreeParams {
        TreeParams { max_backoff: self.cfg.max_backoff, min_match: self.cfg.min_match, scan_limit: self.cfg.scan_limit }
    }

    /// Best corpus slot for a request: (slot, match) with the longest match, ties to the newer slot.
    fn best_corpus(cfg: &DrafterConfig, corpus: &Corpus, r: &Request) -> Option<(usize, Match)> {
        if !cfg.use_corpus {
            return None;
        }
        let mut best: Option<(usize, Match)> = None;
        for i in 0..CORPUS_SLOTS {
            if corpus.slot(i).is_some() && best.map_or(true, |(_, b)| r.corpus[i].len >= b.len) {
                best = Some((i, r.corpus[i]));
            }
        }
        best
    }

    fn propose_impl(&mut self, ids: &[u64], width: usize, kind: Kind, out: &mut DraftRows<'_>) -> Result<()> {
        let b = ids.len();
        if out.width != width
            || out.lengths.len() != b
            || [&*out.tokens, &*out.parents, &*out.depth, &*out.match_len, &*out.count, &*out.total]
                .iter()
                .any(|s| s.len() != b * width)
            || out.source.len() != b * width
        {
            return Err(DrafterError::InvalidArgument(format!(
                "output buffers must be [{b} * {width}] and lengths [{b}]"
            )));
        }
        if let Some(&id) = ids.iter().find(|id| !self.requests.contains_key(id)) {
            return Err(DrafterError::UnknownRequest(id));
        }
        // First row of each distinct id does the work; repeats copy it.
        let mut first: Map<usize> = Map::with_capacity_and_hasher(b, Default::default());
        let mut dups = Vec::new();
        let mut distinct = Vec::with_capacity(b);
        let mut distinct_rows = Vec::with_capacity(b);
        for (row, &id) in ids.iter().enumerate() {
            match first.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => dups.push((row, *e.get())),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(row);
                    distinct.push(id);
                    distinct_rows.push(row);
                }
            }
        }
        let params = self.tree_params();
        let min_match = self.cfg.min_match;
        let (cfg, corpus_ref) = (&self.cfg, &mut self.corpus);
        {
            let mut rows: Vec<Option<Row<'_>>> = split_rows(out, b).into_iter().map(Some).collect();
            let mut jobs: Vec<(&mut Request, CorpusPick, Row<'_>)> = batch_mut(&mut self.requests, &distinct)
                .into_iter()
                .zip(&distinct_rows)
                .map(|(r, &row)| {
                    let own = r.sam.longest_repeated_suffix();
                    let corpus = Self::best_corpus(cfg, corpus_ref, r)
                        .filter(|(_, m)| !r.finished && m.len > own.len && m.len >= cfg.min_match);
                    (r, corpus, rows[row].take().expect("distinct rows"))
                })
                .collect();
            // Own-context rows, in chunks: chains of one chunk are drafted in lockstep (`chain_draft_group`).
            let job = |chunk: &mut [(&mut Request, CorpusPick, Row<'_>)]| {
                let mut bufs: Vec<Vec<DraftToken>> = chunk.iter().map(|_| Vec::with_capacity(width)).collect();
                let mut chains = Vec::with_capacity(chunk.len());
                for ((r, corpus, _), buf) in chunk.iter_mut().zip(bufs.iter_mut()) {
                    if corpus.is_some() || r.finished {
                        continue; // corpus rows are drafted below; finished rows stay empty
                    }
                    let m = r.sam.longest_repeated_suffix();
                    if m.len >= min_match && m.len > 0 {
                        match kind {
                            Kind::Chain => chains.push((&mut r.sam, m, buf)),
                            Kind::Tree => tree_draft(&mut r.sam, m, width, &params, Source::Context, buf),
                        }
                    }
                }
                chain_draft_group(&mut chains, width, Source::Context);
                drop(chains);
                for ((_, corpus, row), buf) in chunk.iter_mut().zip(&bufs) {
                    if corpus.is_none() {
                        row.write(buf);
                    }
                }
            };
            #[cfg(feature = "parallel")]
            if jobs.len() >= PAR_MIN {
                use rayon::prelude::*;
                jobs.par_chunks_mut(CHUNK).for_each(job);
            } else {
                jobs.chunks_mut(CHUNK).for_each(job);
            }
            #[cfg(not(feature = "parallel"))]
            jobs.chunks_mut(CHUNK).for_each(job);
            // Corpus rows run sequentially: the corpus automata are shared and their queries splay.
            let mut buf = Vec::with_capacity(width);
            for (_, corpus, row) in jobs.iter_mut() {
                if let Some((slot, m)) = *corpus {
                    buf.clear();
                    let sam = corpus_ref.slot_mut(slot).expect("best_corpus checked the slot");
                    match kind {
                        Kind::Chain => chain_draft(sam, m, width, Source::Corpus, &mut buf),
                        Kind::Tree => tree_draft(sam, m, width, &params, Source::Corpus, &mut buf),
                    }
                    row.write(&buf);
                }
            }
        }
        for (row, src) in dups {
            let w = width;
            out.tokens.copy_within(src * w..(src + 1) * w, row * w);
            out.parents.copy_within(src * w..(src + 1) * w, row * w);
            out.depth.copy_within(src * w..(src + 1) * w, row * w);
            out.match_len.copy_within(src * w..(src + 1) * w, row * w);
            out.count.copy_within(src * w..(src + 1) * w, row * w);
            out.total.copy_within(src * w..(src + 1) * w, row * w);
            out.source.copy_within(src * w..(src + 1) * w, row * w);
            out.lengths[row] = out.lengths[src];
        }
        Ok(())
    }
}
