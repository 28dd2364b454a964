#!/usr/bin/env python3
"""An expert-parallel layer's init takes rank 0's listening socket
(moe_ep_config_t.listen_fd): a refused config still closes it. Calls init
with configs it refuses, each with a fresh listening socket, and prints the
refusal and whether the socket is closed."""
import ctypes
import os
import socket
import sys

from check_ep import layer_info
from moe_compiler.ep import EpConfig


def main():
    path = os.path.abspath(sys.argv[1])
    info = layer_info(path)
    lib = ctypes.CDLL(path)
    lib.moe_last_error.restype = ctypes.c_char_p
    init = getattr(lib, info["ep"]["init"])
    init.restype = ctypes.c_int32
    init.argtypes = [ctypes.c_void_p]
    ranks = info["ep"]["ranks"]
    cases = {"world size": dict(world_size=ranks + 1),
             "max tokens": dict(max_tokens=-1),
             "timeout": dict(timeout_ms=-5)}
    status = 0
    for what, change in cases.items():
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        fd = listener.detach()  # init's now, not this object's
        inode = os.fstat(fd).st_ino
        fields = dict(rank=0, world_size=ranks, bootstrap_host=b"127.0.0.1",
                      bootstrap_port=0, listen_fd=fd, max_tokens=8,
                      provider=None, domain=None, timeout_ms=1000, proxy=0)
        fields.update(change)
        if init(ctypes.byref(EpConfig(**fields))) == 0:
            print(f"{what}: UNEXPECTED: init took the config")
            return 1
        # Closed, or the number taken since by something else.
        try:
            closed = os.fstat(fd).st_ino != inode
        except OSError:
            closed = True
        if not closed:
            os.close(fd)
        print(f"{what}: refused ({lib.moe_last_error().decode()}); "
              f"listen_fd {'closed' if closed else 'LEFT OPEN'}")
        status |= 0 if closed else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
