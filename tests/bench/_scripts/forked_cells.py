"""The realistic replay's ``--jobs`` children forked by a parent whose torch has run on its OpenMP threads, in a fresh
interpreter (so that the parent's pool is certain), for ``tests/bench/test_replay_engine.py``:

    python -m tests.bench._scripts.forked_cells

Prints what the three children computed.
"""


def main() -> None:
    import torch

    from bench.replay import realistic

    torch.logit(torch.rand(1_000_000, dtype=torch.float64))   # the parent's OpenMP pool, on every thread
    runner = realistic.Runner(realistic.Config(jobs=2, plot=None))

    def work(i):
        return float(torch.logit(torch.full((4, 24), 0.25, dtype=torch.float64)).sum())

    print(runner.in_processes(work, [0, 1, 2]))


if __name__ == "__main__":
    main()
