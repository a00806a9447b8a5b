//! Link-cut tree over the suffix-link tree, maintaining per-state occurrence statistics online.
//!
//! Why: the number of end positions of a suffix-automaton state (its occurrence count) and the most recent
//! of them change for *every* ancestor of the newest prefix state on each append. Walking that root path is
//! O(depth) per token, which degenerates to O(n) on repetitive text (an LLM stuck in a loop, `aaaa...`),
//! exactly where n-gram drafting matters most. A link-cut tree applies "+1 occurrence, latest end = i" to a
//! whole root path with a lazy tag in amortised O(log n), and supports the two structural edits a suffix
//! automaton makes (hang a new leaf, split an edge with a clone).
//!
//! Invariant: for every node `x`, the *true* statistics are the stored `cnt[x]`/`last[x]` combined with the
//! pending tags of its ancestors inside its splay (auxiliary) tree. [`Lct::get`] splays `x` first, after which
//! the stored values of `x` are exact.

pub(crate) const NIL: u32 = u32::MAX;

/// Per-node statistics: `cnt` = number of recorded end positions, `last` = latest recorded end position + 1
/// (0 = none recorded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stat {
    pub cnt: u32,
    pub last: u32,
}

/// 29 bytes of fields padded to 32 and aligned, so a node never straddles two cache lines: every LCT operation
/// on a large (out-of-cache) automaton is a chain of dependent node reads, one miss each instead of up to two.
#[derive(Clone, Copy, Debug)]
#[repr(align(32))]
struct Node {
    ch: [u32; 2],
    /// Splay parent, or path-parent when this node is the root of its splay tree.
    fa: u32,
    /// True when `fa` is a splay parent (this node is `ch[0]` or `ch[1]` of `fa`), false when this node is the
    /// root of its splay tree. Kept in the node (it fits the padding) so that [`Lct::is_aux_root`] reads one node,
    /// not also the parent's children: a statistics query on an out-of-cache automaton costs one miss less.
    child: bool,
    stat: Stat,
    /// Pending update for the splay subtree below this node (already applied to the node itself).
    tag: Stat,
}

const _: () = assert!(std::mem::size_of::<Node>() == 32);

impl Node {
    const FRESH: Node =
        Node { ch: [NIL, NIL], fa: NIL, child: false, stat: Stat { cnt: 0, last: 0 }, tag: Stat { cnt: 0, last: 0 } };
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Lct {
    nodes: Vec<Node>,
    stack: Vec<u32>,
}

impl Lct {
    pub fn with_capacity(n: usize) -> Self {
        Lct { nodes: Vec::with_capacity(n), stack: Vec::new() }
    }

    /// Adds a detached node (a tree root of its own) with the given statistics; returns its index.
    pub fn push(&mut self, stat: Stat) -> u32 {
        let mut n = Node::FRESH;
        n.stat = stat;
        self.nodes.push(n);
        (self.nodes.len() - 1) as u32
    }

    /// Hints the CPU to load node `x` (see [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self, x: u32) {
        crate::prefetch(&self.nodes[x as usize]);
    }

