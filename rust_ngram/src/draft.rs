//! Chain and tree drafts over one automaton, each token carrying the features a calibrator needs.

use crate::automaton::{Match, SuffixAutomaton, SEPARATOR};

/// Where a draft token was copied from (the `source` column of [`DraftRows`](crate::DraftRows): `0` or `1`).
///
/// ```
/// use rust_ngram::{DraftBatch, Drafter, DrafterConfig, Source};
/// assert_eq!((Source::Context as i8, Source::Corpus as i8), (0, 1)); // the values in `DraftRows::source`
/// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
/// d.start(1, &[1, 2, 1]).unwrap();
/// let mut out = DraftBatch::new(1, 1);
/// d.propose(&[1], 1, &mut out.rows()).unwrap();
/// assert_eq!(out.source[0], Source::Context as i8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum Source {
    /// The request's own context (prompt + accepted tokens).
    Context = 0,
    /// The shared corpus (donated responses and the static corpus).
    Corpus = 1,
}

/// One drafted token with its features, exactly the per-token columns of [`DraftRows`](crate::DraftRows).
///
/// Invariants: `1 <= count <= total`; `depth >= 1`; `parent < own index` (topological order, `-1` = child of the
/// last committed token); `match_len >= 1` for the drafts of a [`Drafter`](crate::Drafter) (a [`chain_draft`]
/// called directly from the empty match gives `match_len == 0`).
///
/// ```
/// use rust_ngram::{chain_draft, DraftToken, Source, SuffixAutomaton};
/// let mut sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 1, 2]);
/// let m = sam.longest_repeated_suffix(); // "1 2", followed once (by 3)
/// let mut out = Vec::new();
/// chain_draft(&mut sam, m, 1, Source::Context, &mut out);
/// let d = DraftToken { token: 3, parent: -1, depth: 1, match_len: 2, count: 1, total: 1, source: Source::Context };
/// assert_eq!(out, [d]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftToken {
    /// The drafted token id.
    pub token: u32,
    /// Index of the parent node in the same draft, `-1` for the root's children. Chains: `index - 1`.
    pub parent: i32,
    /// 1-based depth below the last committed token.
    pub depth: u32,
    /// Length of the context suffix matched when this token was drafted.
    pub match_len: u32,
    /// Occurrences of this token after the matched context.
    pub count: u32,
    /// Occurrences of the matched context that have any continuation.
    pub total: u32,
    /// Which automaton the token was copied from.
    pub source: Source,
}

/// Appends to `out` a chain of up to `k` tokens that copies, step by step, the token after the **most recent**
/// followed occurrence of the matched string, extending the match by each drafted token.
///
/// When the matched string has no followed occurrence (the copy reached the end of the text), it first falls back
/// to its longest suffix that has one, and the copy goes on from there: the drafted tokens count as text, so a copy
/// of the text's own tail continues as the loop it is instead of stopping after one period. A chain that starts
/// from [`SuffixAutomaton::longest_repeated_suffix`] never falls back below that match's length (the extended
/// string still ends with it). Stops early when no non-empty suffix has a followed occurrence or the next token is
/// [`SEPARATOR`] (end of a corpus document). With `m` the match of the text's own end (`longest_repeated_suffix`)
/// this is the classic "copy after the latest earlier occurrence of the longest repeated suffix", continued over
/// its own output.
///
/// ```
/// use rust_ngram::{chain_draft, Source, SuffixAutomaton};
/// let mut sam = SuffixAutomaton::from_tokens(&[5, 6, 7, 8, 5, 6, 9, 5, 6]);
/// let m = sam.longest_repeated_suffix();
/// let mut out = Vec::new();
/// chain_draft(&mut sam, m, 3, Source::Context, &mut out);
/// // "5 6" last occurred at positions 4..=5, followed by 9, then "5 6" (copy continues from there).
/// let toks: Vec<u32> = out.iter().map(|d| d.token).collect();
/// assert_eq!(toks, vec![9, 5, 6]);
/// assert_eq!((out[0].match_len, out[0].count, out[0].total), (2, 1, 2));
///
/// // A loop: "1 2 3" repeats; the copy of the tail reaches the end after 3 tokens and continues with the loop.
/// let mut sam = SuffixAutomaton::from_tokens(&[7, 1, 2, 3, 1, 2, 3]);
/// let m = sam.longest_repeated_suffix();
/// out.clear();
/// chain_draft(&mut sam, m, 7, Source::Context, &mut out);
/// let toks: Vec<u32> = out.iter().map(|d| d.token).collect();
/// assert_eq!(toks, vec![1, 2, 3, 1, 2, 3, 1]);
/// let lens: Vec<u32> = out.iter().map(|d| d.match_len).collect();
/// assert_eq!(lens, vec![3, 4, 5, 3, 4, 5, 3]); // "1 2 3 1 2 3" occurs only at the end: back to "1 2 3"
/// ```
pub fn chain_draft(sam: &mut SuffixAutomaton, m: Match, k: usize, source: Source, out: &mut Vec<DraftToken>) {
    let mut c = ChainCursor::new(sam, m);
    while c.read_run(sam, k) {
        for i in 0..c.got {
            c.step(sam, i);
        }
        c.emit(sam, source, out);
    }
}

