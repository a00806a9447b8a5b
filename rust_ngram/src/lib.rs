//! # rust_ngram — suffix-automaton n-gram drafter for speculative decoding
//!
//! A model-free drafter: for every request an online suffix automaton over its context (prompt + accepted
//! tokens) finds the longest suffix that occurred before — with no cap on its length — and copies what followed
//! its **most recent** occurrence (on prose the most recent occurrence predicts better than the earliest).
//! A shared corpus of finished responses (bounded, evicted in generations) and an optional static corpus serve
//! when they match a longer suffix than the request's own context.
//!
//! Every draft token carries the features a calibrator needs (see [`DraftToken`]): the matched length, how
//! often the drafted continuation followed the matched context (`count`), how often the context was followed
//! by anything (`total`), its depth and its source. Layout of batched outputs follows the project's
//! `docs/ARCHITECTURE.md` ("n-gram drafts").
//!
//! Layers, each usable alone:
//! * [`SuffixAutomaton`]: the automaton with exact per-state occurrence statistics
//!   (`occurrences`, `last_end`, [`continuation_count`](SuffixAutomaton::continuation_count)).
//! * [`chain_draft`] / [`tree_draft`]: drafts from a [`Match`] in one automaton.
//! * [`Corpus`]: shared corpus with generational eviction.
//! * [`Drafter`]: request lifecycle and batched proposals (parallel with the `parallel` feature).
//! * [`reference`](mod@reference): a brute-force oracle (quadratic; for tests and fuzzing) and [`check`], an API-sequence
//!   checker that compares a [`Drafter`] with the oracle.
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
#![warn(missing_docs)]

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
