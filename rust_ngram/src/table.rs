//! Open-addressing hash table `(state, token) -> target state` for automaton transitions.
//!
//! Why a custom table: a suffix automaton over a 100k-token vocabulary has a few transitions per context token;
//! a general-purpose map stores 16-byte aligned entries plus per-map overhead, while this one packs 12 bytes per
//! slot (a `u64` key, a `u32` value) with linear probing and never deletes (automata only add transitions or
//! redirect them in place). Invariants: `len <= 3/4 * capacity`; capacity is a power of two; a key is never
//! `EMPTY` because state ids stay below `u32::MAX`.

const EMPTY: u64 = u64::MAX;

#[derive(Clone, Debug, Default)]
pub(crate) struct TransitionTable {
    keys: Vec<u64>,
    vals: Vec<u32>,
    len: usize,
    shift: u32,
}

#[inline]
fn key(state: u32, token: u32) -> u64 {
    ((state as u64) << 32) | token as u64
}

impl TransitionTable {
    pub fn with_capacity(n: usize) -> Self {
        let mut t = TransitionTable::default();
        let cap = (n * 4 / 3 + 1).next_power_of_two().max(16);
        t.alloc(cap);
        t
    }

    fn alloc(&mut self, cap: usize) {
        self.keys = vec![EMPTY; cap];
        self.vals = vec![0; cap];
        self.shift = 64 - cap.trailing_zeros();
        self.len = 0;
    }

    #[inline]
    fn slot(&self, k: u64) -> usize {
        // Fibonacci hashing: the high bits of a multiplicative hash.
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn capacity_bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.vals.capacity() * 4
    }

    #[inline]
    pub fn get(&self, state: u32, token: u32) -> Option<u32> {
        if self.keys.is_empty() {
            return None;
        }
        let k = key(state, token);
        let mask = self.keys.len() - 1;
        let mut i = self.slot(k);
        loop {
            let s = self.keys[i];
            if s == k {
                return Some(self.vals[i]);
            }
            if s == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts or overwrites; returns true when the key was new.
    pub fn set(&mut self, state: u32, token: u32, target: u32) -> bool {
        if (self.len + 1) * 4 > self.keys.len() * 3 {
            self.grow();
        }
        let k = key(state, token);
        let mask = self.keys.len() - 1;
        let mut i = self.slot(k);
        loop {
            let s = self.keys[i];
            if s == k {
                self.vals[i] = target;
                return false;
            }
            if s == EMPTY {
                self.keys[i] = k;
                self.vals[i] = target;
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old_keys = std::mem::take(&mut self.keys);
        let old_vals = std::mem::take(&mut self.vals);
        let cap = (old_keys.len() * 2).max(16);
        self.alloc(cap);
        let mask = cap - 1;
        for (k, v) in old_keys.into_iter().zip(old_vals) {
            if k != EMPTY {
                let mut i = self.slot(k);
                while self.keys[i] != EMPTY {
                    i = (i + 1) & mask;
                }
                self.keys[i] = k;
                self.vals[i] = v;
                self.len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TransitionTable;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_hashmap_through_growth_and_overwrites() {
        let mut t = TransitionTable::default();
        let mut m = HashMap::new();
        let mut x = 12345u64;
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (s, tok) = ((x % 3000) as u32, ((x >> 20) % 50) as u32 | if i % 97 == 0 { u32::MAX - 1 } else { 0 });
            let new = t.set(s, tok, i);
            assert_eq!(new, m.insert((s, tok), i).is_none());
            assert!(t.len() * 4 <= t.keys.len() * 3);
        }
        assert_eq!(t.len(), m.len());
        for (&(s, tok), &v) in &m {
            assert_eq!(t.get(s, tok), Some(v));
        }
        assert_eq!(t.get(4000, 1), None);
        assert_eq!(TransitionTable::default().get(0, 0), None);
    }
}
