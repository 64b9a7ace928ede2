"""Every mixer module, imported explicitly (one line each) so the registry is readable; importing
this package (or any module in it) registers them all before a name is looked up."""

from tokenmix.mixers import structured  # noqa: F401  pow2, sq1, pow2_ce, sq1_ce, kth_order, dense_recurrence, first_order
from tokenmix.mixers import attention  # noqa: F401
from tokenmix.mixers import local_attention  # noqa: F401
from tokenmix.mixers import chacal  # noqa: F401
from tokenmix.mixers import hlru  # noqa: F401
from tokenmix.mixers import deltanet  # noqa: F401
from tokenmix.mixers import gated_deltanet  # noqa: F401
from tokenmix.mixers import log_linear  # noqa: F401
from tokenmix.mixers import linear_attention  # noqa: F401
from tokenmix.mixers import retnet  # noqa: F401
from tokenmix.mixers import gla  # noqa: F401
from tokenmix.mixers import mamba2  # noqa: F401
from tokenmix.mixers import diag_ssm  # noqa: F401
from tokenmix.mixers import log_linear_mamba2  # noqa: F401
from tokenmix.mixers import log_linear_gated_deltanet  # noqa: F401
from tokenmix.mixers import forgetting_attention  # noqa: F401
from tokenmix.mixers import stickbreaking_attention  # noqa: F401
from tokenmix.mixers import path_attention  # noqa: F401
from tokenmix.mixers import ttt_linear  # noqa: F401
from tokenmix.mixers import gated_delta_product  # noqa: F401
from tokenmix.mixers import kda  # noqa: F401
from tokenmix.mixers import gdn2  # noqa: F401
from tokenmix.mixers import hgrn2  # noqa: F401
from tokenmix.mixers import rg_lru  # noqa: F401
from tokenmix.mixers import mesa_net  # noqa: F401
from tokenmix.mixers import short_conv  # noqa: F401

from tokenmix.mixers.registry import MixerSpec, build_mixer, get_mixer_spec, mixer_names, register_mixer

__all__ = ["MixerSpec", "build_mixer", "get_mixer_spec", "mixer_names", "register_mixer"]
