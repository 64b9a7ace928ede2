"""Every mixer module, imported explicitly (one line each) so the registry is readable; importing
this package (or any module in it) registers them all before a name is looked up."""

from tokenmix.mixers import structured  # pow2, sq1, pow2_ce, sq1_ce, kth_order, dense_recurrence, first_order
from tokenmix.mixers import attention
from tokenmix.mixers import local_attention
from tokenmix.mixers import chacal
from tokenmix.mixers import hlru
from tokenmix.mixers import deltanet
from tokenmix.mixers import gated_deltanet
from tokenmix.mixers import log_linear
from tokenmix.mixers import linear_attention
from tokenmix.mixers import retnet
from tokenmix.mixers import gla
from tokenmix.mixers import mamba2
from tokenmix.mixers import diag_ssm
from tokenmix.mixers import log_linear_mamba2
from tokenmix.mixers import log_linear_gated_deltanet
from tokenmix.mixers import forgetting_attention
from tokenmix.mixers import stickbreaking_attention
from tokenmix.mixers import path_attention
from tokenmix.mixers import ttt_linear
from tokenmix.mixers import gated_delta_product
from tokenmix.mixers import kda
from tokenmix.mixers import gdn2
from tokenmix.mixers import hgrn2
from tokenmix.mixers import rg_lru
from tokenmix.mixers import mesa_net
from tokenmix.mixers import short_conv

from tokenmix.mixers.registry import MixerSpec, build_mixer, get_mixer_spec, mixer_names, register_mixer

__all__ = ["MixerSpec", "build_mixer", "get_mixer_spec", "mixer_names", "register_mixer"]
