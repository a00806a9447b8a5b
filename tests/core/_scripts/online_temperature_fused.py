"""The online temperature's fused path against its torch path, under Triton's interpreter, for
``tests/core/test_online_calibration.py``:

    TRITON_INTERPRET=1 python -m tests.core._scripts.online_temperature_fused

(from the repository's root) prints the learned temperatures of both paths as one JSON line, last. A process of its
own because the interpreter must be chosen before Triton is first imported.
"""
import json
import os

from sglang_hybrid.kernels import GPU_TILES_ENV
from tests.helpers.online_steps import drive, hybrid_step


def main() -> dict:
    """Six steps on each path, two with the setting off, then a 40-request batch at a GPU's rows per loop iteration
    after verify (32), so its gradient is summed over two iterations."""
    import torch

    fused, ref = hybrid_step("fused"), hybrid_step("torch")
    assert fused.fused is not None and ref.fused is None
    kept = drive(fused, 6)
    drive(ref, 6)
    off = hybrid_step("fused", model_calibration_eta=None)
    drive(off, 2)
    os.environ[GPU_TILES_ENV] = "1"
    wide = [hybrid_step(kind, pool=40) for kind in ("fused", "torch")]
    for st in wide:
        drive(st, 2, seed=1, b=40)
    return {
        "wide": [st.decide.model_cal.temperatures.tolist() for st in wide],
        "fused": fused.decide.model_cal.temperatures.tolist(), "torch": ref.decide.model_cal.temperatures.tolist(),
        "fused_sq": fused.online_temperature.sq_grad.tolist(), "torch_sq": ref.online_temperature.sq_grad.tolist(),
        "conf_kept": all(k[0][5] is not None and k[0][5].dtype == torch.float32 for k in kept),
        "off": off.decide.model_cal.temperatures.tolist()}


if __name__ == "__main__":
    print(json.dumps(main()))
