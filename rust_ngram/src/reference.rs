//! Brute-force oracle: the definitions the automaton must agree with, computed by scanning the text.
//!
//! Quadratic or worse; meant for property tests and fuzzing on short texts, never for drafting.
//! Conventions match [`SuffixAutomaton`](crate::SuffixAutomaton): an occurrence of a pattern "ends" at the
//! position of its last token (the empty pattern ends at every position), and it is *followed* when that position
//! is not the last one of the text.

use crate::automaton::SEPARATOR;
use crate::draft::{DraftToken, Source};

/// End positions of `pat` in `text`, ascending.
pub fn end_positions(text: &[u32], pat: &[u32]) -> Vec<usize> {
    let (n, m) = (text.len(), pat.len());
    if m == 0 {
        return (0..n).collect();
    }
    if m > n {
        return Vec::new();
    }
    (m - 1..n).filter(|&e| &text[e + 1 - m..=e] == pat).collect()
}

/// `(followed occurrences, most recent followed end position)` of `pat` in `text`.
pub fn followed(text: &[u32], pat: &[u32]) -> (u32, Option<usize>) {
    let ends: Vec<usize> = end_positions(text, pat).into_iter().filter(|&e| e + 1 < text.len()).collect();
    (ends.len() as u32, ends.last().copied())
}

/// Occurrences of `pat` followed by `tok` (= occurrences of `pat + [tok]`).
pub fn continuation_count(text: &[u32], pat: &[u32], tok: u32) -> u32 {
    let mut p = pat.to_vec();
    p.push(tok);
    end_positions(text, &p).len() as u32
}

/// Length of the longest suffix of `text` that also ends before its last position (0 when none).
pub fn longest_repeated_suffix(text: &[u32]) -> usize {
    let n = text.len();
    (1..n).rev().find(|&l| end_positions(text, &text[n - l..]).len() >= 2).unwrap_or(0)
}

/// Length of the longest suffix of `ctx` that occurs anywhere in `text`.
pub fn longest_suffix_in(text: &[u32], ctx: &[u32]) -> usize {
    let n = ctx.len();
    (0..=n).rev().find(|&l| !end_positions(text, &ctx[n - l..]).is_empty()).unwrap_or(0)
}

/// Chain draft by definition: from pattern `pat`, repeatedly copy the token after the most recent followed
/// occurrence of the current pattern and append it to the pattern. A non-empty pattern without a followed
/// occurrence first drops its leading tokens down to its longest suffix that has one (none: stop); stop also at a
/// separator.
pub fn chain(text: &[u32], pat: &[u32], k: usize, source: Source) -> Vec<DraftToken> {
    let mut u = pat.to_vec();
    let mut out = Vec::new();
    for j in 0..k {
        let (total, last) = loop {
            let f = followed(text, &u);
            if f.1.is_some() || u.is_empty() {
                break f;
            }
            u.remove(0);
            if u.is_empty() {
                break (0, None);
            }
        };
        let Some(e) = last else { break };
        let tok = text[e + 1];
        if tok == SEPARATOR {
            break;
        }
        out.push(DraftToken {
            token: tok,
            parent: j as i32 - 1,
            depth: j as u32 + 1,
            match_len: u.len() as u32,
            count: continuation_count(text, &u, tok),
            total,
            source,
        });
        u.push(tok);
    }
    out
}
