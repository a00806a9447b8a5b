//! # rust_ngram — suffix-automaton n-gram drafter for speculative decoding
//!
//! A model-free drafter: for every request an online suffix automaton over its context (prompt + accepted
//! tokens) finds the longest suffix that occurred before — with no cap on its length — and copies what followed
//! its **most recent** occurrence (on prose the most recent occurrence predicts better than the earliest).
//! A shared corpus of finished requests (prompt + response, or the response alone; bounded, evicted in
//! generations) and an optional static corpus serve when they match a longer suffix than the request's own
//! context.
//!
//! Every draft token carries the features a calibrator needs (see [`DraftToken`]): the matched length, how
//! often the drafted continuation followed the matched context (`count`), how often the context was followed
//! by anything (`total`), its depth and its source. Batched outputs are row-major columns, described at
//! [`DraftRows`].
//!
//! Layers, each usable alone:
//! * [`SuffixAutomaton`]: the automaton with exact per-state occurrence statistics
//!   (`occurrences`, `last_end`, [`continuation_count`](SuffixAutomaton::continuation_count)).
//! * [`chain_draft`] / [`tree_draft`]: drafts from a [`Match`] in one automaton.
//! * [`Corpus`]: shared corpus with generational eviction.
//! * [`Drafter`]: request lifecycle and batched proposals (parallel with the `parallel` feature).
//! * [`reference`](mod@reference): a brute-force oracle (quadratic; for tests and fuzzing) and [`check`], an
//!   API-sequence checker that compares a [`Drafter`] with the oracle.
//!
//! ```
//! use rust_ngram::{DraftBatch, Drafter, DrafterConfig};
//! let mut d = Drafter::new(DrafterConfig { max_draft: 4, ..Default::default() }).unwrap();
//! d.start(1, &[1, 2, 3, 4, 5, 1, 2]).unwrap();
//! let mut out = DraftBatch::new(1, 4);
//! d.propose(&[1], 4, &mut out.rows()).unwrap();
//! assert_eq!(out.row_tokens(0), &[3, 4, 5, 1]);
//! assert_eq!(out.match_len[..4], [2, 3, 4, 5]);
//! ```
//!
//! No Python here: the default features pull in no dependency at all; `parallel` adds rayon.
//!
//! # Guarantees
//!
//! Each public item states its own invariants; these are the ones a user relies on most.
//!
//! * **Exact, uncapped matching.** The match of a request is the longest suffix of its context that also ends
//!   before the last position ([`SuffixAutomaton::longest_repeated_suffix`]), whatever its length. Occurrence
//!   statistics ([`StateStats`], [`SuffixAutomaton::continuation_count`]) are exact counts, kept up to date after
//!   every appended token (see the invariants of [`SuffixAutomaton`] and [`Match`]).
//! * **Defined drafts.** A chain ([`chain_draft`]) copies, token by token, what followed the most recent followed
//!   occurrence of the matched context, extending the match by each drafted token; where the copy reaches the end
//!   of the text the match falls back to its longest suffix with a followed occurrence, so a loop in the context is
//!   drafted as the loop continued; it stops at the end of a corpus document ([`SEPARATOR`]), so no draft spans two
//!   documents. A tree ([`tree_draft`]) has distinct siblings and
//!   topological order (`parent < index`). Every [`DraftToken`] of a [`Drafter`] satisfies
//!   `1 <= count <= total`, `depth >= 1` and `match_len >= min_match`.
//! * **Source.** A request drafts from its own context unless a corpus automaton matches a strictly longer suffix
//!   of it ([`Source`]); among corpus automata the longest match wins, ties to the newest ([`Corpus`]).
//! * **Deterministic, batch-independent output.** The same calls give the same drafts; a batched proposal gives
//!   the same rows as one call per request, with or without the `parallel` feature. Rows are fully overwritten:
//!   valid entries form a prefix, padding is `-1` / `0` ([`DraftRows`]).
//! * **Rejected calls change nothing.** Every [`Drafter`] call validates all of its arguments before changing any
//!   state and reports a [`DrafterError`]; token ids are `<= i32::MAX` (and below `vocab_size` when set).
//! * **Bounded memory.** [`Drafter::finish`] releases the request's automaton; the donated part of the [`Corpus`]
//!   holds at most `corpus_cap_tokens + 2` tokens, separators included (two generations of about
//!   `corpus_cap_tokens / 2` each; when the active one is full the old one is dropped).
//! * **Cost.** Appending a token is amortised O(1) automaton work plus amortised O(log n) statistics work, also on
//!   degenerate text (`a a a a ...`); a chain of `k` tokens costs `k + 1` statistics queries.
//!
//! These definitions are checked against a brute-force oracle ([`reference`](mod@reference)) by property tests
//! after every single append, and whole random API call sequences against a brute-force model of the [`Drafter`]
//! ([`check`]).
#![deny(missing_docs)]

mod automaton;
pub mod check;
mod corpus;
mod draft;
mod drafter;
mod lct;
pub mod reference;
pub mod synth;
mod table;

pub use automaton::{Match, StateStats, SuffixAutomaton, ROOT, SEPARATOR};
pub use corpus::{rematch, Corpus, CorpusChange, CORPUS_SLOTS, SLOT_ACTIVE, SLOT_OLD, SLOT_STATIC};
pub use draft::{chain_draft, tree_draft, DraftToken, Source, TreeParams};
pub use drafter::{DraftBatch, DraftRows, Drafter, DrafterConfig, DrafterError, Result};

/// Hints the CPU to start loading the cache line of `r` now (no effect on results; a no-op off x86-64).
///
/// Why: the automata of a large batch live far outside the caches, so almost every first touch of a state, a
/// transition slot or a statistics node is a cache miss. Where the address is known before the data is needed
/// (the next token of an extension, the next request of a batch), starting the load early overlaps the misses.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and changes no state visible to the program, and `r` is a
    // valid reference anyway.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(r as *const T as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

// The README's examples are compiled and run by `cargo test --doc` (not rendered: the crate docs above are the
// rustdoc front page, with intra-doc links the README cannot use).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
