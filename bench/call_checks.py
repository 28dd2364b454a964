"""Calls a GPU layer the way a careless caller might: a negative or huge
token count, a null or misaligned argument, no workspace. Each call must fail
with a message that names the problem, launch nothing, and leave the CUDA
context usable: a correct forward runs after them. Prints one JSON line per
case; exits nonzero if any case misbehaves.

    python3 -m bench.call_checks LIB
"""
import ctypes
import sys

import torch
from moe_compiler.layer import Layer, LayerError

from bench.common import emit, make_inputs


def main():
    layer = Layer(sys.argv[1])
    tokens = 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = make_inputs(layer, tokens, gen, "cuda")
    workspace = torch.empty(max(layer.workspace_size(tokens), 1),
                            dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    ok = True

    def raw(pointers, count, ws):
        array = (ctypes.c_void_p * len(pointers))(*pointers)
        status = layer._forward(array, count, stream, ws)
        return status, layer.lib.moe_last_error().decode()

    good = [t.data_ptr() for t in tensors]
    cases = {
        "negative tokens": (good, -1, workspace.data_ptr(), "outside"),
        "huge tokens": (good, 1 << 40, workspace.data_ptr(), "outside"),
        "null weight": ([good[0], None] + good[2:], tokens,
                        workspace.data_ptr(), "argument 1 is null"),
        "misaligned hidden": ([good[0] + 2] + good[1:], tokens,
                              workspace.data_ptr(), "not 16-byte aligned"),
        "no workspace": (good, tokens, None, "workspace"),
    }
    for name, (pointers, count, ws, expect) in cases.items():
        status, message = raw(pointers, count, ws)
        passed = status != 0 and expect in message
        ok &= passed
        emit(what="call-check", case=name, status=status, message=message,
             ok=passed)
    # The context survived: a correct forward runs and gives finite output.
    try:
        out = layer.forward(*tensors)
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out.float()).all())
    except (LayerError, RuntimeError) as e:
        finite = False
        emit(what="call-check", case="after", error=str(e))
    ok &= finite
    emit(what="call-check", case="forward after", ok=finite)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
