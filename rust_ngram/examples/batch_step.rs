//! Shows one batched decode step over many requests (default 128 x 32k context): `extend_batch`, then `propose`.
//!
//! Each request is first extended by the tokens it accepted (its previous draft checked against the true
//! continuation, + 1 bonus token), then one `propose` drafts for all of them: the step a serving engine runs (and
//! the one the project's `bench/drafters.py` measures).
//! Run: `cargo run --release -p rust_ngram --features parallel --example batch_step [-- stream.u32 [B] [ctx] [steps]]`
//! where `stream.u32` is raw little-endian u32 token ids (e.g. `bench.data.long_context_stream(...).tofile(...)`);
//! without it a synthetic edit stream is used. Prints wall-clock medians of the extend and propose halves, and the
//! process CPU time per step (all threads; on a busy shared machine the steadier number for comparing builds,
//! best read from a build without `--features parallel`).

use std::time::Instant;

use rust_ngram::{DraftBatch, Drafter, DrafterConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let b: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let ctx: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32_768);
    let steps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(20);
    let stream: Vec<u32> = match args.get(1) {
        Some(p) => std::fs::read(p)
            .expect("stream file")
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        None => rust_ngram::synth::edit_text(1 << 20, 50_000, 1),
    };
    let span = stream.len() - ctx - (steps + 4) * 9;
    let offs: Vec<usize> = (0..b).map(|i| (i * 7919) % span).collect();
    let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    let t0 = Instant::now();
    for (i, &o) in offs.iter().enumerate() {
        d.start(i as u64, &stream[o..o + ctx]).unwrap();
    }
    println!("setup {:.1} ms/request", t0.elapsed().as_secs_f64() * 1e3 / b as f64);
    let ids: Vec<u64> = (0..b as u64).collect();
    let mut pos: Vec<usize> = offs.iter().map(|&o| o + ctx).collect();
    let mut new: Vec<Vec<u32>> = pos.iter().map(|&p| vec![stream[p]]).collect();
    pos.iter_mut().for_each(|p| *p += 1);
    let mut out = DraftBatch::new(b, 8);
    let (mut te, mut tp, mut nt) = (Vec::new(), Vec::new(), 0usize);
    let mut cpu0 = 0.0;
    for s in 0..steps + 3 {
        if s == 3 {
            cpu0 = cpu_seconds();
        }
        let flat: Vec<u32> = new.concat();
        let mut offsets = vec![0usize];
        for t in &new {
            offsets.push(offsets.last().unwrap() + t.len());
        }
        let t0 = Instant::now();
        d.extend_batch(&ids, &flat, &offsets).unwrap();
        let t1 = Instant::now();
        d.propose(&ids, 8, &mut out.rows()).unwrap();
        let t2 = Instant::now();
        if s < 3 {
            println!(
                "warm-up step {s}: extend {:.2} ms, propose {:.2} ms",
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3
            );
        } else {
            te.push((t1 - t0).as_secs_f64() * 1e3);
            tp.push((t2 - t1).as_secs_f64() * 1e3);
            nt += flat.len();
        }
        for i in 0..b {
            let row = out.row_tokens(i);
            let acc = row.iter().zip(&stream[pos[i]..]).take_while(|(a, b)| **a as u32 == **b).count();
            new[i] = stream[pos[i]..pos[i] + acc + 1].to_vec();
            pos[i] += acc + 1;
        }
    }
    let cpu_ms = (cpu_seconds() - cpu0) * 1e3 / steps as f64;
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{b} x {ctx}: extend median {:.3} ms ({:.1} tokens/step), propose median {:.3} ms, CPU {cpu_ms:.3} ms/step",
        med(&mut te),
        nt as f64 / steps as f64,
        med(&mut tp)
    );
}

/// CPU time of the whole process (every thread), in seconds.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
