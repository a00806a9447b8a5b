//! Deterministic synthetic token streams for benchmarks and memory measurements (no data files needed).
//!
//! Not a substitute for real text (bench/drafters.py measures that); these streams only make the shapes that
//! matter for cost visible: a Zipf-like vocabulary, and an "edit" stream where a document is re-emitted with
//! small changes (the code-editing case, long matches).

/// xorshift64* generator: tiny, fast, reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a non-zero-ish seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Zipf-like token id in `0..vocab` (inverse-power sampling, exponent about 1).
    pub fn zipf(&mut self, vocab: u32) -> u32 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let r = ((vocab as f64).powf(u) - 1.0) as u32;
        r.min(vocab - 1)
    }
}

/// `n` Zipf-distributed tokens ("prose-like": short matches only).
pub fn zipf_text(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.zipf(vocab)).collect()
}

/// A document of `n / 2` Zipf tokens followed by an edited copy (about 1 edit per 50 tokens), truncated to `n`:
/// the code-editing shape, where the second half is mostly long matches into the first.
pub fn edit_text(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    let base: Vec<u32> = (0..n / 2 + 1).map(|_| r.zipf(vocab)).collect();
    let mut out = base.clone();
    let mut i = 0;
    while out.len() < n && i < base.len() {
        match r.below(50) {
            0 => {
                out.push(r.zipf(vocab));
                i += 1;
            }
            1 => i += 1 + r.below(3) as usize,
            2 => out.push(r.zipf(vocab)),
            _ => {
                out.push(base[i]);
                i += 1;
            }
        }
    }
    while out.len() < n {
        out.push(r.zipf(vocab));
    }
    out.truncate(n);
    out
}
