//! Per-step cost split (extend vs propose) for one request at several context sizes, with a wall clock.
//! Run: `cargo run --release -p rust_ngram --example step_cost`.
//! Times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so a loaded shared machine does not inflate them.

/// Thread CPU time in seconds.
fn cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
use rust_ngram::synth::{edit_text, zipf_text};
use rust_ngram::{DraftBatch, Drafter, DrafterConfig};

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
}
