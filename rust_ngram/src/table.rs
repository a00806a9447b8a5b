//! Open-addressing hash table `(state, token) -> target state` for automaton transitions.
//!
//! Why a custom table: a suffix automaton over a 100k-token vocabulary has a few transitions per context token;
//! a general-purpose map stores 16-byte aligned entries plus per-map overhead, while this one packs 12 bytes per
//! slot (state, token, target as three `u32`, in one place so a hit costs one cache miss, not two) with linear
//! probing and never deletes (automata only add transitions or redirect them in place). Invariants:
//! `len <= 3/4 * capacity`; capacity is a power of two; a slot's state is never `EMPTY` because state ids stay
//! below `u32::MAX`.

const EMPTY: u32 = u32::MAX;

/// One slot: key `(state, token)` and value `target`; `state == EMPTY` marks a free slot.
#[derive(Clone, Copy, Debug)]
struct Slot {
    state: u32,
    token: u32,
    target: u32,
}

const FREE: Slot = Slot { state: EMPTY, token: 0, target: 0 };

#[derive(Clone, Debug, Default)]
pub(crate) struct TransitionTable {
    slots: Vec<Slot>,
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
        self.slots = vec![FREE; cap];
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
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    #[inline]
    pub fn get(&self, state: u32, token: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.slot(key(state, token));
        loop {
            let s = self.slots[i];
            if s.state == state && s.token == token {
                return Some(s.target);
            }
            if s.state == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Hints the CPU to load the slot where a lookup of `(state, token)` starts (see [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self, state: u32, token: u32) {
        if !self.slots.is_empty() {
            crate::prefetch(&self.slots[self.slot(key(state, token))]);
        }
    }

    /// Inserts or overwrites; returns true when the key was new.
    pub fn set(&mut self, state: u32, token: u32, target: u32) -> bool {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.slot(key(state, token));
        loop {
            let s = &mut self.slots[i];
            if s.state == state && s.token == token {
                s.target = target;
                return false;
            }
            if s.state == EMPTY {
                *s = Slot { state, token, target };
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        let cap = (old.len() * 2).max(16);
        self.alloc(cap);
        let mask = cap - 1;
        for s in old {
            if s.state != EMPTY {
                let mut i = self.slot(key(s.state, s.token));
                while self.slots[i].state != EMPTY {
                    i = (i + 1) & mask;
                }
                self.slots[i] = s;
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
            assert!(t.len() * 4 <= t.slots.len() * 3);
        }
        assert_eq!(t.len(), m.len());
        for (&(s, tok), &v) in &m {
            assert_eq!(t.get(s, tok), Some(v));
        }
        assert_eq!(t.get(4000, 1), None);
        assert_eq!(TransitionTable::default().get(0, 0), None);
    }
}