/// [`chain_draft`] for several automata at once, in lockstep: the same drafts as one call per automaton, but the
/// transition lookups (random reads of large hash tables, one dependent cache miss per drafted token) of different
/// automata are independent of each other and overlap in the CPU instead of waiting one after another.
/// `jobs[g]` = (automaton, match, output buffer).
pub(crate) fn chain_draft_group(
    jobs: &mut [(&mut SuffixAutomaton, Match, &mut Vec<DraftToken>)],
    k: usize,
    source: Source,
) {
    const G: usize = 16;
    for chunk in jobs.chunks_mut(G) {
        let mut cur: Vec<ChainCursor> = chunk.iter_mut().map(|(sam, m, _)| ChainCursor::new(sam, *m)).collect();
        loop {
            let mut longest = 0;
            for (c, (sam, _, _)) in cur.iter_mut().zip(chunk.iter_mut()) {
                if c.read_run(sam, k) {
                    longest = longest.max(c.got);
                }
            }
            if longest == 0 {
                break;
            }
            for i in 0..longest {
                for (c, (sam, _, _)) in cur.iter_mut().zip(chunk.iter()) {
                    if i < c.got {
                        c.step(sam, i);
                    }
                }
            }
            for (c, (sam, _, out)) in cur.iter_mut().zip(chunk.iter_mut()) {
                if c.got > 0 {
                    c.emit(sam, source, out);
                }
            }
        }
    }
}

/// Longest run of [`chain_draft`] drafted between two dependent statistics queries.
const RUN: usize = 16;

/// State of one chain being drafted, run by run.
///
/// Why in runs: if the most recent followed occurrence of the matched string ends at `e`, that of the string
/// extended by `T[e + 1]` ends at `e + 1` as long as `e + 1 < n - 1` (nothing later can end there). So a run of
/// tokens is a plain copy of `T[e + 1..]`, its states follow by transitions alone, and the statistics queries of
/// the run (for `count` and `total`) no longer sit on the dependency chain: they are independent reads that an
/// out-of-order CPU overlaps, instead of one cache miss after another. The result is exactly that of the
/// step-by-step definition; only a run that reaches the end of the text falls back to a fresh statistics query
/// (the next run starts from the next state's own most recent occurrence, or, when it has none, from that of its
/// nearest suffix-link ancestor that has one).
struct ChainCursor {
    state: u32,
    len: u32,
    st: crate::automaton::StateStats,
    drafted: usize,
    done: bool,
    /// Tokens of the current run (read by `read_run`), their states (filled by `step`).
    got: usize,
    sep: bool,
    walk: u32,
    toks: [u32; RUN],
    states: [u32; RUN],
}

impl ChainCursor {
    fn new(sam: &mut SuffixAutomaton, m: Match) -> Self {
        ChainCursor {
            state: m.state,
            len: m.len,
            st: sam.stats(m.state),
            drafted: 0,
            done: false,
            got: 0,
            sep: false,
            walk: m.state,
            toks: [0; RUN],
            states: [0; RUN],
        }
    }

    /// Reads the tokens of the next run; false (and `got == 0`) when the chain is complete.
    fn read_run(&mut self, sam: &mut SuffixAutomaton, k: usize) -> bool {
        self.got = 0;
        if self.done || self.drafted >= k {
            return false;
        }
        // A pattern without a followed occurrence (the copy reached the end of the text) falls back to its
        // longest suffix that has one: the drafted tokens count as context, so a copy of the text's own tail
        // continues as the loop it is. No suffix at all (the root): the chain is complete.
        let e = loop {
            if let Some(e) = self.st.last_end {
                break e;
            }
            match sam.suffix_link(self.state).filter(|&l| sam.state_len(l) > 0) {
                Some(l) => {
                    self.state = l;
                    self.len = sam.state_len(l);
                    self.st = sam.stats(l);
                }
                None => {
                    self.done = true;
                    return false;
                }
            }
        };
        // Tokens e + 1 ..= e + r are copied; each but the first needs its state to end at e + i < n - 1.
        let r = (k - self.drafted).min(sam.len() - 1 - e).min(RUN);
        for (i, &tok) in sam.tokens()[e + 1..e + 1 + r].iter().enumerate() {
            if tok == SEPARATOR {
                self.sep = true;
                break;
            }
            self.toks[i] = tok;
            self.got = i + 1;
        }
        self.walk = self.state;
        if self.got == 0 {
            self.done = true;
        }
        self.got > 0
    }