    pub fn capacity_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>() + self.stack.capacity() * 4
    }

    pub fn shrink_to_fit(&mut self) {
        self.nodes.shrink_to_fit();
        self.stack = Vec::new();
    }

    #[inline]
    fn is_aux_root(&self, x: u32) -> bool {
        !self.nodes[x as usize].child
    }

    #[inline]
    fn apply(&mut self, x: u32, t: Stat) {
        if x == NIL {
            return;
        }
        let n = &mut self.nodes[x as usize];
        n.stat.cnt += t.cnt;
        n.stat.last = n.stat.last.max(t.last);
        n.tag.cnt += t.cnt;
        n.tag.last = n.tag.last.max(t.last);
    }

    #[inline]
    fn push_down(&mut self, x: u32) {
        let n = self.nodes[x as usize];
        if n.tag.cnt != 0 || n.tag.last != 0 {
            self.apply(n.ch[0], n.tag);
            self.apply(n.ch[1], n.tag);
            self.nodes[x as usize].tag = Stat::default();
        }
    }

    #[inline]
    fn rotate(&mut self, x: u32) {
        let y = self.nodes[x as usize].fa;
        let z = self.nodes[y as usize].fa;
        let dx = (self.nodes[y as usize].ch[1] == x) as usize;
        let y_child = self.nodes[y as usize].child;
        if y_child {
            let dy = (self.nodes[z as usize].ch[1] == y) as usize;
            self.nodes[z as usize].ch[dy] = x;
        }
        // x takes y's place (a child of z, or the splay root with z as path-parent); y becomes x's child.
        self.nodes[x as usize].fa = z;
        self.nodes[x as usize].child = y_child;
        self.nodes[y as usize].child = true;
        let b = self.nodes[x as usize].ch[dx ^ 1];
        self.nodes[y as usize].ch[dx] = b;
        if b != NIL {
            self.nodes[b as usize].fa = y;
        }
        self.nodes[x as usize].ch[dx ^ 1] = y;
        self.nodes[y as usize].fa = x;
    }

    fn splay(&mut self, x: u32) {
        // Push pending tags from the splay root down to x (x included).
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let mut y = x;
        stack.push(y);
        while !self.is_aux_root(y) {
            y = self.nodes[y as usize].fa;
            stack.push(y);
        }
        while let Some(z) = stack.pop() {
            self.push_down(z);
        }
        self.stack = stack;
        while !self.is_aux_root(x) {
            let y = self.nodes[x as usize].fa;
            if !self.is_aux_root(y) {
                let z = self.nodes[y as usize].fa;
                let zig_zig = (self.nodes[y as usize].ch[1] == x) == (self.nodes[z as usize].ch[1] == y);
                if zig_zig {
                    self.rotate(y);
                } else {
                    self.rotate(x);
                }
            }
            self.rotate(x);
        }
    }

    /// Makes the tree path root..x preferred; afterwards x is the root of its splay tree, which holds exactly
    /// that path (x has no right child).
    fn access(&mut self, x: u32) {
        let mut last = NIL;
        let mut y = x;
        while y != NIL {
            self.splay(y);
            // The old right child leaves y's splay tree (y stays its path-parent); `last` joins it.
            let old = self.nodes[y as usize].ch[1];
            if old != NIL {
                self.nodes[old as usize].child = false;
            }
            if last != NIL {
                self.nodes[last as usize].child = true;
            }
            self.nodes[y as usize].ch[1] = last;
            last = y;
            y = self.nodes[y as usize].fa;
        }
        self.splay(x);
    }

    /// Exact statistics of `x` (amortised O(log n)).
    ///
    /// Reads first: the pending tags of `x`'s ancestors in its splay tree, summed on the way up, complete its
    /// stored value, so a shallow node costs a few reads and no writes. Only a node deeper than `READ_DEPTH` is
    /// splayed (which keeps the amortised bound: deep nodes get restructured).
    pub fn get(&mut self, x: u32) -> Stat {
        const READ_DEPTH: usize = 24;
        let mut st = self.nodes[x as usize].stat;
        let mut y = x;
        for _ in 0..READ_DEPTH {
            if self.is_aux_root(y) {
                return st;
            }
            y = self.nodes[y as usize].fa;
            let t = self.nodes[y as usize].tag;
            st.cnt += t.cnt;
            st.last = st.last.max(t.last);
        }
        self.splay(x);
        self.nodes[x as usize].stat
    }

    /// Records one more end position `pos` on every node of the tree path root..x.
    pub fn add_path(&mut self, x: u32, pos: u32) {
        self.access(x);
        self.apply(x, Stat { cnt: 1, last: pos + 1 });
    }

    /// Hangs `child` below `parent`. Precondition: `child` is a tree root that is also the root of its splay
    /// tree with no left child — true for a fresh node and for a node just returned by [`cut`](Self::cut) — so
    /// the link is a single path-parent pointer and needs no `access`.
    pub fn link(&mut self, child: u32, parent: u32) {
        debug_assert!(self.is_aux_root(child) && self.nodes[child as usize].fa == NIL, "link: child must be a root");
        debug_assert_eq!(self.nodes[child as usize].ch[0], NIL, "link: child must be a tree root");
        self.nodes[child as usize].fa = parent;
    }

    /// Detaches `x` from its tree parent; returns the exact statistics of `x`.
    pub fn cut(&mut self, x: u32) -> Stat {
        self.access(x);
        let l = self.nodes[x as usize].ch[0];
        if l != NIL {
            self.nodes[l as usize].fa = NIL;
            self.nodes[l as usize].child = false;
            self.nodes[x as usize].ch[0] = NIL;
        }
        self.nodes[x as usize].stat
    }
}

#[cfg(test)]
mod tests {
    use super::{Lct, Stat, NIL};

    /// Random hang / re-hang (cut + link) / root-path updates against an explicit parent array.
    #[test]
    fn agrees_with_naive_forest() {
        let mut lct = Lct::default();
        let mut parent: Vec<u32> = Vec::new();
        let mut naive: Vec<Stat> = Vec::new();
        let mut x = 99u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..4000u32 {
            let n = parent.len() as u64;
            match if n < 2 { 0 } else { rnd(4) } {
                0 => {
                    let id = lct.push(Stat::default());
                    naive.push(Stat::default());
                    parent.push(NIL);
                    if n > 0 {
                        let p = rnd(n) as u32;
                        lct.link(id, p);
                        parent[id as usize] = p;
                    }
                }
                1 => {
                    // Split the edge above a non-root node with a fresh node carrying its statistics (a clone).
                    let q = rnd(n) as u32;
                    if parent[q as usize] != NIL {
                        let p = parent[q as usize];
                        let st = lct.cut(q);
                        assert_eq!(st, naive[q as usize]);
                        let c = lct.push(st);
                        naive.push(st);
                        parent.push(p);
                        lct.link(c, p);
                        lct.link(q, c);
                        parent[q as usize] = c;
                    }
                }
                2 => {
                    let v = rnd(n) as u32;
                    lct.add_path(v, step);
                    let mut a = v;
                    while a != NIL {
                        naive[a as usize].cnt += 1;
                        naive[a as usize].last = step + 1;
                        a = parent[a as usize];
                    }
                }
                _ => {
                    let v = rnd(n) as u32;
                    assert_eq!(lct.get(v), naive[v as usize]);
                }
            }
        }
        for v in 0..parent.len() as u32 {
            assert_eq!(lct.get(v), naive[v as usize]);
        }
    }
}
