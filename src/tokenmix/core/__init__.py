from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.registry import build_mixer, get_mixer_spec, mixer_names, register_mixer

__all__ = ["MixOperator", "solve_dense", "build_mixer", "get_mixer_spec", "mixer_names", "register_mixer"]
