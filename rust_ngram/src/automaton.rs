//! Online suffix automaton over token ids with per-state occurrence statistics.

use crate::lct::{Lct, Stat, NIL};
use crate::table::TransitionTable;

/// Token id reserved as the document separator inside corpus automata. Never a valid token: the
/// [`Drafter`](crate::Drafter) rejects ids above `i32::MAX`, so a match can never span two documents.
///
/// ```
/// use rust_ngram::{Corpus, Drafter, DrafterConfig, SEPARATOR, SLOT_STATIC};
/// let mut c = Corpus::new(0);
/// c.add_static(&[1, 2]);
/// assert_eq!(c.slot(SLOT_STATIC).unwrap().tokens(), &[1, 2, SEPARATOR]); // one document, then the separator
/// let mut d = Drafter::new(DrafterConfig::default()).unwrap();
/// assert!(d.start(1, &[1, SEPARATOR]).is_err()); // never a token of a request
/// ```
pub const SEPARATOR: u32 = u32::MAX;

/// The root state (the empty string). Present in every automaton, even an empty one.
///
/// ```
/// use rust_ngram::{SuffixAutomaton, ROOT};
/// let sam = SuffixAutomaton::from_tokens(&[1, 2]);
/// assert_eq!(sam.find(&[]), Some(ROOT)); // the empty pattern
/// assert_eq!((sam.state_len(ROOT), sam.suffix_link(ROOT)), (0, None));
/// assert_eq!(SuffixAutomaton::new().num_states(), 1); // only the root
/// ```
pub const ROOT: u32 = 0;

/// A matched string inside an automaton: the state that holds it and its length.
///
/// Invariant (when produced by this crate): `len` lies in the length range of `state`, i.e.
/// `state_len(suffix_link(state)) < len <= state_len(state)`, or `state == ROOT && len == 0`.
///
/// ```
/// use rust_ngram::{Match, SuffixAutomaton, ROOT};
/// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 2, 3]);
/// let m = sam.match_suffix(&[9, 3]); // "3" occurs, "9 3" does not
/// assert_eq!(m.len, 1);
/// // "3" and "2 3" end at the same positions, so one state holds both: `len` is within its length range.
/// assert_eq!(Some(m.state), sam.find(&[2, 3]));
/// assert_eq!(sam.state_len(m.state), 2);
/// assert_eq!(Match::default(), Match { state: ROOT, len: 0 }); // the empty match
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Match {
    /// State of the automaton holding the matched string.
    pub state: u32,
    /// Length of the matched string in tokens.
    pub len: u32,
}

/// Occurrence statistics of a state, counting only end positions that are *followed* by a token.
///
/// Why "followed": a drafter copies the token after an occurrence, so an occurrence at the very end of the text
/// (which has no continuation yet) is useless to it. `occurrences` is therefore exactly the `total` feature of a
/// [`DraftToken`](crate::DraftToken), and `last_end` is the end position of the most recent occurrence that can be
/// copied from.
///
/// ```
/// use rust_ngram::{StateStats, SuffixAutomaton};
/// let mut sam = SuffixAutomaton::from_tokens(&[1, 2, 1, 2]);
/// // "1 2" ends at positions 1 and 3; only the one at 1 is followed by a token.
/// let s = sam.find(&[1, 2]).unwrap();
/// assert_eq!(sam.stats(s), StateStats { occurrences: 1, last_end: Some(1) });
/// let s = sam.find(&[1]).unwrap(); // ends at 0 and 2, both followed
/// assert_eq!(sam.stats(s), StateStats { occurrences: 2, last_end: Some(2) });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StateStats {
    /// Number of end positions `e` of the state's strings with `e + 1 < text length`.
    pub occurrences: u32,
    /// The largest such end position, `None` when `occurrences == 0`.
    pub last_end: Option<usize>,
}

/// Per-state record. One struct rather than three parallel vectors: the suffix-link walks of `push` and of the
/// drafts read a state's length, link and edge-list head together, so keeping them in one 12-byte record costs one
/// cache miss per visited state instead of three (the automata of a 128-request batch are far larger than cache).
#[derive(Clone, Copy, Debug)]
struct StateRec {
    /// Longest string length of the state.
    len: u32,
    /// Suffix link (`NIL` for the root).
    link: u32,
    /// Head of the state's out-edge list in `edges` (newest first), `NIL` when none.
    head: u32,
}

