"""SGLang's Triton attention backend, planning a TARGET_VERIFY batch ragged when its verify input carries a layout.

Why a subclass: SGLang's Triton extend kernel is ragged already (it reads each request's query length from
``qo_indptr`` and its mask from ``mask_indptr``; ``tests/test_ragged_verify.py`` runs it on ragged tree batches);
only ``TritonAttnBackend.init_forward_metadata`` assumes one width (``qo_indptr = arange * W``, ``mask_indptr`` from
``W x (seq_len + W)`` blocks). ``RaggedTritonAttnBackend`` lets the base class plan the batch (KV indices over each
request's committed prefix, which ragged verify does not change) and replaces the four width-dependent fields with
the layout's (``ragged.layout``). Any other batch, and any verify without a layout, is planned exactly as SGLang does.

SGLang builds its backends through its registry, so the worker turns the instances it owns into this class
(``enable``) rather than asking the user for another backend name; no file of SGLang is patched.
"""
from __future__ import annotations

import dataclasses

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend


class RaggedTritonAttnBackend(TritonAttnBackend):
    """``TritonAttnBackend`` whose eager TARGET_VERIFY plan follows ``spec_info.ragged`` when it is set."""

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(forward_batch)
        layout = getattr(forward_batch.spec_info, "ragged", None)
        if layout is None or not forward_batch.forward_mode.is_target_verify():
            return
        if forward_batch.input_ids.shape[0] != layout.total:
            raise RuntimeError(
                f"ragged verify: the forward batch holds {forward_batch.input_ids.shape[0]} tokens but its layout "
                f"{layout.total}; the batch was not compacted (RaggedVerifyTarget)")
        self.forward_metadata = dataclasses.replace(
            self.forward_metadata, qo_indptr=layout.qo_indptr, custom_mask=layout.custom_mask,
            mask_indptr=layout.mask_indptr, max_extend_len=layout.max_nodes)


def enable(backend) -> None:
    """Make ``backend`` (a ``TritonAttnBackend`` SGLang built) plan ragged verify batches; a no-op when it already
    does. Any other class is refused: it would ignore the layout and attend over the wrong rows."""
    if type(backend) is RaggedTritonAttnBackend:
        return
    if type(backend) is not TritonAttnBackend:
        raise TypeError(f"ragged verify plans through SGLang's TritonAttnBackend, got {type(backend).__name__}")
    backend.__class__ = RaggedTritonAttnBackend


__all__ = ["RaggedTritonAttnBackend", "enable"]