    /// The state after token `i` of the run (call for `i = 0, 1, ..` in order).
    #[inline]
    fn step(&mut self, sam: &SuffixAutomaton, i: usize) {
        self.walk = sam.transition(self.walk, self.toks[i]).expect("a followed occurrence implies the transition");
        self.states[i] = self.walk;
    }

    /// Statistics of the run's states, and its draft tokens appended to `out`.
    fn emit(&mut self, sam: &mut SuffixAutomaton, source: Source, out: &mut Vec<DraftToken>) {
        let mut prev = self.st;
        for i in 0..self.got {
            let next_st = sam.stats(self.states[i]);
            let j = (self.drafted + i) as u32;
            out.push(DraftToken {
                token: self.toks[i],
                parent: j as i32 - 1,
                depth: j + 1,
                match_len: self.len + i as u32,
                count: next_st.occurrences + sam.end_correction(&prev, self.toks[i]),
                total: prev.occurrences,
                source,
            });
            prev = next_st;
        }
        self.drafted += self.got;
        self.state = self.states[self.got - 1];
        self.len += self.got as u32;
        self.st = prev;
        self.done |= self.sep;
    }
}

/// Tuning of [`tree_draft`].
///
/// ```
/// use rust_ngram::{tree_draft, DraftToken, Source, SuffixAutomaton, TreeParams};
/// // "1 2" was followed by 3 only; its suffix "2" also by 4.
/// let mut sam = SuffixAutomaton::from_tokens(&[5, 1, 2, 3, 9, 2, 4, 1, 2]);
/// let m = sam.longest_repeated_suffix();
/// let mut tree = |max_backoff| {
///     let mut out = Vec::new();
///     tree_draft(&mut sam, m, 4, &TreeParams { max_backoff, ..Default::default() }, Source::Context, &mut out);
///     out
/// };
/// let roots = |t: Vec<DraftToken>| t.iter().filter(|d| d.parent == -1).map(|d| d.token).collect::<Vec<u32>>();
/// assert_eq!(roots(tree(0)), [3]); // only "1 2" is consulted
/// assert_eq!(roots(tree(1)), [3, 4]); // one suffix link down: "2"
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeParams {
    /// Shorter contexts (suffix links) consulted per node besides its own match; gives prose alternatives.
    pub max_backoff: usize,
    /// Contexts shorter than this (and the empty context) are not consulted.
    pub min_match: u32,
    /// Out-transitions examined per context (newest first); the most recent continuation is always examined.
    pub scan_limit: usize,
}

impl Default for TreeParams {
    /// The tree settings of [`DrafterConfig::default`](crate::DrafterConfig::default), their one owner.
    fn default() -> Self {
        let crate::DrafterConfig { max_backoff, min_match, scan_limit, .. } = crate::DrafterConfig::default();
        TreeParams { max_backoff, min_match, scan_limit }
    }
}

struct Cand {
    p: f64,
    seq: u32,
    parent: i32,
    depth: u32,
    tok: DraftToken,
    child: Match,
}

impl PartialEq for Cand {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Max-heap on probability; ties go to the earlier candidate (deterministic output).
        self.p.total_cmp(&o.p).then(o.seq.cmp(&self.seq))
    }
}

