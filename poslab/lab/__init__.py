"""The laboratory: the lessons' experiments, the report, the lab pipeline, the explorer, sweeps, benchmarks."""
