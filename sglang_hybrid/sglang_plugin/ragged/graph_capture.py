"""How a ragged verify graph is captured and replayed: a CUDA graph on a GPU, a traced eager replay on the CPU.

Why two: the verify graph runner (``graph_runner``) keeps every tensor a forward reads in static buffers and replays
one captured forward per token tier. On a GPU that forward is a ``torch.cuda.CUDAGraph`` (``CudaGraphCapture``). The
CPU has no graphs, but what makes a replay right is checkable there: a CUDA graph reruns exactly the kernels it
recorded, with the shapes, scalar arguments and input addresses of its capture, so its replay is right only if the
forward, run again over the refreshed buffers, would launch the same work on the same memory. ``TracedEagerCapture``
runs the captured forward again at every replay and compares its trace with the capture's: every ATen operator and
every Triton launch (SGLang's kernels run under ``TRITON_INTERPRET=1`` here), with its argument shapes, dtypes,
strides and scalar values, and, for each tensor the forward did not create itself, its address. A forward that reads a
tensor outside the static buffers, changes a shape, branches on a value or reads one to the host (``.item()``: a sync
a graph cannot hold) fails the replay with the first operator that differs (``GraphReplayMismatch``). What it cannot
show: the GPU's own kernels (the CPU engine takes SGLang's CPU branches in places), the capture call itself, and a
tensor made anew each step that the allocator happens to place at the captured address (a miss, never a false alarm).

Both capture lazily: a tier's graph is captured the first time a step needs it (``run``). The trace check is not
specific to the verify forward: ``tests/kernels/test_fused_decision.py`` replays the worker's fused decision step
under it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def capture_kind(device: str, tp_size: int, *, decode_graphs: bool = True) -> Optional[str]:
    """How ragged verify graphs are captured on ``device`` at ``tp_size``: ``"traced"`` on the CPU engine
    (``TracedEagerCapture``, whatever SGLang's graph settings: the CPU engine runs SGLang with its graphs off),
    ``"cuda"`` on a GPU at TP 1 with SGLang's decode graphs on (``CudaGraphCapture``; ``decode_graphs`` False:
    ``--disable-cuda-graph`` or ``--disable-decode-cuda-graph``), None elsewhere (eager: under TP > 1 SGLang
    registers its collectives for capture inside its own runner)."""
    kind = torch.device(device).type
    if kind == "cpu":
        return "traced"
    if kind == "cuda" and tp_size == 1 and decode_graphs:
        return "cuda"
    return None


#: SGLang's Triton backend, and HYBRID's ragged subclass of it (``triton_backend.enable``), by class name
TRITON_BACKENDS = ("TritonAttnBackend", "RaggedTritonAttnBackend")
#: SGLang's FlashInfer backend, and HYBRID's tier-planning subclass of it (``flashinfer_backend.enable``)
FLASHINFER_BACKENDS = ("FlashInferAttnBackend", "RaggedFlashInferAttnBackend")


def tier_graph_kind(runner, tp_size: int, *, ragged: bool, ragged_graphs: bool) -> tuple[Optional[str], str]:
    """How the ragged verify forward on the target's model ``runner`` is captured in HYBRID's token-tier graphs
    (``capture_kind``), or None where it runs eager, with the reason: not ragged, the setting ``ragged_graphs`` off, a
    backend other than SGLang's Triton or FlashInfer one (or a FlashInfer one that cannot plan tiers:
    ``flashinfer_backend.cannot_plan_tiers``), or no capture for the device, TP size and SGLang's decode graph
    setting. ``(kind, reason)``; the reason is empty where a kind is given. The one answer the graph runner's set-up
    (and its start-up log line), the backends' set-up and the start-up memory budget act on."""
    if not ragged:
        return None, "padded verify"
    if not ragged_graphs:
        return None, "setting ragged_graphs=false"
    name = type(runner.attn_backend).__name__
    if name in FLASHINFER_BACKENDS:
        from .flashinfer_backend import cannot_plan_tiers

        why = cannot_plan_tiers(runner.attn_backend)
        if why is not None:
            return None, f"token-tier graphs on FlashInfer: {why}"
    elif name not in TRITON_BACKENDS:
        return None, "token-tier graphs run on the Triton and FlashInfer backends only"
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    decode_graphs = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    kind = capture_kind(runner.device, tp_size, decode_graphs=decode_graphs)
    if kind is not None:
        return kind, ""
    if tp_size > 1:
        return None, "token-tier CUDA graphs are built for TP 1"
    if not decode_graphs:
        return None, "SGLang's decode CUDA graphs are off (--disable-cuda-graph)"
    return None, f"no token-tier capture on a {torch.device(runner.device).type} device (CUDA or the CPU engine)"


