//! Drafter behaviour that the random sequences reach only by chance: errors leave state intact, duplicates in
//! one batch, finished requests, memory release, parallel batches equal sequential ones.

use rust_ngram::synth::edit_text;
use rust_ngram::{DraftBatch, Drafter, DrafterConfig, DrafterError};

fn snapshot(d: &mut Drafter, ids: &[u64]) -> DraftBatch {
    let mut out = DraftBatch::new(ids.len(), 8);
    d.propose(ids, 8, &mut out.rows()).unwrap();
    out
}

#[test]
fn rejected_calls_change_nothing() {
    let mut d =
        Drafter::new(DrafterConfig { vocab_size: Some(10), corpus_cap_tokens: 100, ..Default::default() }).unwrap();
    d.start(1, &[1, 2, 3, 1, 2]).unwrap();
    d.start(2, &[4, 5, 4]).unwrap();
    let before = snapshot(&mut d, &[1, 2]);
    assert_eq!(d.start(1, &[1]), Err(DrafterError::DuplicateRequest(1)));
    assert_eq!(d.extend(3, &[1]), Err(DrafterError::UnknownRequest(3)));
    assert_eq!(d.extend(1, &[1, 10]), Err(DrafterError::TokenOutOfRange { token: 10, vocab_size: Some(10) }));
    assert!(matches!(d.extend_batch(&[1, 1], &[1, 2], &[0, 1, 2]), Err(DrafterError::InvalidArgument(_))));
    assert!(matches!(d.extend_batch(&[1, 2], &[1, 2], &[0, 2, 1]), Err(DrafterError::InvalidArgument(_))));
    assert_eq!(d.extend_batch(&[1, 7], &[1, 2], &[0, 1, 2]), Err(DrafterError::UnknownRequest(7)));
    let mut out = DraftBatch::new(2, 8);
    assert!(matches!(d.propose(&[1, 2], 9, &mut out.rows()), Err(DrafterError::InvalidArgument(_))));
    assert_eq!(d.propose(&[1, 5], 8, &mut out.rows()), Err(DrafterError::UnknownRequest(5)));
    let mut small = DraftBatch::new(1, 8);
    assert!(matches!(d.propose(&[1, 2], 8, &mut small.rows()), Err(DrafterError::InvalidArgument(_))));
    assert_eq!(snapshot(&mut d, &[1, 2]), before);
    assert_eq!(d.context_len(1), Ok(5));
    assert!(Drafter::new(DrafterConfig { min_match: 0, ..Default::default() }).is_err());
    assert!(Drafter::new(DrafterConfig { vocab_size: Some(0), ..Default::default() }).is_err());
}

/// With `donate_prompts: false` only the response is donated; with it, prompt + response as one document, and a
/// request never matches text donated by itself (it is finished before its donation exists).
#[test]
fn prompt_donation_switch() {
    let t = edit_text(3000, 600, 5);
    for donate_prompts in [false, true] {
        let mut d = Drafter::new(DrafterConfig { donate_prompts, ..Default::default() }).unwrap();
        d.start(1, &t[..2000]).unwrap();
        d.extend(1, &t[2000..2500]).unwrap();
        d.finish(1, true).unwrap();
        let held = d.corpus().donated_tokens();
        assert_eq!(held, if donate_prompts { 2501 } else { 501 });
        // A second request with the same prompt: with prompt donation its corpus match covers its whole prompt,
        // yet its first draft comes from the corpus only because the corpus match is strictly longer than its own.
        d.start(2, &t[..2000]).unwrap();
        let out = snapshot(&mut d, &[2]);
        if donate_prompts {
            assert_eq!(out.source[0], 1, "the donated prompt continues into the donated response");
            assert_eq!(
                out.row_tokens(0),
                t[2000..2000 + out.lengths[0] as usize].iter().map(|&x| x as i32).collect::<Vec<_>>()
            );
        }
        // Finishing request 2 donates again; neither request can draft any more (both finished).
        d.finish(2, true).unwrap();
        assert_eq!(snapshot(&mut d, &[1, 2]).lengths, vec![0, 0]);
        assert!(d.corpus().donated_tokens() <= d.config().corpus_cap_tokens + 2);
    }
}

#[test]
fn duplicates_finished_and_memory() {
    let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    let t = edit_text(5000, 1000, 3);
    d.start(1, &t).unwrap();
    d.start(2, &t[..100]).unwrap();
    let out = snapshot(&mut d, &[2, 1, 2, 1]);
    assert_eq!(out.row_tokens(0), out.row_tokens(2));
    assert_eq!(out.row_tokens(1), out.row_tokens(3));
    assert!(out.lengths[1] > 0);
    let m1 = d.request_memory_bytes(1).unwrap();
    assert!(m1 > 5000 * 20 && m1 <= 5000 * 200);
    d.finish(1, true).unwrap();
    assert!(d.request_memory_bytes(1).unwrap() < 1024);
    assert_eq!(d.finish(1, true), Err(DrafterError::Finished(1)));
    assert_eq!(d.extend(1, &[1]), Err(DrafterError::Finished(1)));
    assert_eq!(snapshot(&mut d, &[1]).lengths, vec![0]);
    // With prompt donation (the default) the whole context is donated, separator included.
    assert_eq!(d.corpus().donated_tokens(), 5001);
    d.remove(1).unwrap();
    assert!(!d.contains(1));
    assert_eq!(d.remove(1), Err(DrafterError::UnknownRequest(1)));
}

#[test]
fn batched_calls_equal_one_by_one() {
    let mut a = Drafter::new(DrafterConfig::default()).unwrap();
    let mut b = a.clone();
    let streams: Vec<Vec<u32>> = (0..20).map(|i| edit_text(600, 300, i)).collect();
    for (i, s) in streams.iter().enumerate() {
        a.start(i as u64, &s[..400]).unwrap();
        b.start(i as u64, &s[..400]).unwrap();
    }
    let ids: Vec<u64> = (0..20).rev().collect();
    for step in 0..50 {
        let mut flat = Vec::new();
        let mut offs = vec![0];
        for &id in &ids {
            let s = &streams[id as usize];
            let n = (id as usize + step) % 3;
            let start = 400 + 2 * step;
            flat.extend_from_slice(&s[start..start + n]);
            offs.push(flat.len());
            b.extend(id, &s[start..start + n]).unwrap();
        }
        a.extend_batch(&ids, &flat, &offs).unwrap();
        let mut oa = DraftBatch::new(20, 8);
        a.propose(&ids, 8, &mut oa.rows()).unwrap();
        for (row, &id) in ids.iter().enumerate() {
            let mut ob = DraftBatch::new(1, 8);
            b.propose(&[id], 8, &mut ob.rows()).unwrap();
            assert_eq!(oa.row_tokens(row), ob.row_tokens(0));
            assert_eq!(oa.count[row * 8..row * 8 + 8], ob.count[..]);
        }
        let mut ta = DraftBatch::new(20, 8);
        a.propose_tree(&ids, 8, &mut ta.rows()).unwrap();
        let mut tb = DraftBatch::new(1, 8);
        b.propose_tree(&[ids[3]], 8, &mut tb.rows()).unwrap();
        assert_eq!(ta.row_tokens(3), tb.row_tokens(0));
    }
}
