"""The device run's imports, in a fresh interpreter, for ``tests/bench/test_device_run.py``: everything the device run
imports must load on a machine without SGLang.

    python -m tests.bench._scripts.device_imports
"""
import sys


def main() -> None:
    import bench.device.cost_table  # noqa: F401
    import bench.device.lossless  # noqa: F401
    import bench.device.ragged  # noqa: F401
    import bench.device.selection  # noqa: F401
    import sglang_hybrid.sglang_plugin.hybrid_step  # noqa: F401
    import sglang_hybrid.sglang_plugin.ragged.layout  # noqa: F401
    import sglang_hybrid.sglang_plugin.tree_mask  # noqa: F401

    bad = [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]
    assert not bad, bad


if __name__ == "__main__":
    main()
