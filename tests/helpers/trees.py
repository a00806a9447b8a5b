"""Verify trees shared by test modules: the token path of every draft node (``paths``), and the verify-input tests'
batch of selector trees covering every case (``mixed_batch``)."""
from __future__ import annotations

import torch

from sglang_hybrid.selector import Candidates, Source, VerifyTree, select

#: the draft nodes of ``mixed_batch``'s trees (their width is ``N_NODES + 1``, the root included)
N_NODES = 6


def paths(tree, r):
    """Token path (tuple) of every valid draft node."""
    out = {}
    for i in range(1, int(tree.valid[r].sum())):
        p, j = [], i
        while j > 0:
            p.append(int(tree.tokens[r, j]))
            j = int(tree.parents[r, j])
        out[i] = tuple(reversed(p))
    return out


def cat_trees(trees) -> VerifyTree:
    return VerifyTree(*[torch.cat([getattr(t, f) for t in trees], 0) for f in VerifyTree._fields])


def mixed_batch() -> VerifyTree:
    """Rows: EAGLE chain chosen, n-gram chain chosen, nothing worth verifying (choose, lambda 0.3); two merged trees
    (one whose model branch is not a front prefix) and one with padding (merge, lambda 0)."""
    root = torch.tensor([5, 6, 7])
    m_tok = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9]])
    m_surv = torch.tensor([[.9, .8, .7, .6], [.5, .2, .1, .05], [.2, .1, .05, .01]])
    n_tok = torch.tensor([[11, 12, -1], [13, 14, 15], [16, -1, -1]])
    n_surv = torch.tensor([[.4, .1, 0], [.9, .9, .8], [.1, 0, 0]])
    choose = select(root, [Candidates.chain(m_tok, m_surv, torch.tensor([4, 4, 4]), Source.MODEL),
                           Candidates.chain(n_tok, n_surv, torch.tensor([2, 3, 1]), Source.NGRAM)],
                    0.3, mode="choose", n_nodes=N_NODES)
    root2 = torch.tensor([8, 9, 10])
    m2 = torch.tensor([[1, 2, 3, 4], [20, 21, 22, 23], [1, 2, -1, -1]])
    s2 = torch.tensor([[.9, .8, .3, .2], [.6, .5, .4, .3], [.5, .4, 0, 0]])
    n2 = torch.tensor([[1, 2, 9], [24, 25, 26], [3, -1, -1]])
    ns2 = torch.tensor([[.95, .9, .85], [.5, .4, .3], [.3, 0, 0]])
    merge = select(root2, [Candidates.chain(m2, s2, torch.tensor([4, 4, 2]), Source.MODEL),
                           Candidates.chain(n2, ns2, torch.tensor([3, 3, 1]), Source.NGRAM)],
                   0.0, mode="merge", n_nodes=N_NODES)
    return cat_trees([choose, merge])
