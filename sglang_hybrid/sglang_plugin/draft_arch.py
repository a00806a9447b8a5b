"""Which EAGLE variant the draft model is: ``draft_is_eagle3``.

The launcher (``server_args.handle_server_args``) decides it once and hands the answer to the spawned processes in
``config.ENV_EAGLE3``; ``spec_algo.HybridSpecAlgo.is_eagle3`` reads that, or decides it here when the variable is
absent. Both import this module, neither imports the other's module for it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def draft_is_eagle3(draft_model_path: Optional[str], trust_remote_code: bool = False) -> bool:
    """True when the draft's config names an EAGLE-3 architecture.

    Local directories are read directly; anything else goes through SGLang's own ``get_config`` (the loader its
    EAGLE alias resolution uses, honouring the HF cache / offline settings). A local config that cannot be read raises
    ``ValueError`` naming it: taking the draft for EAGLE would silently drop an EAGLE-3 head's auxiliary states.
    """
    if not draft_model_path:
        return False
    cfg = Path(draft_model_path) / "config.json"
    if cfg.is_file():
        try:
            archs = json.loads(cfg.read_text()).get("architectures") or []
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"the draft model's config {cfg} could not be read ({e}): fix or replace the file") from e
    else:
        from sglang.srt.utils.hf_transformers_utils import get_config

        archs = getattr(get_config(draft_model_path, trust_remote_code=trust_remote_code), "architectures", None) or []
    return any("eagle3" in str(a).lower() for a in archs)