/// Candidate continuations of a node: Witten-Bell style interpolation from its own match down `max_backoff`
/// suffix links. Returns `(token, conditional probability, features, child match)`.
fn expand(sam: &mut SuffixAutomaton, m: Match, params: &TreeParams, out: &mut Vec<(u32, f64, DraftToken, Match)>) {
    out.clear();
    let mut escape = 1.0f64;
    let mut ctx = Some(m);
    let mut level = 0;
    let mut local: Vec<(u32, u32)> = Vec::with_capacity(params.scan_limit + 1);
    while let Some(c) = ctx {
        if c.len < params.min_match.max(1) || level > params.max_backoff {
            break;
        }
        let st = sam.stats(c.state);
        if let Some(e) = st.last_end {
            let recent = sam.tokens()[e + 1];
            local.clear();
            let scanned: Vec<u32> = sam.transitions(c.state).take(params.scan_limit).map(|(t, _)| t).collect();
            for t in scanned.into_iter().chain((recent != SEPARATOR).then_some(recent)) {
                if t == SEPARATOR || local.iter().any(|&(u, _)| u == t) {
                    continue;
                }
                let Some(next) = sam.transition(c.state, t) else { continue };
                let cnt = sam.stats(next).occurrences + sam.end_correction(&st, t);
                if cnt > 0 {
                    local.push((t, cnt));
                }
            }
            let d = local.len() as f64;
            let denom = st.occurrences as f64 + 1.0 + d;
            // Short contexts predict worse whatever their counts (on ShareGPT prose a once-seen context continues
            // correctly ~27% of the time at length 1, ~70% at length >= 4): trust a context by len / (len + 1) and
            // pass the rest of the mass to the shorter contexts.
            let trust = c.len as f64 / (c.len as f64 + 1.0);
            for &(t, cnt) in &local {
                // The most recent continuation gets one pseudo-count: recency predicts the next copy best.
                let q = escape * trust * (cnt as f64 + (t == recent) as u8 as f64) / denom;
                if let Some(slot) = out.iter_mut().find(|x| x.0 == t) {
                    slot.1 += q;
                } else {
                    let child =
                        Match { state: sam.transition(c.state, t).expect("counted continuation"), len: c.len + 1 };
                    let tok = DraftToken {
                        token: t,
                        parent: -1,
                        depth: 0,
                        match_len: c.len,
                        count: cnt,
                        total: st.occurrences,
                        source: Source::Context,
                    };
                    out.push((t, q, tok, child));
                }
            }
            escape *= 1.0 - trust * (1.0 - d / denom);
        }
        level += 1;
        ctx = sam.suffix_link(c.state).map(|l| Match { state: l, len: sam.state_len(l) });
    }
}

/// Appends to `out` a token tree of up to `n_nodes` nodes, grown best-first by estimated path probability.
///
/// Each node's conditional probability interpolates the continuation counts of its matched context with those of
/// up to `max_backoff` shorter contexts (suffix links), so that prose, where long matches are rare, still gets
/// alternatives. Siblings are distinct tokens; nodes are in topological order (`parent < index`). The features of
/// a node are those of the longest context in which its token was seen.
///
/// ```
/// use rust_ngram::{tree_draft, Source, SuffixAutomaton, TreeParams};
/// let mut sam = SuffixAutomaton::from_tokens(&[1, 2, 1, 3, 1, 2, 1]);
/// let m = sam.longest_repeated_suffix();
/// let mut out = Vec::new();
/// tree_draft(&mut sam, m, 4, &TreeParams::default(), Source::Context, &mut out);
/// assert!(!out.is_empty() && out.len() <= 4);
/// assert!(out.iter().enumerate().all(|(i, d)| d.parent < i as i32));
/// ```
pub fn tree_draft(
    sam: &mut SuffixAutomaton,
    m: Match,
    n_nodes: usize,
    params: &TreeParams,
    source: Source,
    out: &mut Vec<DraftToken>,
) {
    if n_nodes == 0 || m.len < params.min_match.max(1) {
        return;
    }
    let start = out.len();
    let mut heap = std::collections::BinaryHeap::new();
    let mut seq = 0u32;
    let mut cands = Vec::new();
    let mut push_children = |sam: &mut SuffixAutomaton,
                             heap: &mut std::collections::BinaryHeap<Cand>,
                             m: Match,
                             parent: i32,
                             depth: u32,
                             p: f64| {
        expand(sam, m, params, &mut cands);
        for &(_, q, tok, child) in cands.iter() {
            heap.push(Cand { p: p * q, seq, parent, depth: depth + 1, tok, child });
            seq += 1;
        }
    };
    push_children(sam, &mut heap, m, -1, 0, 1.0);
    while out.len() - start < n_nodes {
        let Some(c) = heap.pop() else { break };
        let idx = (out.len() - start) as i32;
        let mut tok = c.tok;
        tok.parent = c.parent;
        tok.depth = c.depth;
        tok.source = source;
        out.push(tok);
        if out.len() - start < n_nodes {
            push_children(sam, &mut heap, c.child, idx, c.depth, c.p);
        }
    }
}
