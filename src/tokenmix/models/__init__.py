from tokenmix.models.model import MixerModel, ModelConfig, parse_layers

__all__ = ["MixerModel", "ModelConfig", "parse_layers"]
