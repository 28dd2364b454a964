"""Python entry to layers compiled by moe-compile (ctypes over the C API),
and to the MoE layers of HuggingFace checkpoints."""
from .checkpoint import CheckpointError, load_layer
from .layer import Layer, LayerError
from .tools import NATIVE as _NATIVE

__all__ = ["Layer", "LayerError", "load_layer", "CheckpointError", "MoE",
           "patch", "prepare"]


def _version():
    """The installed distribution's version; in a source checkout, the one
    its CMakeLists.txt gives (the wheel reads the same line)."""
    import os
    import re
    if os.path.isdir(_NATIVE):
        from importlib.metadata import version
        return version("moe-compiler")
    top = os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")
    try:
        with open(top) as f:
            found = re.search(r"project\(moe-compiler VERSION ([0-9.]+)",
                              f.read())
    except OSError:
        found = None
    return found.group(1) if found else "0+unknown"


__version__ = _version()


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
