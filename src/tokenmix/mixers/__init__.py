"""Every mixer module, imported explicitly (one line each) so the registry is readable."""
from tokenmix.mixers import structured  # noqa: F401  pow2, sq1, pow2_ce, sq1_ce, kth_order, dense_recurrence, first_order
