"""Safetensors files read memory-mapped into numpy (bf16 and FP8 through
ml_dtypes), and written whole or not at all.

The format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the data. Reading maps the file and
checks the header before any tensor is handed out; writing goes to a temporary
file renamed into place, so a failure leaves nothing half written.
"""
import json
import math
import os
import tempfile

import ml_dtypes
import numpy as np

DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E8M0": np.uint8,  # E8M0 scale codes, as stored
    "I8": np.int8,
    "U8": np.uint8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
    "BOOL": np.bool_,
}
NAMES = {np.dtype(v): k for k, v in DTYPES.items() if k != "F8_E8M0"}


class SafetensorsError(ValueError):
    pass


class SafetensorsFile:
    """One .safetensors file; tensors are read-only views of a memory map."""

    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise SafetensorsError(f"{path}: shorter than a header")
                length = int.from_bytes(head, "little")
                if length > size - 8 or length > 100 << 20:
                    raise SafetensorsError(
                        f"{path}: header of {length} bytes does not fit a "
                        f"file of {size}")
                header = json.loads(f.read(length))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: {e}") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{path}: the header is not an object")
        header.pop("__metadata__", None)
        self._data_start = 8 + length
        self._data_size = size - self._data_start
        self._entries = {}
        for name, entry in header.items():
            self._entries[name] = self._check(name, entry)
        self._map = None

    def _check(self, name, entry):
        def integer(x):
            if type(x) is not int:
                raise TypeError(x)
            return x
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [integer(d) for d in entry["shape"]]
            begin, end = (integer(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(
                f"{self.path}: tensor '{name}' has a malformed or unsupported "
                f"header entry {entry!r}") from None
        count = math.prod(shape)  # Python integers: no overflow
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= \
                self._data_size or end - begin != count * np.dtype(dtype).itemsize:
            raise SafetensorsError(
                f"{self.path}: tensor '{name}' ({entry['dtype']} {shape}) "
                f"does not fit its byte range [{begin}, {end}) of "
                f"{self._data_size} data bytes")
        return dtype, shape, begin, end

    def keys(self):
        return self._entries.keys()

    def __contains__(self, name):
        return name in self._entries

    def get(self, name):
        dtype, shape, begin, end = self._entries[name]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[self._data_start + begin:self._data_start + end]
        return raw.view(dtype).reshape(shape)


def write_safetensors(path, tensors, dtypes=None):
    """Writes `tensors` (name -> numpy array) to `path`. `dtypes` may name a
    tensor's safetensors dtype where numpy's does not say it (F8_E8M0)."""
    dtypes = dtypes or {}
    header, offset, arrays = {}, 0, []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = dtypes.get(name) or NAMES.get(array.dtype)
        if dtype is None:
            raise SafetensorsError(f"tensor '{name}': dtype {array.dtype} "
                                   f"has no safetensors name")
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".moe-pack-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for array in arrays:
                f.write(array.tobytes())
            f.flush()
            os.fsync(f.fileno())
            # mkstemp makes the file private; give it the usual mode.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
