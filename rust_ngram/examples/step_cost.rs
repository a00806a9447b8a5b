//! Shows the per-step cost split (propose vs extend) for one request at several context sizes, and one batch step.
//!
//! Run: `cargo run --release -p rust_ngram --example step_cost` (add `--features parallel` for a parallel batch).
//! Single-request times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so a loaded shared machine does not
//! inflate them; the batch step (128 requests x 32k) reports process CPU time (all threads) and wall time.

use rust_ngram::synth::{edit_text, zipf_text};
use rust_ngram::{DraftBatch, Drafter, DrafterConfig};

/// Thread CPU time in seconds.
fn cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    for (name, gen) in [("edit", edit_text as fn(usize, u32, u64) -> Vec<u32>), ("zipf", zipf_text)] {
        for &n in &[1_000usize, 8_000, 32_000, 128_000] {
            let steps = 4000;
            let t = gen(n + steps, 50_000, 3);
            let mut d = Drafter::new(DrafterConfig::default()).unwrap();
            let t0 = cpu();
            d.start(1, &t[..n]).unwrap();
            let build = cpu() - t0;
            let mut out = DraftBatch::new(1, 8);
            let (mut tp, mut te) = (0f64, 0f64);
            let mut drafted = 0usize;
            for j in 0..steps {
                let a = cpu();
                d.propose(&[1], 8, &mut out.rows()).unwrap();
                let b = cpu();
                d.extend(1, &t[n + j..n + j + 1]).unwrap();
                let c = cpu();
                tp += b - a;
                te += c - b;
                drafted += out.lengths[0] as usize;
            }
            println!(
                "{name} n={n:>7}: build {:.1} ms ({:.2} us/token), propose {:.2} us, extend {:.2} us, mean draft len {:.2}",
                build * 1e3,
                build * 1e6 / n as f64,
                tp * 1e6 / steps as f64,
                te * 1e6 / steps as f64,
                drafted as f64 / steps as f64
            );
        }
    }

    // One batched step for 128 requests x 32k: process CPU time (all threads) and wall time.
    let (b, n) = (128usize, 32_000usize);
    let streams: Vec<Vec<u32>> = (0..b).map(|i| edit_text(n + 400, 50_000, 100 + i as u64)).collect();
    let mut d = Drafter::new(DrafterConfig::default()).unwrap();
    for (i, s) in streams.iter().enumerate() {
        d.start(i as u64, &s[..n]).unwrap();
    }
    let ids: Vec<u64> = (0..b as u64).collect();
    let offsets: Vec<usize> = (0..=b).collect();
    let mut out = DraftBatch::new(b, 8);
    let steps = 300;
    let (c0, w0) = (pcpu(), std::time::Instant::now());
    let mut drafted = 0usize;
    let mut prop_cpu = 0f64;
    for j in 0..steps {
        let p0 = pcpu();
        d.propose(&ids, 8, &mut out.rows()).unwrap();
        prop_cpu += pcpu() - p0;
        drafted += out.lengths.iter().map(|&l| l as usize).sum::<usize>();
        let toks: Vec<u32> = streams.iter().map(|s| s[n + j]).collect();
        d.extend_batch(&ids, &toks, &offsets).unwrap();
    }
    println!("batch propose share: {:.3} ms CPU per step", prop_cpu * 1e3 / steps as f64);
    println!(
        "batch {b} x {n}: one step (propose k=8 + extend 1, all requests in one call each) {:.3} ms CPU (all threads), {:.3} ms wall; mean draft len {:.2}; {:.1} bytes/token",
        (pcpu() - c0) * 1e3 / steps as f64,
        w0.elapsed().as_secs_f64() * 1e3 / steps as f64,
        drafted as f64 / (steps * b) as f64,
        d.memory_bytes() as f64 / (b * (n + steps)) as f64
    );
}

/// Process CPU time in seconds (all threads).
fn pcpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
