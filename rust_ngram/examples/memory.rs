//! Shows the heap bytes per context token of one request's automaton for several text shapes and sizes.
//!
//! Before and after `shrink_to_fit`. Run: `cargo run --release -p rust_ngram --example memory`.

use rust_ngram::synth::{edit_text, zipf_text};
use rust_ngram::SuffixAutomaton;

fn main() {
    println!(
        "{:<10} {:>8} {:>8} {:>8} {:>12} {:>12}",
        "text", "tokens", "states", "trans", "bytes/token", "after_shrink"
    );
    for &n in &[1_000usize, 8_000, 32_000, 128_000, 1_000_000] {
        let texts: Vec<(&str, Vec<u32>)> = vec![
            ("zipf", zipf_text(n, 50_000, 1)),
            ("edit", edit_text(n, 50_000, 2)),
            ("const", vec![7; n]),
            ("period7", (0..n).map(|i| (i % 7) as u32).collect()),
        ];
        for (name, t) in texts {
            // Grown token by token, as a request is (no up-front capacity).
            let mut sam = SuffixAutomaton::new();
            for &x in &t {
                sam.push(x);
            }
            let grown = sam.memory_bytes() as f64 / n as f64;
            sam.shrink_to_fit();
            let shrunk = sam.memory_bytes() as f64 / n as f64;
            println!(
                "{:<10} {:>8} {:>8} {:>8} {:>12.1} {:>12.1}",
                name,
                n,
                sam.num_states(),
                sam.num_transitions(),
                grown,
                shrunk
            );
        }
    }
}
