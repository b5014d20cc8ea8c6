"""The laboratory: the lessons' experiments, their claim records and verdicts, the report, the lab pipeline."""
