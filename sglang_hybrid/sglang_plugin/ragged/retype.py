"""Turning an attention backend SGLang built into HYBRID's ragged subclass of its class, once.

Why: SGLang builds its backends through its registry, so the worker cannot ask it for another class; it turns the
instances it owns into the subclass (``triton_backend.enable``, ``flashinfer_backend.enable``), which only adds buffers
and overrides the plan. A backend is turned once, at the sizes its buffers are allocated for; this is the check both
share: already turned at those sizes (a no-op), at other sizes (refused), or of a class the subclass does not extend
(refused: its plan would ignore the layout).
"""
from __future__ import annotations


def already_enabled(backend, subclass: type, base: type, max_bs: int, width: int) -> bool:
    """True when ``backend`` already is ``subclass`` with buffers for ``max_bs`` requests at ``width``; False when it
    is exactly ``base``, to be turned. Raises ``ValueError`` for other sizes, ``TypeError`` for another class."""
    if type(backend) is subclass:
        have = backend.ragged_buffers
        if (have.max_bs, have.width) != (max_bs, width):
            raise ValueError(f"the backend plans ragged verify for {have.max_bs} requests at width {have.width}, "
                             f"not {max_bs} at {width}")
        return True
    if type(backend) is not base:
        raise TypeError(f"ragged verify plans through SGLang's {base.__name__}, got {type(backend).__name__}")
    return False


__all__ = ["already_enabled"]
