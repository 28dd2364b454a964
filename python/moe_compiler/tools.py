"""The native tools of an installed wheel: moe-compile, moe-opt and moe-exec
live in _native/bin beside the shared libraries they load (_native/lib), and
the console commands of the same names start them in place of Python.

A source checkout has no _native: its tools are in build/bin."""
import os
import sys

NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")


def native_tool(name):
    """The path of the wheel's own `name`, or None outside a wheel."""
    path = os.path.join(NATIVE, "bin", name)
    return path if os.access(path, os.X_OK) else None


def _run(name):
    path = native_tool(name)
    if path is None:
        sys.exit(f"{name}: this moe_compiler ({os.path.dirname(NATIVE)}) "
                 f"was not installed from a wheel and has no {name}; "
                 f"build/bin of a source checkout has it")
    os.execv(path, [path] + sys.argv[1:])


def moe_compile():
    _run("moe-compile")


def moe_opt():
    _run("moe-opt")


def moe_exec():
    _run("moe-exec")
