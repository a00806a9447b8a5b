//! API-sequence checker: runs a sequence of [`Drafter`] calls and a brute-force model side by side.
//!
//! Used by the proptest suite (stable toolchain, every `cargo test`) and by the cargo-fuzz target
//! (`rust_ngram/fuzz`). Both feed bytes through [`ops_from_bytes`], so a fuzzer finding reproduces as a unit test.
//! The model keeps plain token vectors and recomputes everything with [`reference`](crate::reference):
//! lifecycle errors, corpus generations, draft sources, chain drafts token by token with all features, and for
//! trees every node's features and structure.

use std::collections::HashMap;

use crate::automaton::SEPARATOR;
use crate::draft::Source;
use crate::drafter::{DraftBatch, Drafter, DrafterConfig, DrafterError};
use crate::reference as rf;

/// One API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `start(id, prompt)`.
    Start(u64, Vec<u32>),
    /// `extend(id, tokens)`.
    Extend(u64, Vec<u32>),
    /// `extend_batch` with one token slice per id.
    ExtendBatch(Vec<(u64, Vec<u32>)>),
    /// `propose(ids, k)`.
    Propose(Vec<u64>, usize),
    /// `propose_tree(ids, n_nodes)`.
    ProposeTree(Vec<u64>, usize),
    /// `finish(id, donate)`.
    Finish(u64, bool),
    /// `remove(id)`.
    Remove(u64),
    /// `add_corpus(tokens)`.
    AddCorpus(Vec<u32>),
}

/// Configuration used by the checker: tiny vocabulary (many repeats), a tiny corpus cap (many rotations).
pub fn check_config() -> DrafterConfig {
    DrafterConfig {
        max_draft: 6,
        max_nodes: 8,
        min_match: 1,
        max_backoff: 2,
        scan_limit: 8,
        use_corpus: true,
        corpus_cap_tokens: 48,
        donate_prompts: true,
        vocab_size: Some(5),
    }
}

/// Decodes arbitrary bytes into a call sequence (ids 0..4, tokens 0..6 so that some are out of range).
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut it = data.iter().copied();
    let mut ops = Vec::new();
    let toks = |it: &mut dyn Iterator<Item = u8>, max: u8| -> Vec<u32> {
        let n = it.next().unwrap_or(0) % max;
        (0..n).map(|_| (it.next().unwrap_or(0) % 6) as u32).collect()
    };
    while let Some(b) = it.next() {
        let id = ((b >> 4) % 4) as u64;
        let op = match b % 9 {
            0 => Op::Start(id, toks(&mut it, 24)),
            1 | 2 => Op::Extend(id, toks(&mut it, 6)),
            3 => {
                let n = it.next().unwrap_or(0) % 4;
                Op::ExtendBatch((0..n).map(|i| ((id + i as u64) % 4, toks(&mut it, 4))).collect())
            }
            4 => {
                let n = it.next().unwrap_or(0) % 4 + 1;
                let ids = (0..n).map(|_| (it.next().unwrap_or(0) % 4) as u64).collect();
                Op::Propose(ids, (it.next().unwrap_or(0) % 8) as usize)
            }
            5 => {
                let n = it.next().unwrap_or(0) % 3 + 1;
                let ids = (0..n).map(|_| (it.next().unwrap_or(0) % 4) as u64).collect();
                Op::ProposeTree(ids, (it.next().unwrap_or(0) % 10) as usize)
            }
            6 => Op::Finish(id, b & 0x80 != 0),
            7 => Op::Remove(id),
            _ => Op::AddCorpus(toks(&mut it, 10)),
        };
        ops.push(op);
    }
    ops
}

#[derive(Clone, Debug)]
struct ModelReq {
    ctx: Vec<u32>,
    prompt_len: usize,
    finished: bool,
}

/// The brute-force model of a [`Drafter`].
#[derive(Clone, Debug)]
struct Model {
    cfg: DrafterConfig,
    reqs: HashMap<u64, ModelReq>,
    /// Corpus texts per slot (static, old, active), documents followed by SEPARATOR.
    slots: [Option<Vec<u32>>; 3],
}

impl Model {
    fn tokens_ok(&self, t: &[u32]) -> Result<(), DrafterError> {
        let v = self.cfg.vocab_size.unwrap_or(i32::MAX as u32 + 1);
        match t.iter().find(|&&x| x >= v) {
            Some(&x) => Err(DrafterError::TokenOutOfRange { token: x as u64, vocab_size: self.cfg.vocab_size }),
            None => Ok(()),
        }
    }

