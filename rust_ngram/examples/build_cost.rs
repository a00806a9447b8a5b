//! Shows the cost of building a suffix automaton, per token, at several prompt sizes, and the automaton's shape.
//!
//! Wall clock, best of 3; shape = states, transitions and heap bytes per token.
//! Run: `cargo run --release -p rust_ngram --example build_cost [-- stream.u32]` (raw little-endian u32 ids;
//! without it a synthetic edit stream is used).

use std::time::Instant;

use rust_ngram::SuffixAutomaton;

fn main() {
    let stream: Vec<u32> = match std::env::args().nth(1) {
        Some(p) => std::fs::read(p)
            .expect("stream file")
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        None => rust_ngram::synth::edit_text(1 << 20, 50_000, 1),
    };
    for &n in &[8_192usize, 32_768, 131_072, 524_288] {
        if n > stream.len() {
            break;
        }
        let mut best = f64::MAX;
        let mut shape = (0, 0, 0);
        for _ in 0..3 {
            let t0 = Instant::now();
            let s = SuffixAutomaton::from_tokens(&stream[..n]);
            best = best.min(t0.elapsed().as_secs_f64());
            shape = (s.num_states(), s.num_transitions(), s.memory_bytes());
        }
        println!(
            "n={n:>7}: {:.2} ms ({:.0} ns/token); states {:.2} n, transitions {:.2} n, {:.0} B/token",
            best * 1e3,
            best * 1e9 / n as f64,
            shape.0 as f64 / n as f64,
            shape.1 as f64 / n as f64,
            shape.2 as f64 / n as f64
        );
    }
}