class GraphReplayMismatch(RuntimeError):
    """A replay would not run what its graph captured (``TracedEagerCapture``)."""


class CudaGraphCapture:
    """One ``torch.cuda.CUDAGraph`` per key, sharing one memory pool (graphs of one runner never run at once).

    A capture first runs the forward ``warmup`` times eagerly on a side stream (lazy initialisations, autotuning), as
    SGLang's runners do, then records it; the recorded output tensors are returned by every replay, refreshed in
    place. The capture's error mode is ``thread_local``: a tier is captured while the server runs, and a CUDA call
    from another thread of the serving process must not void it, as under the default ``global`` mode.
    The device kit captures its graphs with it too (``bench/device/_env.capture``)."""

    def __init__(self, warmup: int = 2):
        if not torch.cuda.is_available():
            raise RuntimeError("CudaGraphCapture needs CUDA; the CPU engine uses TracedEagerCapture")
        self.warmup = warmup
        self._graphs: dict = {}
        self._pool = torch.cuda.graph_pool_handle()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def graph(self, key: Hashable) -> "torch.cuda.CUDAGraph":
        return self._graphs[key][0]

    def capture(self, key: Hashable, forward: Callable[[], Any]) -> Any:
        """Warm ``forward`` up and record it as ``key``'s graph; returns its output tensors (not yet computed: a
        capture records, it does not run)."""
        if key in self._graphs:
            raise ValueError(f"a graph is already captured for {key!r}")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = forward()
        self._graphs[key] = (graph, out)
        return out

    def replay(self, key: Hashable) -> Any:
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def run(self, key: Hashable, forward: Callable[[], Any]) -> Any:
        """Replay ``key``'s graph, captured from ``forward`` first if it is new."""
        if key not in self._graphs:
            self.capture(key, forward)
        return self.replay(key)


def _describe(value: Any, trace: "_Trace") -> Any:
    """A hashable description of one operator or kernel argument (see ``_Trace``)."""
    if isinstance(value, torch.Tensor):
        ptr = value.untyped_storage().data_ptr() if value.device.type != "meta" else 0
        where = "internal" if ptr in trace.internal else ("external", ptr)
        if where != "internal":
            trace.external.add(ptr)
        return ("T", tuple(value.shape), str(value.dtype), tuple(value.stride()), value.storage_offset(), where)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v, trace) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _describe(v, trace)) for k, v in value.items()))
    if isinstance(value, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format)):
        return value
    return type(value).__name__


class _Trace(TorchDispatchMode):
    """Records every ATen operator (and, through ``launch``, every kernel launch: ``kernel_launch``) of one forward.

    A tensor argument is *internal* when the forward itself produced its storage (an operator's output), else
    *external* (weights, the KV cache, the static buffers): an external address is part of the record, since a graph
    reads it at the address it captured; an internal one is not (a graph's own allocations live in its pool)."""

    def __init__(self):
        super().__init__()
        self.ops: list = []
        self.internal: set = set()
        self.external: set = set()
        self._in_launch = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            raise GraphReplayMismatch(
                "the forward reads a device value to the host (.item() or a Python branch on a tensor): "
                "a captured graph cannot")
        self.ops.append((str(func), _describe(args, self), _describe(kwargs, self)))
        out = func(*args, **kwargs)
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self.external:
                    self.internal.add(ptr)
        return out

    def launch(self, name: str, args: tuple, kwargs: dict) -> None:
        self.ops.append((name, _describe(args, self), _describe(kwargs, self)))


