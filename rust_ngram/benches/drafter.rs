//! Criterion benchmarks: per-step cost (propose k=8 + extend by the accepted token) for one request at
//! 1k/8k/32k context, one batched step for 128 requests x 32k, building a 32k prompt, and tree proposals.
//!
//! Run: `cargo bench -p rust_ngram --features parallel` (the batch benefits from `parallel`).
//! Text: `synth::edit_text` (a document followed by an edited copy), deterministic.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rust_ngram::synth::edit_text;
use rust_ngram::{DraftBatch, Drafter, DrafterConfig, SuffixAutomaton};

const VOCAB: u32 = 50_000;

fn drafter() -> Drafter {
    Drafter::new(DrafterConfig { max_draft: 8, ..Default::default() }).unwrap()
}

/// One request at context `n`: each timed step = propose(k=8) + extend(1 token). Every 256 steps the drafter is
/// reset from an untimed clone, so the context stays within 256 tokens of `n`.
fn step_single(c: &mut Criterion) {
    let mut g = c.benchmark_group("step_single");
    for &n in &[1_000usize, 8_000, 32_000] {
        let stream = edit_text(n + 300, VOCAB, 7);
        let mut base = drafter();
        base.start(1, &stream[..n]).unwrap();
        g.bench_with_input(BenchmarkId::new("propose8+extend1", n), &n, |b, &n| {
            let mut out = DraftBatch::new(1, 8);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0u64;
                while done < iters {
                    let mut d = base.clone();
                    let m = (iters - done).min(256);
                    let t0 = Instant::now();
                    for j in 0..m as usize {
                        d.propose(&[1], 8, &mut out.rows()).unwrap();
                        d.extend(1, &stream[n + j..n + j + 1]).unwrap();
                    }
                    total += t0.elapsed();
                    black_box(&out);
                    done += m;
                }
                total
            })
        });
    }
    g.finish();
}

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("build");
    let t = edit_text(32_000, VOCAB, 11);
    g.bench_function("start_32k", |b| {
        b.iter(|| {
            let mut d = drafter();
            d.start(1, black_box(&t)).unwrap();
            d
        })
    });
    g.bench_function("automaton_32k", |b| b.iter(|| SuffixAutomaton::from_tokens(black_box(&t))));
    g.finish();
}

/// 128 requests x 32k: one step = extend_batch(1 token each) + propose(k=8) for all 128, in one call each.
fn step_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("step_batch");
    g.sample_size(10);
    let b_sz = 128usize;
    let n = 32_000usize;
    let streams: Vec<Vec<u32>> = (0..b_sz).map(|i| edit_text(n + 20_000, VOCAB, 100 + i as u64)).collect();
    let mut d = drafter();
    for (i, s) in streams.iter().enumerate() {
        d.start(i as u64, &s[..n]).unwrap();
    }
    let ids: Vec<u64> = (0..b_sz as u64).collect();
    let offsets: Vec<usize> = (0..=b_sz).collect();
    let mut pos = n;
    let mut out = DraftBatch::new(b_sz, 8);
    g.bench_function("128x32k_propose8+extend1", |b| {
        b.iter(|| {
            d.propose(&ids, 8, &mut out.rows()).unwrap();
            let toks: Vec<u32> = streams.iter().map(|s| s[pos % s.len()]).collect();
            d.extend_batch(&ids, &toks, &offsets).unwrap();
            pos += 1;
        })
    });
    g.finish();
}

fn tree(c: &mut Criterion) {
    let mut g = c.benchmark_group("tree");
    let n = 32_000;
    let stream = rust_ngram::synth::zipf_text(n, VOCAB, 5);
    let mut d = drafter();
    d.start(1, &stream).unwrap();
    let mut out = DraftBatch::new(1, 8);
    g.bench_function("propose_tree8_32k_zipf", |b| b.iter(|| d.propose_tree(&[1], 8, &mut out.rows()).unwrap()));
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! { name = benches; config = config(); targets = step_single, build, step_batch, tree }
criterion_main!(benches);
