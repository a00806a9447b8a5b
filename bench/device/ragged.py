"""The plugin's ragged verify layout on the device: one captured graph per total-token tier serves any split.

    python -m bench.device.ragged             # GPU: CUDA graph + sync check + timing; no GPU: the CPU mode (below)

Why: the ragged verify (``sglang_plugin/ragged/layout.py``) packs each request's own ``n_b`` tree nodes back to back
with its own tree mask, so a request verifying a 28-token n-gram copy no longer makes its neighbours pay 28. For that
to run in a CUDA graph, the build must be sync-free with every shape fixed by the total ``T`` (and host bounds), and a
graph captured for one split of ``T`` over the requests must be right for every other split. The real consumers
(SGLang's Triton extend kernel, FlashInfer) are not on the GPU machine: this job checks the plugin's own layout on
CUDA and a plain-torch consumer of it; SGLang's Triton extend kernel is checked against the same layout in
``tests/kernels/test_ragged_verify.py`` under the Triton interpreter.

Batch 1: B = 16 requests in a padded ``[B, W = 29]`` tree, one a 29-node chain (a long n-gram copy), the others
random 1-3-node trees, committed lengths in [200, 2048). Batch 2: the same total ``T`` split differently (a 20-node
chain elsewhere, the rest spread), new trees, lengths and q/k/v. Checks:

1. eager build (``node_counts``; ``T`` and ``max_nodes`` read on the host once; ``build_ragged_layout`` into a
   preallocated uint8 mask) + the consumer; the second call under ``set_sync_debug_mode("error")``;
2. the consumer equal to a float64 per-request reference built on the CPU from the parents (prefix visible, node i
   sees its ancestors and itself) to 2e-2 (bf16); a negative control (one request's tree rows all visible) must
   differ from it. The new keys are scaled x3 so the tree part carries a large share of each row's attention;
3. build + consumer captured for tier ``T`` on batch 1; batch 2 copied into the static inputs, replayed under
   sync debug "error": qo_indptr, token_index, mask_indptr, the packed mask up to ``mask_indptr[B]`` and the output
   equal exactly to an eager CUDA call on batch 2, the layout equal to the CPU build, the output to the reference;
4. timing: median of 50 replays (CUDA events), informative; and the device idle time a blocking read of the node
   counts adds between two graphs (``blocking_read_stall_us``: the measured part of the replay's ``RAGGED_SYNC_US``).

The consumer (``ragged_attention``): row ``j`` of request ``b = searchsorted(qo_indptr, j, right=True) - 1`` gathers
its flags from the packed mask at ``mask_indptr[b] + i (s_b + n_b) + c`` into a dense ``[T, Smax + max_nodes]``
boolean mask and attends over its request's prefix keys (padded cache ``[B, KVH, Smax, D]``) and its ``n_b`` new keys.

CPU mode: B = 4, lengths [20, 100), tiny fp32 heads; eager, and ``torch.compile(fullgraph=True, backend="eager")`` of
build + consumer at fixed ``T`` run on batch 1 then batch 2 (the closest CPU proxy of one captured graph per tier),
equal to eager. No timing.
"""
from __future__ import annotations

import sys

import torch

from bench.device import _env

W, CHAIN2 = 29, 20
GPU_CFG = dict(bs=16, s=(200, 2048), h=32, kvh=8, d=128, dtype=torch.bfloat16, tol=2e-2)
CPU_CFG = dict(bs=4, s=(20, 100), h=4, kvh=2, d=8, dtype=torch.float32, tol=1e-5)
OUTS = ("qo_indptr", "token_index", "mask_indptr", "custom_mask", "attention")


