"""Python entry to layers compiled by moe-compile (ctypes over the C API),
and to the MoE layers of HuggingFace checkpoints."""
from .checkpoint import CheckpointError, load_layer
from .layer import Layer, LayerError

__all__ = ["Layer", "LayerError", "load_layer", "CheckpointError", "MoE",
           "patch", "prepare"]


def __getattr__(name):
    # The torch parts need PyTorch; loading checkpoints does not.
    if name == "MoE":
        from .module import MoE
        return MoE
    if name == "patch":
        from .patching import patch
        return patch
    if name == "prepare":
        from .patching import prepare
        return prepare
    raise AttributeError(name)