    fn donate(&mut self, doc: &[u32]) {
        let half = self.cfg.corpus_cap_tokens / 2;
        if half == 0 || doc.is_empty() {
            return;
        }
        let doc = &doc[doc.len().saturating_sub(half)..];
        let active_len = self.slots[2].as_ref().map_or(0, |s| s.len());
        if active_len > 0 && active_len + doc.len() + 1 > half {
            self.slots[1] = self.slots[2].take();
        }
        let a = self.slots[2].get_or_insert_with(Vec::new);
        a.extend_from_slice(doc);
        a.push(SEPARATOR);
    }

    /// (source text, pattern length, source) a request drafts from, or None.
    fn source<'a>(&'a self, r: &'a ModelReq) -> Option<(&'a [u32], usize, Source)> {
        if r.finished {
            return None;
        }
        let own = rf::longest_repeated_suffix(&r.ctx);
        let mut best: Option<(usize, usize)> = None;
        if self.cfg.use_corpus {
            for (i, s) in self.slots.iter().enumerate() {
                if let Some(text) = s {
                    let l = rf::longest_suffix_in(text, &r.ctx);
                    if best.map_or(true, |(_, b)| l >= b) {
                        best = Some((i, l));
                    }
                }
            }
        }
        let min = self.cfg.min_match as usize;
        match best {
            Some((i, l)) if l > own && l >= min => Some((self.slots[i].as_deref().unwrap(), l, Source::Corpus)),
            _ if own >= min && own > 0 => Some((&r.ctx, own, Source::Context)),
            _ => None,
        }
    }
}

fn err<T>(msg: String) -> Result<T, String> {
    Err(msg)
}

fn check_tree(model: &Model, ids: &[u64], n: usize, out: &DraftBatch) -> Result<(), String> {
    for (b, id) in ids.iter().enumerate() {
        let r = &model.reqs[id];
        let len = out.lengths[b] as usize;
        let src = model.source(r);
        let Some((text, l, source)) = src else {
            if len != 0 {
                return err(format!("tree for {id}: expected no draft, got {len} nodes"));
            }
            continue;
        };
        // Where a chain exists the tree has at least its first token's node; the tree may find more through
        // shorter contexts (e.g. when the longest match only precedes the end of a corpus document).
        let chain = rf::chain(text, &r.ctx[r.ctx.len() - l..], 1, source);
        if len > n || (len == 0 && !chain.is_empty()) {
            return err(format!("tree for {id}: {len} nodes, expected 1..={n} (ctx {:?})", r.ctx));
        }
        let row = |v: &Vec<i32>, j: usize| v[b * n + j];
        for j in 0..n {
            let valid = j < len;
            if !valid {
                if row(&out.tokens, j) != -1 || row(&out.parents, j) != -1 || row(&out.count, j) != 0 {
                    return err(format!("tree for {id}: padding at {j} not cleared"));
                }
                continue;
            }
            let p = row(&out.parents, j);
            if p >= j as i32 || p < -1 {
                return err(format!("tree for {id}: parent {p} of node {j}"));
            }
            let pdepth = if p < 0 { 0 } else { row(&out.depth, p as usize) };
            if row(&out.depth, j) != pdepth + 1 {
                return err(format!("tree for {id}: depth of node {j}"));
            }
            for s in 0..j {
                if row(&out.parents, s) == p && row(&out.tokens, s) == row(&out.tokens, j) {
                    return err(format!("tree for {id}: duplicate sibling token at {j}"));
                }
            }
            if out.source[b * n + j] != source as i8 {
                return err(format!("tree for {id}: source of node {j}"));
            }
            // Context = request context + tokens on the path to the parent; its suffix of match_len tokens.
            let mut path = Vec::new();
            let mut a = p;
            while a >= 0 {
                path.push(row(&out.tokens, a as usize) as u32);
                a = row(&out.parents, a as usize);
            }
            path.reverse();
            let mut x = r.ctx.clone();
            x.extend(path);
            let ml = row(&out.match_len, j) as usize;
            if ml < model.cfg.min_match as usize || ml > x.len() {
                return err(format!("tree for {id}: match_len {ml} of node {j}"));
            }
            let u = &x[x.len() - ml..];
            let tok = row(&out.tokens, j) as u32;
            let (total, _) = rf::followed(text, u);
            let count = rf::continuation_count(text, u, tok);
            if row(&out.total, j) as u32 != total || row(&out.count, j) as u32 != count || count == 0 {
                return err(format!(
                    "tree for {id}: node {j} token {tok} features (count {}, total {}) != reference ({count}, {total})",
                    row(&out.count, j),
                    row(&out.total, j)
                ));
            }
        }
    }
    Ok(())
}

