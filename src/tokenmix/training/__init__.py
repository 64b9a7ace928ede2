"""Training: optimiser and schedule shared by every trainer, and the synthetic-task harness."""
