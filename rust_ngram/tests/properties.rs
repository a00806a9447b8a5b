//! Property tests: the automaton, the drafts and whole API call sequences against the brute-force oracle.

use proptest::prelude::*;
use rust_ngram::check::{check_config, ops_from_bytes, run_ops, run_ops_with};
use rust_ngram::reference as rf;
use rust_ngram::DrafterConfig;
use rust_ngram::{chain_draft, Source, SuffixAutomaton};

/// Small alphabets make long repeats likely; the occasional wide token tests the hash table.
fn text(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        prop::collection::vec(0u32..2, 0..max_len),
        prop::collection::vec(0u32..4, 0..max_len),
        prop::collection::vec(prop_oneof![0u32..3, Just(100_000u32), Just(i32::MAX as u32)], 0..max_len),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After every append: longest repeated suffix, and for every substring up to length 4 (plus the matched
    /// suffix): presence, followed-occurrence count, most recent followed end, continuation counts.
    #[test]
    fn automaton_matches_brute_force(t in text(60)) {
        let mut sam = SuffixAutomaton::new();
        for i in 0..t.len() {
            sam.push(t[i]);
            let pre = &t[..=i];
            let m = sam.longest_repeated_suffix();
            prop_assert_eq!(m.len as usize, rf::longest_repeated_suffix(pre));
            prop_assert_eq!(sam.state_len(m.state), m.len);
            let mut pats: Vec<Vec<u32>> = Vec::new();
            for a in 0..=i { for l in 1..=4.min(i + 1 - a) { pats.push(pre[a..a + l].to_vec()); } }
            if m.len > 0 { pats.push(pre[pre.len() - m.len as usize..].to_vec()); }
            pats.push(vec![7]); // never occurs
            for p in pats {
                let ends = rf::end_positions(pre, &p);
                let st = sam.find(&p);
                prop_assert_eq!(st.is_some(), !ends.is_empty());
                let Some(s) = st else { continue };
                let (cnt, last) = rf::followed(pre, &p);
                let got = sam.stats(s);
                prop_assert_eq!(got.occurrences, cnt, "pattern {:?} in {:?}", p, pre);
                prop_assert_eq!(got.last_end, last, "pattern {:?} in {:?}", p, pre);
                for tok in [0u32, 1, 2, 3, 100_000] {
                    prop_assert_eq!(sam.continuation_count(s, tok), rf::continuation_count(pre, &p, tok));
                }
            }
        }
        let bound = if t.len() >= 2 { 2 * t.len() - 1 } else { t.len() + 1 };
        prop_assert!(sam.num_states() <= bound, "{} states for {} tokens", sam.num_states(), t.len());
    }

    /// Every state lists its out-transitions newest first: by the first occurrence of the state's strings followed
    /// by the token, latest first (`transitions`' contract; a state split off another keeps its order).
    #[test]
    fn transitions_are_listed_newest_first(t in text(60)) {
        let sam = SuffixAutomaton::from_tokens(&t);
        for a in 0..t.len() {
            for l in 1..=4.min(t.len() - a) {
                let p = &t[a..a + l];
                let s = sam.find(p).expect("a substring occurs");
                // first end (index of the following token) of `p` followed by each token, in order of appearance
                let mut first: Vec<(usize, u32)> = Vec::new();
                for e in l..t.len() {
                    if &t[e - l..e] == p && !first.iter().any(|&(_, tok)| tok == t[e]) {
                        first.push((e, t[e]));
                    }
                }
                let want: Vec<u32> = first.iter().rev().map(|&(_, tok)| tok).collect();
                let got: Vec<u32> = sam.transitions(s).map(|(tok, _)| tok).collect();
                prop_assert_eq!(got, want, "pattern {:?} in {:?}", p, t);
            }
        }
    }

    /// Chain drafts copy exactly what the by-definition reference copies, with the same features.
    #[test]
    fn chain_draft_matches_brute_force(t in text(80), k in 1usize..10) {
        let mut sam = SuffixAutomaton::from_tokens(&t);
        let m = sam.longest_repeated_suffix();
        let mut got = Vec::new();
        if m.len > 0 { chain_draft(&mut sam, m, k, Source::Context, &mut got); }
        let l = rf::longest_repeated_suffix(&t);
        let want = if l > 0 { rf::chain(&t, &t[t.len() - l..], k, Source::Context) } else { Vec::new() };
        prop_assert_eq!(got, want);
    }

    /// Matching statistics of an external sequence against a corpus-like text with separators.
    #[test]
    fn matching_statistics(docs in prop::collection::vec(text(20), 1..4), ctx in text(30)) {
        let mut corpus = Vec::new();
        for d in &docs { corpus.extend_from_slice(d); corpus.push(rust_ngram::SEPARATOR); }
        let sam = SuffixAutomaton::from_tokens(&corpus);
        let mut m = rust_ngram::Match::default();
        for i in 0..ctx.len() {
            m = sam.advance(m, ctx[i]);
            prop_assert_eq!(m.len as usize, rf::longest_suffix_in(&corpus, &ctx[..=i]));
            prop_assert_eq!(rust_ngram::rematch(&sam, &ctx[..=i]).len, m.len);
        }
    }

    /// Random API call sequences (the same checker the cargo-fuzz target runs).
    #[test]
    fn api_sequences_match_model(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let ops = ops_from_bytes(&bytes);
        if let Err(e) = run_ops(&ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn api_sequences_match_model_response_donation_only(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let cfg = DrafterConfig { donate_prompts: false, ..check_config() };
        if let Err(e) = run_ops_with(&cfg, &ops_from_bytes(&bytes)) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Long periodic and constant texts (the degenerate case a naive occurrence walk is quadratic on) stay exact.
#[test]
fn repetitive_text_counts() {
    let t: Vec<u32> = (0..3000).map(|i| if i < 1500 { 5 } else { (i % 7) as u32 }).collect();
    let mut sam = SuffixAutomaton::from_tokens(&t);
    let m = sam.longest_repeated_suffix();
    assert_eq!(m.len as usize, rf::longest_repeated_suffix(&t));
    let s = sam.find(&[5, 5, 5]).unwrap();
    assert_eq!(sam.stats(s).occurrences, rf::followed(&t, &[5, 5, 5]).0);
    let s = sam.find(&[1, 2, 3]).unwrap();
    assert_eq!(sam.stats(s).last_end, rf::followed(&t, &[1, 2, 3]).1);
}