def make_batch(counts, chain: int, cfg, g) -> dict:
    """Padded tree tensors (``verify_nodes``' inputs and output) + q/k/v in the compact layout, on the CPU."""
    from sglang_hybrid.sglang_plugin.tree_mask import verify_nodes

    bs, total = len(counts), sum(counts)
    parents = [[-1] + [i - 1 if b == chain else int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
               for b, n in enumerate(counts)]
    anc = torch.zeros(bs, W, W, dtype=torch.bool)
    for b, par in enumerate(parents):
        for i, p in enumerate(par):
            anc[b, i] = anc[b, p] if p >= 0 else anc[b, i]
            anc[b, i, i] = True
    cnt = torch.tensor(counts)
    valid = torch.arange(W)[None] < cnt[:, None]
    tokens = torch.randint(0, 32000, (bs, W), generator=g)
    _, anc = verify_nodes(tokens, valid, anc)
    seq_lens = torch.randint(*cfg["s"], (bs,), generator=g)
    h, kvh, d, dt = cfg["h"], cfg["kvh"], cfg["d"], cfg["dtype"]
    qkv = (torch.randn(total, h, d, generator=g), torch.randn(bs, kvh, cfg["s"][1], d, generator=g),
           torch.randn(bs, kvh, cfg["s"][1], d, generator=g), 3 * torch.randn(total, kvh, d, generator=g),
           torch.randn(total, kvh, d, generator=g))
    return dict(parents=parents, tokens=tokens, valid=valid, anc=anc, seq_lens=seq_lens,
                qkv=tuple(t.to(dt) for t in qkv))


def split_same_total(total: int, bs: int, g) -> list:
    """Another split of ``total``: a ``CHAIN2``-node request last, the rest spread over the others (each 1..W)."""
    counts = [1] * (bs - 1) + [CHAIN2]
    for _ in range(total - sum(counts)):
        free = [b for b in range(bs - 1) if counts[b] < W]
        counts[free[int(torch.randint(0, len(free), (1,), generator=g))]] += 1
    return counts


def ragged_attention(q, k_cache, v_cache, k_new, v_new, qo_indptr, mask_indptr, mask, seq_lens, max_nodes: int):
    """Tree attention of the packed layout, static shapes (no host read, no per-request loop): ``[T, H, D]``."""
    t, h, d = q.shape
    _, kvh, smax, _ = k_cache.shape
    dev = q.device
    j = torch.arange(t, device=dev)
    qo = qo_indptr.to(torch.int64)
    b = torch.searchsorted(qo, j, right=True) - 1                           # [T] request of each row
    i, s, n = j - qo[b], seq_lens.to(torch.int64)[b], qo[b + 1] - qo[b]
    row = mask_indptr[b] + i * (s + n)                                      # [T] first flag of the row
    p, c = torch.arange(smax, device=dev), torch.arange(max_nodes, device=dev)
    idx = torch.cat([row[:, None] + p[None], (row + s)[:, None] + c[None]], 1)               # [T, Smax + max_nodes]
    ok = torch.cat([p[None] < s[:, None], c[None] < n[:, None]], 1)
    dense = mask[torch.where(ok, idx, 0)].to(torch.bool) & ok
    new = torch.clamp(qo[b][:, None] + c[None], max=t - 1)                  # [T, max_nodes] compact key rows
    k = torch.cat([k_cache[b], k_new[new].transpose(1, 2)], 2)              # [T, KVH, Smax + max_nodes, D]
    v = torch.cat([v_cache[b], v_new[new].transpose(1, 2)], 2)
    out = torch.nn.functional.scaled_dot_product_attention(q.reshape(t, kvh, h // kvh, d), k, v,
                                                           attn_mask=dense[:, None, None, :])
    return out.reshape(t, h, d)


def step(x, counts, mask_buf, total: int, max_nodes: int, sl_bound: int):
    """Build + consumer, what one verify forward of tier ``total`` runs; returns the five outputs."""
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout

    lay = build_ragged_layout(x["valid"], x["anc"], x["seq_lens"], sl_bound, counts, total, max_nodes, mask_buf)
    att = ragged_attention(*x["qkv"], lay.qo_indptr, lay.mask_indptr, lay.custom_mask, x["seq_lens"], max_nodes)
    return lay.qo_indptr, lay.token_index, lay.mask_indptr, lay.custom_mask, att


def reference(batch) -> torch.Tensor:
    """float64 per request, straight from the parents: prefix all visible, node i sees its ancestors and itself."""
    q, kc, vc, kn, vn = (t.double() for t in batch["qkv"])
    outs, start = [], 0
    for b, par in enumerate(batch["parents"]):
        n, s = len(par), int(batch["seq_lens"][b])
        vis = torch.zeros(n, s + n, dtype=torch.bool)
        vis[:, :s] = True
        for i in range(n):
            a = i
            while a >= 0:
                vis[i, s + a], a = True, par[a]
        k = torch.cat([kc[b, :, :s], kn[start:start + n].transpose(0, 1)], 1)         # [KVH, s + n, D]
        v = torch.cat([vc[b, :, :s], vn[start:start + n].transpose(0, 1)], 1)
        qb = q[start:start + n].reshape(n, k.shape[0], -1, q.shape[-1])             # [n, KVH, G, D]
        sc = torch.einsum("nkgd,kld->nkgl", qb, k) / q.shape[-1] ** 0.5
        sc = sc.masked_fill(~vis[:, None, None, :], float("-inf"))
        outs.append(torch.einsum("nkgl,kld->nkgd", sc.softmax(-1), v).reshape(n, -1, q.shape[-1]))
        start += n
    return torch.cat(outs)


def blocking_read_stall_us(graph, counts, graph_ms: float, iters: int = 50) -> float:
    """Device idle time one blocking device-to-host read of the node counts adds between the decision and the verify
    (the "ragged, blocking read" design the replay prices with ``RAGGED_SYNC_US``): ``graph`` stands for the work
    queued before the read and again for the verify launched after it; the time from the end of the first replay to
    the end of the second, less one replay, is the stream sync, the copy, the host's wake-up and the graph launch."""
    times = []
    for _ in range(iters):
        after_first, after_second = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        after_first.record()
        counts.cpu()                                          # blocking: waits for the queue, copies B ints
        graph.replay()
        after_second.record()
        torch.cuda.synchronize()
        times.append(after_first.elapsed_time(after_second))
    return max(0.0, (_env.median(times) - graph_ms) * 1e3)


def compare(got, want, exact: bool, tol: float = 0.0) -> list:
    """Names of the outputs that differ (the mask up to ``mask_indptr[B]``; attention exact or to ``tol``)."""
    bad, end = [], int(want[2][-1])
    for name, a, b in zip(OUTS, got, want):
        a, b = a.detach().cpu(), b.detach().cpu()
        if name == "custom_mask":
            a, b = a[:end].bool(), b[:end].bool()
        if name == "attention":
            a, b = a.double(), b.double()
            same = torch.equal(a, b) if exact else torch.allclose(a, b, atol=tol, rtol=tol)
        else:
            same = a.shape == b.shape and torch.equal(a.to(torch.int64), b.to(torch.int64))
        if not same:
            bad.append(f"{name}" + (f" (max diff {float((a - b).abs().max()):.3g})" if a.shape == b.shape else ""))
    return bad


def ahead_paths(x, rows_ids, rows_pos, mask_bufs, sl_bound: int, row_bound: int):
    """The work ragged verify queues ahead of its read, both ways the worker has: the torch builder
    (``verify_nodes``, ``node_counts``, ``build_pending_layout``, the compaction) and the layout kernels
    (``kernels.ragged_layout``: one launch each). Returns two callables, each giving the pending layout's arrays and
    the compacted rows."""
    from sglang_hybrid.kernels.ragged_layout import pending_layout
    from sglang_hybrid.sglang_plugin.ragged.layout import build_pending_layout, node_counts
    from sglang_hybrid.sglang_plugin.tree_mask import verify_nodes

    def arrays(lay):
        return (lay.counts, lay.token_index, lay.qo_indptr, lay.mask_indptr, lay.custom_mask,
                *lay.compact_ahead(rows_ids, rows_pos))

    def torch_path():
        _, anc = verify_nodes(x["tokens"], x["valid"], x["anc"])
        return arrays(build_pending_layout(x["valid"], anc, x["seq_lens"], sl_bound, node_counts(x["valid"]),
                                           mask_out=mask_bufs[0], row_bound=row_bound))

    def kernel_path():
        return arrays(pending_layout(x["valid"], x["anc"], x["seq_lens"], sl_bound, mask_out=mask_bufs[1],
                                     row_bound=row_bound))

    return torch_path, kernel_path


def check_ahead_kernels(x, dev, on_gpu: bool, check, rec: dict, log) -> None:
    """The layout kernels against the torch builder on batch 1 (exact; the mask up to ``mask_indptr[B]``), with no
    host sync on a GPU, and the device time of each path there (median of 50 CUDA-graph replays: the device time the
    replay charges as ``RAGGED_AHEAD_*`` x the per-launch figures), where the kernels run (a GPU; the CPU only under
    Triton's interpreter)."""
    from sglang_hybrid import kernels
    from sglang_hybrid.sglang_plugin.ragged.layout import mask_numel_bound

    if not kernels.available(dev):
        rec["ahead_kernels"] = "not run: Triton cannot run here (a GPU, or TRITON_INTERPRET=1 on the CPU)"
        log(f"[ragged] ahead_kernels: {rec['ahead_kernels']}")
        return
    bs = x["valid"].shape[0]
    sl_bound = int(x["seq_lens"].sum())
    row_bound = int(x["seq_lens"].max()) + W
    g = torch.Generator().manual_seed(26)
    ids, pos = (torch.randint(0, 32000, (bs * W,), generator=g).to(dev) for _ in range(2))
    bufs = [torch.ones(mask_numel_bound(W, bs * W, sl_bound, row_bound), dtype=torch.uint8, device=dev)
            for _ in range(2)]
    torch_path, kernel_path = ahead_paths(x, ids, pos, bufs, sl_bound, row_bound)
    want = tuple(t.clone() for t in torch_path())
    kernel_path()                                                           # compile / warm up
    if on_gpu:
        torch.cuda.synchronize()
    with _env.no_host_sync(on_gpu):
        got = tuple(t.clone() for t in kernel_path())
    end = int(want[3][-1])
    names = ("counts", "token_index", "qo_indptr", "mask_indptr", "custom_mask", "input_ids", "positions",
             "kv_write_cols")
    bad = [n for n, a, b in zip(names, got, want)
           if not torch.equal(*((t[:end] if n == "custom_mask" else t).cpu() for t in (a, b)))]
    check("ahead_kernels_vs_torch", bad)
    if on_gpu:
        for name, fn in (("torch", torch_path), ("kernels", kernel_path)):
            graph, _ = _env.capture(fn)
            rec[f"ahead_{name}_graph_ms"] = _env.median(_env.cuda_ms(graph.replay, 50))
            rec[f"ahead_{name}_eager_ms"] = _env.median(_env.cuda_ms(fn, 50))
            del graph
        log(f"[ragged] work ahead of the read, B={bs} W={W}: torch {rec['ahead_torch_graph_ms'] * 1e3:.1f} us device "
            f"(graph replay; eager {rec['ahead_torch_eager_ms'] * 1e3:.1f} us), kernels "
            f"{rec['ahead_kernels_graph_ms'] * 1e3:.1f} us (eager {rec['ahead_kernels_eager_ms'] * 1e3:.1f} us); "
            "median of 50")


def run(log=print) -> dict:
    on_gpu = _env.gpu()
    cfg, dev = (GPU_CFG, torch.device("cuda")) if on_gpu else (CPU_CFG, torch.device("cpu"))
    from sglang_hybrid.sglang_plugin.ragged.layout import build_ragged_layout, mask_numel_bound, node_counts

    g = torch.Generator().manual_seed(25)
    bs, tol = cfg["bs"], cfg["tol"]
    counts1 = [int(c) for c in torch.randint(1, 4, (bs,), generator=g)]
    counts1[1] = W
    b1 = make_batch(counts1, 1, cfg, g)
    b2 = make_batch(split_same_total(sum(counts1), bs, g), bs - 1, cfg, g)
    sl_bound = bs * cfg["s"][1]                                             # host bounds, as the worker's

    def to_dev(bt):
        return dict(valid=bt["valid"].to(dev), anc=bt["anc"].to(dev), seq_lens=bt["seq_lens"].to(dev),
                    tokens=bt["tokens"].to(dev), qkv=tuple(t.to(dev) for t in bt["qkv"]))

    x = to_dev(b1)                                                          # the static inputs
    counts = node_counts(x["valid"])
    total, max_nodes = (int(v) for v in torch.stack([counts.sum(), counts.max()]).tolist())   # the one host read
    buf = torch.ones(mask_numel_bound(max_nodes, total, sl_bound), dtype=torch.uint8, device=dev)
    rec = {"on_gpu": on_gpu, "B": bs, "W": W, "T": total, "max_nodes": max_nodes, "mask_entries": buf.numel(),
           "counts_batch1": counts1, "counts_batch2": [len(p) for p in b2["parents"]],
           "heads": f"H={cfg['h']} KVH={cfg['kvh']} D={cfg['d']} {str(cfg['dtype']).split('.')[-1]}"}
    log(f"[ragged] B={bs} W={W} T={total} max_nodes={max_nodes} ({rec['heads']}); batch 2 splits the same T as "
        f"{rec['counts_batch2']}; " + ("GPU, CUDA graph per tier" if on_gpu else "CPU mode: eager vs torch.compile("
                                       "fullgraph) at fixed T, no CUDA graph, no sync check, no timing"))
    fails = []

    def run_step():
        return step(x, counts, buf, total, max_nodes, sl_bound)

    def check(name, bad, ok="equal"):
        rec[name] = "; ".join(bad) if bad else ok
        fails.extend(f"{name}: {s}" for s in bad)
        log(f"[ragged] {name}: {rec[name]}")

    run_step()                                                              # warm-up (one-time initialisation)
    if on_gpu:
        torch.cuda.synchronize()
    with _env.no_host_sync(on_gpu):
        eager1 = tuple(t.clone() for t in run_step())
    if on_gpu:
        rec["eager_no_sync"] = True
        log("[ragged] eager build + consumer under set_sync_debug_mode('error'): no host sync")
    cpu1 = build_ragged_layout(b1["valid"], b1["anc"], b1["seq_lens"], sl_bound, node_counts(b1["valid"]), total,
                               max_nodes, torch.ones(buf.numel(), dtype=torch.uint8))
    ref1, ref2 = reference(b1), reference(b2)
    lay1 = (cpu1.qo_indptr, cpu1.token_index, cpu1.mask_indptr, cpu1.custom_mask, ref1)
    check("batch1_eager_vs_cpu_and_reference", compare(eager1, lay1, exact=False, tol=tol))
    neg = eager1[3].clone()
    neg[int(eager1[2][1]):int(eager1[2][2])] = 1                           # the 29-node chain: all rows all visible
    neg_out = ragged_attention(*x["qkv"], eager1[0], eager1[2], neg, x["seq_lens"], max_nodes)
    rec["negative_control_max_diff"] = float((neg_out.double().cpu() - ref1).abs().max())
    check("negative_control_differs", [] if rec["negative_control_max_diff"] > tol else
          [f"an all-visible tree mask matched the reference (max diff {rec['negative_control_max_diff']:.3g})"],
          f"differs (max diff {rec['negative_control_max_diff']:.3g} > {tol:g})")

    check_ahead_kernels(x, dev, on_gpu, check, rec, log)
    if on_gpu:
        graph, static = _env.capture(run_step)
    else:
        compiled = torch.compile(run_step, fullgraph=True, backend="eager")
        check("batch1_compiled_vs_eager", compare(compiled(), eager1, exact=True))
    x2 = to_dev(b2)
    for k in ("valid", "anc", "seq_lens"):                                  # batch 2 into the static inputs
        x[k].copy_(x2[k])
    for a, b in zip(x["qkv"], x2["qkv"]):
        a.copy_(b)
    counts.copy_(node_counts(x["valid"]))
    if on_gpu:
        with _env.no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        rec["replay_no_sync"] = True
        got = tuple(t.clone() for t in static)
    else:
        got = tuple(t.clone() for t in compiled())
    eager2 = step(x2, node_counts(x2["valid"]), torch.ones_like(buf), total, max_nodes, sl_bound)
    c2 = node_counts(b2["valid"])
    cpu2 = build_ragged_layout(b2["valid"], b2["anc"], b2["seq_lens"], sl_bound, c2, total, int(c2.max()))
    what = "replay" if on_gpu else "compiled"
    check(f"batch2_{what}_vs_eager", compare(got, eager2, exact=True))
    check(f"batch2_{what}_vs_cpu_and_reference",
          compare(got, (cpu2.qo_indptr, cpu2.token_index, cpu2.mask_indptr, cpu2.custom_mask, ref2), False, tol))
    rec["attention_vs_reference_max_diff"] = [float((a[4].double().cpu() - r).abs().max())
                                              for a, r in ((eager1, ref1), (got, ref2))]
    if on_gpu:
        rec["graph_ms"] = _env.median(_env.cuda_ms(graph.replay, 50))
        log(f"[ragged] build + consumer, graph replay at tier T={total}: {rec['graph_ms']:.4f} ms (median of 50)")
        rec["blocking_read_stall_us"] = blocking_read_stall_us(graph, counts, rec["graph_ms"])
        log(f"[ragged] a blocking read of the {bs} node counts between two graphs: the device idles "
            f"{rec['blocking_read_stall_us']:.1f} us (median of 50; the replay's RAGGED_SYNC_US estimate of 50 us also "
            "holds the host's attention plan, not measured here)")
        del graph
    rec["failures"] = len(fails)
    log(f"[ragged] {'all checks passed' if not fails else f'{len(fails)} FAILED: ' + ' | '.join(fails)}")
    _env.write_json("ragged.json", rec)
    return rec


def main(argv=None) -> int:
    if not _env.gpu():
        torch.set_num_threads(1)
        print(_env.NO_GPU)
    return 1 if run()["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
