"""Python entry to layers compiled by moe-compile (ctypes over the C API)."""
from .layer import Layer

__all__ = ["Layer"]
