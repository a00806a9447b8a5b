"""SGLang's own request objects for tests that run the plugin's host code on them (the n-gram feeder, the worker's
host proposals), without a scheduler."""
from __future__ import annotations


def real_req(rid, prompt, out, slot):
    """A real SGLang ``Req`` (token arrays as the scheduler keeps them); ``slot`` is where the scheduler put it."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("l", prompt), SamplingParams(max_new_tokens=64))
    req.output_ids.extend(out)
    return req