#: the trace being recorded in this process, if any (``trace_forward``)
_ACTIVE: Optional[_Trace] = None


@contextlib.contextmanager
def kernel_launch(name: str, args: tuple = (), kwargs: Optional[dict] = None):
    """Run the body as one device kernel launch: recorded in the active trace (``trace_forward``) as ``name`` with
    its arguments, and run outside it (what happens inside a kernel is not a graph's business). A no-op when nothing
    is traced. Interpreted Triton launches go through it (``_TritonLaunches``), and so does the CPU engine's torch
    twin of SGLang's extend-attention kernel (``cpu_engine.torch_attention``), which stands in for one launch."""
    trace = _ACTIVE
    if trace is None or trace._in_launch:
        yield
        return
    trace.launch(name, args, kwargs or {})
    trace._in_launch = True
    try:
        with torch.utils._python_dispatch._disable_current_modes():
            yield
    finally:
        trace._in_launch = False


def static_buffer(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, run outside the active trace (``trace_forward``), if any, its tensor recorded as external to it:
    for what a graph would have made before its capture, a buffer every later capture and replay uses
    (``graph_runner.keep_hidden``), which the trace must record by address where a forward reads it, as it records
    start-up buffers. Marked explicitly because the allocator may hand it the address of a tensor the forward made and
    freed earlier in the same trace, which the trace has already seen as the forward's own."""
    with torch.utils._python_dispatch._disable_current_modes():
        tensor = make()
    trace = _ACTIVE
    if trace is not None:
        ptr = tensor.untyped_storage().data_ptr()
        trace.internal.discard(ptr)
        trace.external.add(ptr)
    return tensor


class _TritonLaunches:
    """While active, every interpreted Triton launch is a ``kernel_launch`` (its grid recorded with its arguments)."""

    def __init__(self):
        self._saved = None

    def __enter__(self):
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:                     # no Triton: nothing to record
            return self
        original = InterpretedFunction.run
        self._saved = (InterpretedFunction, original)

        def run(fn_self, *args, grid, warmup, **kwargs):
            if warmup:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            grid_d = grid if isinstance(grid, tuple) else "callable"
            with kernel_launch(f"triton:{fn_self.__name__}", (grid_d,) + args, kwargs):
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            cls, original = self._saved
            cls.run = original
        return False


def trace_forward(forward: Callable[[], Any]) -> tuple:
    """``(output, ops)``: ``forward()`` run once, with its operator and launch record."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("trace_forward: a forward is already being traced")
    trace = _Trace()
    _ACTIVE = trace
    try:
        with _TritonLaunches(), trace:
            out = forward()
    finally:
        _ACTIVE = None
    return out, trace.ops


class TracedEagerCapture:
    """The CPU stand-in for ``CudaGraphCapture``: a capture runs the forward and keeps its trace; a replay runs the
    *captured* forward again (the closure over the capture's static batch, as a graph would) and refuses any trace
    other than the capture's (``GraphReplayMismatch``). ``replays[key]`` counts the checked replays."""

    def __init__(self):
        self._captured: dict = {}
        self.replays: dict = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._captured

    def run(self, key: Hashable, forward: Callable[[], Any]) -> Any:
        entry = self._captured.get(key)
        if entry is None:
            out, ops = trace_forward(forward)
            self._captured[key] = (forward, ops)
            self.replays[key] = 0
            return out
        captured_forward, captured_ops = entry
        out, ops = trace_forward(captured_forward)
        first = _first_difference(captured_ops, ops)
        if first is not None:
            i, want, got = first
            raise GraphReplayMismatch(
                f"replay of the graph for {key!r} differs from its capture at operator {i}: captured {want}, "
                f"replayed {got}")
        self.replays[key] += 1
        return out


def _first_difference(a: list, b: list) -> Optional[tuple]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    if len(a) != len(b):
        i = min(len(a), len(b))
        return i, a[i] if i < len(a) else "<end>", b[i] if i < len(b) else "<end>"
    return None


__all__ = ["CudaGraphCapture", "GraphReplayMismatch", "TracedEagerCapture", "capture_kind", "kernel_launch",
           "static_buffer", "trace_forward"]