const ROOT_REC: StateRec = StateRec { len: 0, link: NIL, head: NIL };

#[derive(Clone, Copy, Debug)]
struct Edge {
    token: u32,
    next: u32,
}

/// Online suffix automaton (DAWG) over a growing token sequence.
///
/// Appending a token costs amortised O(1) for the automaton itself plus amortised O(log n) for the occurrence
/// statistics (a link-cut tree over suffix links, see `lct.rs`); nothing depends on a maximum n-gram length, so
/// the longest repeated suffix is found whatever its length.
///
/// Invariants, for the text `T = tokens()` of length `n`:
/// * every substring of `T` is spelled by exactly one path from [`ROOT`]; the strings ending in one state share
///   their set of end positions and have the lengths `state_len(suffix_link(s)) + 1 ..= state_len(s)`;
/// * [`stats`](Self::stats) of a state counts the end positions `e < n - 1` of its strings and gives the largest;
/// * [`longest_repeated_suffix`](Self::longest_repeated_suffix) is the longest suffix of `T` that also ends
///   somewhere before `n - 1`.
///
/// ```
/// use rust_ngram::SuffixAutomaton;
/// let mut sam = SuffixAutomaton::new();
/// sam.extend_from_slice(&[1, 2, 3, 9, 1, 2]);
/// let m = sam.longest_repeated_suffix();
/// assert_eq!(m.len, 2); // "1 2" occurred before
/// let st = sam.stats(m.state);
/// assert_eq!(st.occurrences, 1); // only the first "1 2" is followed by a token
/// assert_eq!(st.last_end, Some(1));
/// assert_eq!(sam.tokens()[st.last_end.unwrap() + 1], 3); // the token to copy
/// ```
#[derive(Clone, Debug)]
pub struct SuffixAutomaton {
    tokens: Vec<u32>,
    /// Length, suffix link and edge-list head of each state.
    st: Vec<StateRec>,
    edges: Vec<Edge>,
    trans: TransitionTable,
    lct: Lct,
    last: u32,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixAutomaton {
    /// An empty automaton (only the root). Allocates almost nothing until the first token.
    ///
    /// ```
    /// use rust_ngram::{Match, SuffixAutomaton};
    /// let sam = SuffixAutomaton::new();
    /// assert!(sam.is_empty());
    /// assert_eq!(sam.num_states(), 1); // the root
    /// assert_eq!(sam.longest_repeated_suffix(), Match::default());
    /// ```
    pub fn new() -> Self {
        let mut lct = Lct::default();
        lct.push(Stat::default());
        SuffixAutomaton {
            tokens: Vec::new(),
            st: vec![ROOT_REC],
            edges: Vec::new(),
            trans: TransitionTable::default(),
            lct,
            last: ROOT,
        }
    }

    /// An empty automaton with room for `n` tokens, avoiding regrowth while a prompt of that size is added.
    ///
    /// Sizing (measured on real code and prose, cl100k): ~1.6 n states and ~2.05 n transitions. The edge list gets
    /// room for 2.5 n (at 2 n it doubled to 4 n near the end of every real prompt: a copy, and 16 B/token of slack);
    /// the token vector gets room for n / 8 + 64 more tokens, so the first accepted tokens of a request do not copy
    /// (and page-fault) its whole context inside a decode step.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::with_capacity(1000);
    /// assert!(sam.is_empty());
    /// let reserved = sam.memory_bytes();
    /// assert!(reserved > 1000 * 4);
    /// sam.extend_from_slice(&(0..1000).map(|i| i * 7 % 37).collect::<Vec<u32>>());
    /// assert!(sam.memory_bytes() <= reserved + 64); // no array regrew (a few bytes of scratch space aside)
    /// ```
    pub fn with_capacity(n: usize) -> Self {
        let states = 2 * n + 1;
        let mut lct = Lct::with_capacity(states);
        lct.push(Stat::default());
        let mut st = Vec::with_capacity(states);
        st.push(ROOT_REC);
        SuffixAutomaton {
            tokens: Vec::with_capacity(n + n / 8 + 64),
            st,
            edges: Vec::with_capacity(n * 5 / 2 + 16),
            trans: TransitionTable::with_capacity(2 * n),
            lct,
            last: ROOT,
        }
    }

    /// Builds an automaton over `tokens`.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let a = SuffixAutomaton::from_tokens(&[1, 2, 1]);
    /// let mut b = SuffixAutomaton::new();
    /// b.extend_from_slice(&[1, 2, 1]);
    /// assert_eq!(a.tokens(), b.tokens());
    /// assert_eq!((a.num_states(), a.longest_repeated_suffix()), (b.num_states(), b.longest_repeated_suffix()));
    /// ```
    pub fn from_tokens(tokens: &[u32]) -> Self {
        let mut s = Self::with_capacity(tokens.len());
        s.extend_from_slice(tokens);
        s
    }

    /// The text so far.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::from_tokens(&[4, 5]);
    /// sam.push(6);
    /// assert_eq!(sam.tokens(), &[4, 5, 6]);
    /// ```
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens appended so far.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::new();
    /// assert_eq!(sam.len(), 0);
    /// sam.extend_from_slice(&[7, 7, 7]);
    /// assert_eq!(sam.len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when no token was appended.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// assert!(SuffixAutomaton::new().is_empty());
    /// assert!(!SuffixAutomaton::from_tokens(&[1]).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of states, the root included: at most `2 n - 1` for `n >= 2` tokens (`[1, 2, 2]` reaches it).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// // The root, "1", "1 2", "1 2 2", and "2" (split off when the second 2 arrived).
    /// assert_eq!(SuffixAutomaton::from_tokens(&[1, 2, 2]).num_states(), 5);
    /// assert_eq!(SuffixAutomaton::from_tokens(&[1, 2, 3]).num_states(), 4); // distinct tokens: one state each
    /// ```
    pub fn num_states(&self) -> usize {
        self.st.len()
    }

    /// Number of transitions (at most `3 n - 4` for `n >= 3`).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 2]);
    /// assert_eq!(sam.num_transitions(), 5); // 3 n - 4 for n = 3
    /// // From the root by 1, 2 and 3, plus "1" -> "1 2" -> "1 2 3".
    /// assert_eq!(SuffixAutomaton::from_tokens(&[1, 2, 3]).num_transitions(), 5);
    /// ```
    pub fn num_transitions(&self) -> usize {
        self.trans.len()
    }

    /// Heap bytes held (allocated capacity, not just the used part).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let small = SuffixAutomaton::from_tokens(&[1, 2, 3]);
    /// let large = SuffixAutomaton::from_tokens(&(0..10_000).collect::<Vec<u32>>());
    /// assert!(large.memory_bytes() >= 10_000 * 4); // at least the tokens themselves
    /// assert!(small.memory_bytes() < large.memory_bytes());
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.tokens.capacity() * 4
            + self.st.capacity() * std::mem::size_of::<StateRec>()
            + self.edges.capacity() * std::mem::size_of::<Edge>()
            + self.trans.capacity_bytes()
            + self.lct.capacity_bytes()
    }

