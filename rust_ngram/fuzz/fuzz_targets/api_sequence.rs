//! Random API call sequences against the brute-force model (`rust_ngram::check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ops = rust_ngram::check::ops_from_bytes(data);
    if let Err(e) = rust_ngram::check::run_ops(&ops) {
        panic!("drafter disagrees with the brute-force model: {e}");
    }
});
