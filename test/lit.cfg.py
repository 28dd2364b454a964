# lit configuration for moe-compiler's FileCheck tests.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "moe-compiler"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "CMakeLists.txt", "unit",
                   "transport", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moe_obj_root, "test")

# MOE_TEST_PYTHON: a Python with this build's wheel installed (scripts/test.sh
# makes one, scripts/wheel.sh): the Python tests then run on the installed
# package, not on this checkout's python/.
wheel_python = os.environ.get("MOE_TEST_PYTHON")
if wheel_python:
    config.python_executable = wheel_python
    config.available_features.add("wheel")
    config.substitutions.append(
        ("%wheel_bin", os.path.dirname(os.path.abspath(wheel_python))))
config.substitutions.append(("%moe_src_root", config.moe_src_root))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%moe_tools_dir", config.moe_tools_dir))

llvm_config.with_system_environment(["HOME", "PATH", "PYTHONPATH"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# The Python helpers import moe_compiler (this checkout's, or the wheel's),
# each other (test/tools) and the reference quantizers' test matrices
# (test/reference).
llvm_config.with_environment(
    "PYTHONPATH", [os.path.join(config.moe_src_root, d)
                   for d in ([] if wheel_python else ["python"]) +
                   ["test/tools", "test/reference"]],
    append_path=True)

# The CUDA toolkit, where installed: ptxas turns the PTX we emit into cubins.
cuda_root = os.environ.get("CUDA_HOME", "/usr/local/cuda")
if os.path.exists(os.path.join(cuda_root, "bin", "ptxas")):
    llvm_config.with_environment("PATH", os.path.join(cuda_root, "bin"),
                                 append_path=True)
    config.available_features.add("ptxas")
else:
    lit_config.note("no ptxas under " + cuda_root + ": cubin checks skip")
# A CUDA driver: GPU layers really run, so "no GPU" errors cannot be tested.
try:
    import ctypes
    ctypes.CDLL("libcuda.so.1")
    config.available_features.add("cuda-driver")
except OSError:
    pass
# Mount namespaces (root, or a user namespace): a test may hide system
# libraries from the tools it runs.
import subprocess
if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0:
    config.available_features.add("mount-namespace")
# PyTorch and transformers, where installed (scripts/setup.sh; MOE_NO_TORCH=1
# leaves them out): the package's torch parts are tested on the CPU.
if subprocess.run([config.python_executable, "-c", "import torch, transformers"],
                  capture_output=True).returncode == 0:
    config.available_features.add("torch")
else:
    lit_config.note("no torch and transformers for " + config.python_executable +
                    ": the PyTorch tests skip")
llvm_config.use_default_substitutions()
llvm_config.add_tool_substitutions(
    ["moe-opt", "moe-compile", "moe-exec", "moe-pack", "moe-quantize", "moe-reference", "moe-quantize-reference"], [config.moe_tools_dir, config.llvm_tools_dir])