    /// Releases spare vector capacity (the transition table keeps its power-of-two size).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::with_capacity(10_000);
    /// sam.extend_from_slice(&[1, 2, 3]);
    /// let reserved = sam.memory_bytes();
    /// sam.shrink_to_fit();
    /// assert!(sam.memory_bytes() < reserved);
    /// assert_eq!(sam.tokens(), &[1, 2, 3]); // the contents are unchanged
    /// ```
    pub fn shrink_to_fit(&mut self) {
        self.tokens.shrink_to_fit();
        self.st.shrink_to_fit();
        self.edges.shrink_to_fit();
        self.lct.shrink_to_fit();
    }

    /// Length of the longest string of `state`.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 2, 3]);
    /// let s = sam.find(&[3]).unwrap();
    /// assert_eq!(sam.state_len(s), 2); // "3" shares its end positions with "2 3", the state's longest string
    /// assert_eq!(sam.state_len(sam.find(&[1, 2, 3]).unwrap()), 3);
    /// ```
    pub fn state_len(&self, state: u32) -> u32 {
        self.st[state as usize].len
    }

    /// Suffix link of `state` (the state of its longest suffix with more end positions); `None` for the root.
    ///
    /// ```
    /// use rust_ngram::{SuffixAutomaton, ROOT};
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 2, 3]);
    /// let s = sam.find(&[1, 2, 3]).unwrap(); // ends at 2 only
    /// let l = sam.suffix_link(s).unwrap();
    /// assert_eq!(Some(l), sam.find(&[2, 3])); // ends at 2 and 4
    /// assert_eq!(sam.suffix_link(l), Some(ROOT));
    /// assert_eq!(sam.suffix_link(ROOT), None);
    /// ```
    pub fn suffix_link(&self, state: u32) -> Option<u32> {
        let l = self.st[state as usize].link;
        (l != NIL).then_some(l)
    }

    /// The state reached from `state` by `token`, if the extended string occurs.
    ///
    /// ```
    /// use rust_ngram::{SuffixAutomaton, ROOT};
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3]);
    /// let s = sam.transition(ROOT, 1).unwrap();
    /// assert_eq!(sam.transition(s, 2), sam.find(&[1, 2]));
    /// assert_eq!(sam.transition(s, 3), None); // "1 3" does not occur
    /// ```
    #[inline]
    pub fn transition(&self, state: u32, token: u32) -> Option<u32> {
        self.trans.get(state, token)
    }

    /// Out-transitions of `state` as `(token, target)`, most recently created first.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let sam = SuffixAutomaton::from_tokens(&[5, 1, 5, 2]);
    /// let s = sam.find(&[5]).unwrap();
    /// let out: Vec<(u32, u32)> = sam.transitions(s).collect();
    /// // "5" was followed by 1, later by 2: the newer transition comes first.
    /// assert_eq!(out, [(2, sam.find(&[5, 2]).unwrap()), (1, sam.find(&[5, 1]).unwrap())]);
    /// ```
    pub fn transitions(&self, state: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut e = self.st[state as usize].head;
        std::iter::from_fn(move || {
            if e == NIL {
                return None;
            }
            let edge = self.edges[e as usize];
            e = edge.next;
            Some((edge.token, self.trans.get(state, edge.token).expect("edge list and table agree")))
        })
    }

    /// State spelled by `pattern` from the root, if `pattern` occurs in the text.
    ///
    /// ```
    /// use rust_ngram::{SuffixAutomaton, ROOT};
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3]);
    /// assert!(sam.find(&[2, 3]).is_some());
    /// assert_eq!(sam.find(&[3, 2]), None);
    /// assert_eq!(sam.find(&[]), Some(ROOT));
    /// ```
    pub fn find(&self, pattern: &[u32]) -> Option<u32> {
        let mut s = ROOT;
        for &t in pattern {
            s = self.transition(s, t)?;
        }
        Some(s)
    }

    /// The longest suffix of the text that also ends before the last position (the context a drafter continues).
    /// `len == 0` (the root) when even the last token never occurred before.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 1, 2]);
    /// let m = sam.longest_repeated_suffix();
    /// assert_eq!(m.len, 2); // "1 2" also ends at position 1
    /// assert_eq!(Some(m.state), sam.find(&[1, 2]));
    /// // The last token never occurred before: the empty match.
    /// assert_eq!(SuffixAutomaton::from_tokens(&[1, 2, 3]).longest_repeated_suffix().len, 0);
    /// ```
    pub fn longest_repeated_suffix(&self) -> Match {
        if self.last == ROOT {
            return Match::default();
        }
        let l = self.st[self.last as usize].link;
        Match { state: l, len: self.st[l as usize].len }
    }

    /// Matching-statistics step: given `m`, the longest suffix of some external sequence `X` that occurs in this
    /// text, returns the longest suffix of `X + [token]` that occurs. Amortised O(1) over a sequence.
    ///
    /// ```
    /// use rust_ngram::{Match, SuffixAutomaton};
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3]);
    /// let m = sam.advance(Match::default(), 1);
    /// let m = sam.advance(m, 2);
    /// assert_eq!((m.len, Some(m.state)), (2, sam.find(&[1, 2])));
    /// // "1 2 1" does not occur; its longest suffix that does is "1".
    /// assert_eq!(sam.advance(m, 1).len, 1);
    /// assert_eq!(sam.advance(m, 9), Match::default()); // 9 never occurs
    /// ```
    pub fn advance(&self, m: Match, token: u32) -> Match {
        let mut state = m.state;
        let mut len = m.len;
        loop {
            if let Some(t) = self.transition(state, token) {
                return Match { state: t, len: len + 1 };
            }
            match self.suffix_link(state) {
                Some(l) => {
                    state = l;
                    len = self.st[l as usize].len;
                }
                None => return Match::default(),
            }
        }
    }

    /// Longest suffix of `seq` that occurs in the text (matching statistics from the root over `seq`).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let sam = SuffixAutomaton::from_tokens(&[1, 2, 3, 4]);
    /// let m = sam.match_suffix(&[9, 2, 3]);
    /// assert_eq!(m.len, 2); // "2 3" occurs, "9 2 3" does not
    /// assert_eq!(Some(m.state), sam.find(&[2, 3]));
    /// // One more token continues the match in O(1) amortised.
    /// assert_eq!(sam.advance(m, 4).len, 3);
    /// assert_eq!(sam.advance(m, 7).len, 0);
    /// ```
    pub fn match_suffix(&self, seq: &[u32]) -> Match {
        seq.iter().fold(Match::default(), |m, &t| self.advance(m, t))
    }

    /// Exact occurrence statistics of `state` (amortised O(log n); `&mut` because the link-cut tree splays).
    ///
    /// ```
    /// use rust_ngram::{StateStats, SuffixAutomaton};
    /// let mut sam = SuffixAutomaton::from_tokens(&[7, 8, 7, 9, 7]);
    /// let s = sam.find(&[7]).unwrap();
    /// // "7" ends at 0, 2 and 4; the one at 4 is not followed yet.
    /// assert_eq!(sam.stats(s), StateStats { occurrences: 2, last_end: Some(2) });
    /// sam.push(8);
    /// let s = sam.find(&[7]).unwrap();
    /// assert_eq!(sam.stats(s), StateStats { occurrences: 3, last_end: Some(4) });
    /// ```
    pub fn stats(&mut self, state: u32) -> StateStats {
        let s = self.lct.get(state);
        StateStats { occurrences: s.cnt, last_end: (s.last > 0).then(|| (s.last - 1) as usize) }
    }

    /// Number of occurrences of (any string of) `state` followed by `token`; 0 when there is none.
    ///
    /// This equals the occurrences of the extended string, including the one at the very end of the text.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::from_tokens(&[1, 2, 1, 3, 1, 2]);
    /// let s = sam.find(&[1]).unwrap();
    /// assert_eq!(sam.continuation_count(s, 2), 2); // "1 2" at 0..=1 and at the very end
    /// assert_eq!(sam.continuation_count(s, 3), 1);
    /// assert_eq!(sam.continuation_count(s, 4), 0);
    /// // The "followed" statistics of "1 2" itself leave out the occurrence at the end.
    /// let t = sam.find(&[1, 2]).unwrap();
    /// assert_eq!(sam.stats(t).occurrences, 1);
    /// ```
    pub fn continuation_count(&mut self, state: u32, token: u32) -> u32 {
        let Some(t) = self.transition(state, token) else { return 0 };
        let st = self.stats(state);
        self.stats(t).occurrences + self.end_correction(&st, token)
    }

    /// 1 when the string of a state with statistics `st`, extended by `token`, also ends at the last position of
    /// the text (an occurrence the "followed" statistics of the extended state leave out), else 0. That happens
    /// exactly when the state ends at `n - 2` and the last token is `token`.
    #[inline]
    pub(crate) fn end_correction(&self, st: &StateStats, token: u32) -> u32 {
        let n = self.tokens.len();
        (n >= 2 && self.tokens[n - 1] == token && st.last_end == Some(n - 2)) as u32
    }

    /// Appends several tokens.
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::from_tokens(&[1, 2]);
    /// sam.extend_from_slice(&[3, 1, 2]);
    /// assert_eq!(sam.tokens(), &[1, 2, 3, 1, 2]);
    /// assert_eq!(sam.longest_repeated_suffix().len, 2);
    /// ```
    pub fn extend_from_slice(&mut self, tokens: &[u32]) {
        self.tokens.reserve(tokens.len());
        for (j, &t) in tokens.iter().enumerate() {
            if let Some(&next) = tokens.get(j + 1) {
                // The next push starts by inserting the transition (this push's new state, next): its id is the
                // next free state id, so the slot's address is known now.
                self.trans.prefetch(self.st.len() as u32, next);
            }
            self.push(t);
        }
    }

    /// Hints the CPU to load what a following [`push`](Self::push)`(token)` reads first (the last state's record,
    /// statistics node and transition slot), so that several automata can be extended with overlapping cache
    /// misses. Changes nothing.
    #[inline]
    pub(crate) fn prefetch_push(&self, token: u32) {
        crate::prefetch(&self.st[self.last as usize]);
        self.trans.prefetch(self.last, token);
        self.lct.prefetch(self.last);
    }

    fn new_state(&mut self, len: u32, stat: Stat) -> u32 {
        let id = self.st.len() as u32;
        assert!(id < NIL - 1, "suffix automaton: too many states");
        self.st.push(StateRec { len, link: NIL, head: NIL });
        let l = self.lct.push(stat);
        debug_assert_eq!(l, id);
        id
    }

    /// Sets `from --token--> to`; a new transition also joins `from`'s edge list, right after the edge `prev`
    /// (`NIL`: at the head, where the newest goes). Returns the new edge, or `prev` when the transition existed.
    fn add_edge(&mut self, from: u32, token: u32, to: u32, prev: u32) -> u32 {
        if !self.trans.set(from, token, to) {
            return prev;
        }
        let e = self.edges.len() as u32;
        let link = if prev == NIL { &mut self.st[from as usize].head } else { &mut self.edges[prev as usize].next };
        let next = std::mem::replace(link, e);
        self.edges.push(Edge { token, next });
        e
    }

    /// Appends one token (amortised O(1) automaton work + amortised O(log n) statistics work).
    ///
    /// ```
    /// use rust_ngram::SuffixAutomaton;
    /// let mut sam = SuffixAutomaton::new();
    /// for t in [4, 5, 4] {
    ///     sam.push(t);
    /// }
    /// assert_eq!(sam.longest_repeated_suffix().len, 1); // "4" occurred before
    /// sam.push(5);
    /// assert_eq!(sam.longest_repeated_suffix().len, 2); // so did "4 5"
    /// ```
    pub fn push(&mut self, c: u32) {
        let i = self.tokens.len() as u32;
        let prev_last = self.last;
        self.tokens.push(c);
        let cur = self.new_state(self.st[prev_last as usize].len + 1, Stat::default());
        let mut p = prev_last;
        while p != NIL && self.trans.get(p, c).is_none() {
            self.add_edge(p, c, cur, NIL);
            p = self.st[p as usize].link;
        }
        let parent = if p == NIL {
            ROOT
        } else {
            let q = self.trans.get(p, c).expect("checked above");
            if self.st[p as usize].len + 1 == self.st[q as usize].len {
                q
            } else {
                // Split q: the clone takes the strings of length <= len(p) + 1 and q's end positions so far.
                let q_parent = self.st[q as usize].link;
                let stat = self.lct.cut(q);
                let clone = self.new_state(self.st[p as usize].len + 1, stat);
                // The clone lists q's edges in q's order, newest first (`transitions`' order, which `tree_draft`'s
                // `scan_limit` relies on): each copy goes after the previous one, not at the head.
                let mut e = self.st[q as usize].head;
                let mut tail = NIL;
                while e != NIL {
                    let Edge { token, next } = self.edges[e as usize];
                    let target = self.trans.get(q, token).expect("edge list and table agree");
                    tail = self.add_edge(clone, token, target, tail);
                    e = next;
                }
                self.st[clone as usize].link = q_parent;
                self.lct.link(clone, q_parent);
                self.st[q as usize].link = clone;
                self.lct.link(q, clone);
                while p != NIL && self.trans.get(p, c) == Some(q) {
                    self.trans.set(p, c, clone);
                    p = self.st[p as usize].link;
                }
                clone
            }
        };
        self.st[cur as usize].link = parent;
        self.lct.link(cur, parent);
        // Position i - 1 is now followed by a token: record it on every state ending there.
        if i >= 1 {
            self.lct.add_path(prev_last, i - 1);
        }
        self.last = cur;
    }
}
