//! Shared corpus of finished requests (bounded, evicted in generations) plus an optional static corpus.

use crate::automaton::{Match, SuffixAutomaton, SEPARATOR};

/// Number of corpus automata a request keeps a match for: static, older generation, active generation.
///
/// ```
/// use rust_ngram::{Corpus, CORPUS_SLOTS};
/// let mut c = Corpus::new(100);
/// c.donate(&[1, 2]);
/// let held: Vec<bool> = (0..CORPUS_SLOTS).map(|i| c.slot(i).is_some()).collect();
/// assert_eq!(held, [false, false, true]); // static, old, active
/// ```
pub const CORPUS_SLOTS: usize = 3;
/// Slot of the static (never evicted) external corpus.
///
/// ```
/// use rust_ngram::{Corpus, SLOT_STATIC};
/// let mut c = Corpus::new(0); // donations disabled; the static corpus works all the same
/// c.add_static(&[1, 2, 3]);
/// assert_eq!(c.slot(SLOT_STATIC).unwrap().len(), 4); // the document and its separator
/// assert_eq!(c.donated_tokens(), 0); // outside the cap
/// ```
pub const SLOT_STATIC: usize = 0;
/// Slot of the older generation of donated documents.
///
/// ```
/// use rust_ngram::{Corpus, SEPARATOR, SLOT_OLD};
/// let mut c = Corpus::new(6); // generations of 3 tokens
/// c.donate(&[1, 2]);
/// assert!(c.slot(SLOT_OLD).is_none());
/// c.donate(&[3]); // 3 + 2 > 3: the generations rotate
/// assert_eq!(c.slot(SLOT_OLD).unwrap().tokens(), &[1, 2, SEPARATOR]);
/// ```
pub const SLOT_OLD: usize = 1;
/// Slot of the active generation (receives donations).
///
/// ```
/// use rust_ngram::{Corpus, SEPARATOR, SLOT_ACTIVE};
/// let mut c = Corpus::new(100);
/// assert!(c.donate(&[1, 2]).grown[SLOT_ACTIVE]);
/// c.donate(&[3]);
/// assert_eq!(c.slot(SLOT_ACTIVE).unwrap().tokens(), &[1, 2, SEPARATOR, 3, SEPARATOR]);
/// ```
pub const SLOT_ACTIVE: usize = 2;

