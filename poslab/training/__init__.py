"""Training: the loop, optimiser, data preparation, checkpoint format, run lock, progress, presets, DDP/FSDP."""
