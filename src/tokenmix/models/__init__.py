from tokenmix.models.model import MixerModel, ModelConfig, left_pad, parse_layers

__all__ = ["MixerModel", "ModelConfig", "left_pad", "parse_layers"]
