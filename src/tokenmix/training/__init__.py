"""Training: the two loops (``synthetic.py``: sweeps of synthetic-task runs; ``lm.py``: language models),
the optimiser and schedule they share, and distributed set-up. What a run is: ``tokenmix.runs``."""
