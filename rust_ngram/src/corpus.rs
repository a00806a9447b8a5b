//! Shared corpus of finished requests (bounded, evicted in generations) plus an optional static corpus.

use crate::automaton::{Match, SuffixAutomaton, SEPARATOR};

/// Number of corpus automata a request keeps a match for: static, older generation, active generation.
pub const CORPUS_SLOTS: usize = 3;
/// Slot of the static (never evicted) external corpus.
pub const SLOT_STATIC: usize = 0;
/// Slot of the older generation of donated documents.
pub const SLOT_OLD: usize = 1;
/// Slot of the active generation (receives donations).
pub const SLOT_ACTIVE: usize = 2;

/// What a corpus update changed, so that requests can refresh their matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorpusChange {
    /// The active generation became the old one and a fresh active one was started (old one dropped).
    pub rotated: bool,
    /// Slots whose text grew.
    pub grown: [bool; CORPUS_SLOTS],
}

/// Shared corpus automata. Documents are stored as `doc + [SEPARATOR]`, so no match spans two documents.
///
/// Why generations: a suffix automaton cannot delete text, so memory is bounded by keeping two generations of
/// donations, each at most `cap_tokens / 2` tokens (plus one separator per document). When a donation would make
/// the active generation exceed that, the old generation is dropped (its memory is freed), the active one becomes
/// the old one, and a fresh active generation receives the donation. Invariant: donated tokens held
/// `<= cap_tokens + 2` plus separators; a donated document longer than `cap_tokens / 2` keeps only its tail.
/// The static corpus ([`add_static`](Self::add_static)) is outside the cap and never evicted.
///
/// ```
/// use rust_ngram::{Corpus, SEPARATOR, SLOT_ACTIVE, SLOT_OLD};
/// let mut c = Corpus::new(8); // two generations of about 8 / 2 tokens each (separators included)
/// c.donate(&[1, 2]);
/// assert_eq!(c.slot(SLOT_ACTIVE).unwrap().tokens(), &[1, 2, SEPARATOR]);
/// let change = c.donate(&[3, 4]); // 3 + 3 > 4: the active generation becomes the old one
/// assert!(change.rotated);
/// assert_eq!(c.slot(SLOT_OLD).unwrap().tokens(), &[1, 2, SEPARATOR]);
/// assert_eq!(c.donated_tokens(), 6);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Corpus {
    cap_tokens: usize,
    slots: [Option<SuffixAutomaton>; CORPUS_SLOTS],
    rotations: u64,
}

impl Corpus {
    /// A corpus holding at most about `cap_tokens` donated tokens (0 disables donations).
    pub fn new(cap_tokens: usize) -> Self {
        Corpus { cap_tokens, slots: Default::default(), rotations: 0 }
    }

    /// The configured cap on donated tokens.
    pub fn cap_tokens(&self) -> usize {
        self.cap_tokens
    }

    /// How many times the generations rotated (an old generation was dropped).
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    /// The automaton of a slot, if it holds any text.
    pub fn slot(&self, i: usize) -> Option<&SuffixAutomaton> {
        self.slots[i].as_ref()
    }

    /// Mutable access (statistics queries splay).
    pub fn slot_mut(&mut self, i: usize) -> Option<&mut SuffixAutomaton> {
        self.slots[i].as_mut()
    }

    /// Tokens (separators included) held by the donated generations.
    pub fn donated_tokens(&self) -> usize {
        [SLOT_OLD, SLOT_ACTIVE].iter().filter_map(|&i| self.slots[i].as_ref()).map(|s| s.len()).sum()
    }

    /// Heap bytes held by all corpus automata.
    pub fn memory_bytes(&self) -> usize {
        self.slots.iter().flatten().map(|s| s.memory_bytes()).sum()
    }

    /// Adds one document to the static corpus.
    pub fn add_static(&mut self, doc: &[u32]) -> CorpusChange {
        let sam = self.slots[SLOT_STATIC].get_or_insert_with(SuffixAutomaton::new);
        sam.extend_from_slice(doc);
        sam.push(SEPARATOR);
        let mut c = CorpusChange::default();
        c.grown[SLOT_STATIC] = true;
        c
    }

    /// Donates one document (a finished request's prompt + response, or its response: see
    /// [`DrafterConfig::donate_prompts`](crate::DrafterConfig::donate_prompts)). Returns what changed (nothing when
    /// the cap is 0 or `doc` is empty).
    pub fn donate(&mut self, doc: &[u32]) -> CorpusChange {
        let mut change = CorpusChange::default();
        let half = self.cap_tokens / 2;
        if half == 0 || doc.is_empty() {
            return change;
        }
        let doc = &doc[doc.len().saturating_sub(half)..];
        let active_len = self.slots[SLOT_ACTIVE].as_ref().map_or(0, |s| s.len());
        if active_len > 0 && active_len + doc.len() + 1 > half {
            self.slots[SLOT_OLD] = self.slots[SLOT_ACTIVE].take();
            self.rotations += 1;
            change.rotated = true;
        }
        let sam = self.slots[SLOT_ACTIVE].get_or_insert_with(|| SuffixAutomaton::with_capacity(doc.len() + 1));
        sam.extend_from_slice(doc);
        sam.push(SEPARATOR);
        change.grown[SLOT_ACTIVE] = true;
        change
    }
}

/// Longest suffix of `context` that occurs in `sam`, computed from the end of `context` with doubling windows
/// (cost O(match length) instead of O(context length)).
pub fn rematch(sam: &SuffixAutomaton, context: &[u32]) -> Match {
    let n = context.len();
    let mut w = 32usize;
    loop {
        let start = n.saturating_sub(w);
        let m = sam.match_suffix(&context[start..]);
        if (m.len as usize) < n - start || start == 0 {
            return m;
        }
        w *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_rotate_and_stay_under_cap() {
        let mut c = Corpus::new(20);
        assert_eq!(c.donate(&[]), CorpusChange::default());
        let ch = c.donate(&[1, 2, 3, 4]);
        assert!(ch.grown[SLOT_ACTIVE] && !ch.rotated);
        assert_eq!(c.donated_tokens(), 5);
        c.donate(&[5, 6, 7, 8]); // 10 tokens: exactly half, no rotation
        assert_eq!(c.rotations(), 0);
        let ch = c.donate(&[9]); // would exceed 10 -> rotate
        assert!(ch.rotated);
        assert_eq!(c.slot(SLOT_OLD).unwrap().len(), 10);
        assert_eq!(c.slot(SLOT_ACTIVE).unwrap().tokens(), &[9, SEPARATOR]);
        // A document longer than cap / 2 keeps its tail.
        c.donate(&(100..130).collect::<Vec<u32>>());
        assert_eq!(c.slot(SLOT_ACTIVE).unwrap().tokens()[..10], (120..130).collect::<Vec<u32>>()[..]);
        assert!(c.donated_tokens() <= 22);
        assert_eq!(Corpus::new(0).donate(&[1]), CorpusChange::default());
        let mut s = Corpus::new(0);
        s.add_static(&[1, 2]);
        assert_eq!(s.slot(SLOT_STATIC).unwrap().len(), 3);
    }

    #[test]
    fn rematch_finds_long_matches_beyond_first_window() {
        let doc: Vec<u32> = (0..300).collect();
        let sam = SuffixAutomaton::from_tokens(&doc);
        let mut ctx = vec![999, 998];
        ctx.extend(0..200);
        assert_eq!(rematch(&sam, &ctx).len, 200);
        assert_eq!(rematch(&sam, &[]).len, 0);
    }
}