/// What a corpus update changed, so that requests can refresh their matches.
///
/// ```
/// use rust_ngram::{Corpus, CorpusChange};
/// let mut c = Corpus::new(4); // generations of 2 tokens
/// assert_eq!(c.add_static(&[9]), CorpusChange { rotated: false, grown: [true, false, false] });
/// assert_eq!(c.donate(&[1]), CorpusChange { rotated: false, grown: [false, false, true] });
/// assert_eq!(c.donate(&[2]), CorpusChange { rotated: true, grown: [false, false, true] });
/// assert_eq!(c.donate(&[]), CorpusChange::default()); // nothing changed
/// ```
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
    /// A corpus holding at most about `cap_tokens` donated tokens (below 2 disables donations: each generation
    /// gets `cap_tokens / 2`).
    ///
    /// ```
    /// use rust_ngram::{Corpus, CorpusChange, SLOT_ACTIVE};
    /// let c = Corpus::new(1 << 10);
    /// assert_eq!((c.cap_tokens(), c.donated_tokens()), (1024, 0));
    /// let mut off = Corpus::new(0);
    /// assert_eq!(off.donate(&[1, 2]), CorpusChange::default()); // donations disabled
    /// assert!(off.slot(SLOT_ACTIVE).is_none());
    /// ```
    pub fn new(cap_tokens: usize) -> Self {
        Corpus { cap_tokens, slots: Default::default(), rotations: 0 }
    }

    /// The configured cap on donated tokens.
    ///
    /// ```
    /// use rust_ngram::{Drafter, DrafterConfig};
    /// let d = Drafter::new(DrafterConfig { corpus_cap_tokens: 5000, ..Default::default() }).unwrap();
    /// assert_eq!(d.corpus().cap_tokens(), 5000);
    /// ```
    pub fn cap_tokens(&self) -> usize {
        self.cap_tokens
    }

    /// How many times the generations rotated (an old generation was dropped).
    ///
    /// ```
    /// use rust_ngram::Corpus;
    /// let mut c = Corpus::new(4); // generations of 2 tokens
    /// for doc in [[1], [2], [3]] {
    ///     c.donate(&doc);
    /// }
    /// assert_eq!(c.rotations(), 2); // each donation after the first filled a fresh generation
    /// assert_eq!(c.donated_tokens(), 4); // the last two documents, with their separators
    /// ```
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    /// The automaton of a slot, if it holds any text.
    ///
    /// ```
    /// use rust_ngram::{Corpus, SLOT_ACTIVE};
    /// let mut c = Corpus::new(100);
    /// assert!(c.slot(SLOT_ACTIVE).is_none()); // no text yet
    /// c.donate(&[5, 6, 5]);
    /// let sam = c.slot(SLOT_ACTIVE).unwrap();
    /// assert_eq!(sam.match_suffix(&[9, 5, 6]).len, 2);
    /// ```
    pub fn slot(&self, i: usize) -> Option<&SuffixAutomaton> {
        self.slots[i].as_ref()
    }

    /// Mutable access (statistics queries splay).
    ///
    /// ```
    /// use rust_ngram::{Corpus, SLOT_ACTIVE};
    /// let mut c = Corpus::new(100);
    /// c.donate(&[5, 6, 5, 7]);
    /// let sam = c.slot_mut(SLOT_ACTIVE).unwrap();
    /// let s = sam.find(&[5]).unwrap();
    /// assert_eq!(sam.stats(s).occurrences, 2); // `stats` needs `&mut`
    /// ```
    pub fn slot_mut(&mut self, i: usize) -> Option<&mut SuffixAutomaton> {
        self.slots[i].as_mut()
    }

    /// Tokens (separators included) held by the donated generations.
    ///
    /// ```
    /// use rust_ngram::Corpus;
    /// let mut c = Corpus::new(100);
    /// c.add_static(&[1, 2, 3]); // not counted
    /// c.donate(&[4, 5]);
    /// assert_eq!(c.donated_tokens(), 3); // 4, 5 and the separator
    /// ```
    pub fn donated_tokens(&self) -> usize {
        [SLOT_OLD, SLOT_ACTIVE].iter().filter_map(|&i| self.slots[i].as_ref()).map(|s| s.len()).sum()
    }

    /// Heap bytes held by all corpus automata.
    ///
    /// ```
    /// use rust_ngram::{Corpus, SLOT_ACTIVE};
    /// let mut c = Corpus::new(100);
    /// assert_eq!(c.memory_bytes(), 0); // no automaton yet
    /// c.donate(&[1, 2, 3]);
    /// assert_eq!(c.memory_bytes(), c.slot(SLOT_ACTIVE).unwrap().memory_bytes());
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.slots.iter().flatten().map(|s| s.memory_bytes()).sum()
    }

    /// Adds one document to the static corpus.
    ///
    /// ```
    /// use rust_ngram::{Corpus, SEPARATOR, SLOT_STATIC};
    /// let mut c = Corpus::new(0);
    /// c.add_static(&[1, 2]);
    /// c.add_static(&[2, 3]);
    /// let sam = c.slot(SLOT_STATIC).unwrap();
    /// assert_eq!(sam.tokens(), &[1, 2, SEPARATOR, 2, 3, SEPARATOR]);
    /// assert_eq!(sam.match_suffix(&[1, 2, 3]).len, 2); // "2 3": the documents do not run together
    /// ```
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
    ///
    /// ```
    /// use rust_ngram::{Corpus, CorpusChange, SEPARATOR, SLOT_ACTIVE};
    /// let mut c = Corpus::new(6); // generations of 3 tokens
    /// let change = c.donate(&[1, 2, 3, 4, 5]); // longer than 3: only its tail is kept
    /// assert!(change.grown[SLOT_ACTIVE] && !change.rotated);
    /// assert_eq!(c.slot(SLOT_ACTIVE).unwrap().tokens(), &[3, 4, 5, SEPARATOR]);
    /// assert_eq!(c.donate(&[]), CorpusChange::default());
    /// ```
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
///
/// ```
/// use rust_ngram::{rematch, SuffixAutomaton};
/// let sam = SuffixAutomaton::from_tokens(&(0..100).collect::<Vec<u32>>());
/// let context: Vec<u32> = [7, 7].into_iter().chain(10..60).collect();
/// let m = rematch(&sam, &context);
/// assert_eq!(m.len, 50); // longer than the first window of 32 tokens
/// assert_eq!(m, sam.match_suffix(&context));
/// ```
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
