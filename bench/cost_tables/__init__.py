"""Step-time tables for the replay: ``python -m bench.cost_tables.roofline`` (simulated GPU) and
``python -m bench.cost_tables.profile_cpu`` (measured on this CPU)."""