/// Runs `ops` against a fresh [`Drafter`] (config [`check_config`]) and the brute-force model; returns the first
/// disagreement.
pub fn run_ops(ops: &[Op]) -> Result<(), String> {
    run_ops_with(&check_config(), ops)
}

/// [`run_ops`] with another configuration (e.g. [`check_config`] with `donate_prompts: false`).
pub fn run_ops_with(cfg: &DrafterConfig, ops: &[Op]) -> Result<(), String> {
    let cfg = cfg.clone();
    let mut d = Drafter::new(cfg.clone()).map_err(|e| e.to_string())?;
    let mut m = Model { cfg: cfg.clone(), reqs: HashMap::new(), slots: Default::default() };
    for (step, op) in ops.iter().enumerate() {
        let ctx = |e: String| format!("step {step} {op:?}: {e}");
        match op {
            Op::Start(id, prompt) => {
                let want = if m.reqs.contains_key(id) {
                    Err(DrafterError::DuplicateRequest(*id))
                } else {
                    m.tokens_ok(prompt)
                };
                let got = d.start(*id, prompt);
                if got != want {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
                if want.is_ok() {
                    m.reqs.insert(*id, ModelReq { ctx: prompt.clone(), prompt_len: prompt.len(), finished: false });
                }
            }
            Op::Extend(id, toks) => {
                let want = m.tokens_ok(toks).and_then(|_| match m.reqs.get(id) {
                    None => Err(DrafterError::UnknownRequest(*id)),
                    Some(r) if r.finished => Err(DrafterError::Finished(*id)),
                    Some(_) => Ok(()),
                });
                let got = d.extend(*id, toks);
                if got != want {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
                if want.is_ok() {
                    m.reqs.get_mut(id).unwrap().ctx.extend_from_slice(toks);
                }
            }
            Op::ExtendBatch(items) => {
                let ids: Vec<u64> = items.iter().map(|x| x.0).collect();
                let mut flat = Vec::new();
                let mut offsets = vec![0];
                for (_, t) in items {
                    flat.extend_from_slice(t);
                    offsets.push(flat.len());
                }
                let mut seen = std::collections::HashSet::new();
                let want = m.tokens_ok(&flat).and_then(|_| {
                    for id in &ids {
                        match m.reqs.get(id) {
                            None => return Err(DrafterError::UnknownRequest(*id)),
                            Some(r) if r.finished => return Err(DrafterError::Finished(*id)),
                            _ => {}
                        }
                        if !seen.insert(*id) {
                            return Err(DrafterError::InvalidArgument(String::new()));
                        }
                    }
                    Ok(())
                });
                let got = d.extend_batch(&ids, &flat, &offsets);
                let same = match (&got, &want) {
                    (Err(DrafterError::InvalidArgument(_)), Err(DrafterError::InvalidArgument(_))) => true,
                    _ => got == want,
                };
                if !same {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
                if want.is_ok() {
                    for (id, t) in items {
                        m.reqs.get_mut(id).unwrap().ctx.extend_from_slice(t);
                    }
                }
            }
            Op::Propose(ids, k) => {
                let w = (*k).max(1);
                let mut out = DraftBatch::new(ids.len(), w);
                let got = d.propose(ids, *k, &mut out.rows());
                let unknown = ids.iter().find(|i| !m.reqs.contains_key(i));
                match (got, *k == 0 || *k > cfg.max_draft, unknown) {
                    (Err(DrafterError::InvalidArgument(_)), true, _) => {}
                    (Err(DrafterError::UnknownRequest(i)), false, Some(&u)) if i == u => {}
                    (Ok(()), false, None) => {
                        for (b, id) in ids.iter().enumerate() {
                            let r = &m.reqs[id];
                            let want = match m.source(r) {
                                None => Vec::new(),
                                Some((text, l, src)) => rf::chain(text, &r.ctx[r.ctx.len() - l..], *k, src),
                            };
                            let mut exp = DraftBatch::new(1, w);
                            for (j, t) in want.iter().enumerate() {
                                exp.tokens[j] = t.token as i32;
                                exp.parents[j] = t.parent;
                                exp.depth[j] = t.depth as i32;
                                exp.match_len[j] = t.match_len as i32;
                                exp.count[j] = t.count as i32;
                                exp.total[j] = t.total as i32;
                                exp.source[j] = t.source as i8;
                            }
                            exp.lengths[0] = want.len() as i32;
                            let s = b * w..(b + 1) * w;
                            let same = out.tokens[s.clone()] == exp.tokens[..]
                                && out.parents[s.clone()] == exp.parents[..]
                                && out.depth[s.clone()] == exp.depth[..]
                                && out.match_len[s.clone()] == exp.match_len[..]
                                && out.count[s.clone()] == exp.count[..]
                                && out.total[s.clone()] == exp.total[..]
                                && out.source[s.clone()] == exp.source[..]
                                && out.lengths[b] == exp.lengths[0];
                            if !same {
                                return Err(ctx(format!(
                                    "row {b} (id {id}, ctx {:?}): got tokens {:?} ml {:?} cnt {:?} tot {:?} src {:?}, \
                                     want tokens {:?} ml {:?} cnt {:?} tot {:?} src {:?}; corpus {:?}",
                                    r.ctx,
                                    &out.tokens[s.clone()],
                                    &out.match_len[s.clone()],
                                    &out.count[s.clone()],
                                    &out.total[s.clone()],
                                    &out.source[s.clone()],
                                    exp.tokens,
                                    exp.match_len,
                                    exp.count,
                                    exp.total,
                                    exp.source,
                                    m.slots
                                )));
                            }
                        }
                    }
                    (got, _, _) => return Err(ctx(format!("unexpected result {got:?}"))),
                }
            }
            Op::ProposeTree(ids, n) => {
                let w = (*n).max(1);
                let mut out = DraftBatch::new(ids.len(), w);
                let got = d.propose_tree(ids, *n, &mut out.rows());
                let unknown = ids.iter().find(|i| !m.reqs.contains_key(i));
                match (got, *n == 0 || *n > cfg.max_nodes, unknown) {
                    (Err(DrafterError::InvalidArgument(_)), true, _) => {}
                    (Err(DrafterError::UnknownRequest(i)), false, Some(&u)) if i == u => {}
                    (Ok(()), false, None) => check_tree(&m, ids, w, &out).map_err(ctx)?,
                    (got, _, _) => return Err(ctx(format!("unexpected result {got:?}"))),
                }
            }
            Op::Finish(id, donate) => {
                let want = match m.reqs.get(id) {
                    None => Err(DrafterError::UnknownRequest(*id)),
                    Some(r) if r.finished => Err(DrafterError::Finished(*id)),
                    Some(_) => Ok(()),
                };
                let got = d.finish(*id, *donate);
                if got != want {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
                if want.is_ok() {
                    let r = m.reqs.get_mut(id).unwrap();
                    r.finished = true;
                    // Donated only now, once the request is finished (it can never match its own text).
                    let from = if m.cfg.donate_prompts { 0 } else { r.prompt_len };
                    let resp = r.ctx[from..].to_vec();
                    r.ctx.clear();
                    if *donate && m.cfg.use_corpus {
                        m.donate(&resp);
                    }
                }
            }
            Op::Remove(id) => {
                let want = if m.reqs.remove(id).is_some() { Ok(()) } else { Err(DrafterError::UnknownRequest(*id)) };
                let got = d.remove(*id);
                if got != want {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
            }
            Op::AddCorpus(toks) => {
                let want = m.tokens_ok(toks);
                let got = d.add_corpus(toks);
                if got != want {
                    return Err(ctx(format!("got {got:?}, want {want:?}")));
                }
                if want.is_ok() && !toks.is_empty() && m.cfg.use_corpus {
                    let s = m.slots[0].get_or_insert_with(Vec::new);
                    s.extend_from_slice(toks);
                    s.push(SEPARATOR);
                }
            }
        }
        // Lifecycle bookkeeping agrees after every step.
        if d.num_requests() != m.reqs.len() {
            return Err(ctx(format!("num_requests {} != {}", d.num_requests(), m.reqs.len())));
        }
        for (id, r) in &m.reqs {
            if d.context_len(*id) != Ok(r.ctx.len()) {
                return Err(ctx(format!("context_len of {id}")));
            }
        }
        if d.corpus().donated_tokens() > cfg.corpus_cap_tokens + 2 {
            return Err(ctx("donated corpus above its cap".into()));
        }
    }
    Ok(())
}
