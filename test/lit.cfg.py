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

config.substitutions.append(("%moe_src_root", config.moe_src_root))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%moe_tools_dir", config.moe_tools_dir))

llvm_config.with_system_environment(["HOME", "PATH", "PYTHONPATH"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# The Python helpers import this checkout's moe_compiler, each other
# (test/tools) and the reference quantizers' test matrices (test/reference).
llvm_config.with_environment(
    "PYTHONPATH", [os.path.join(config.moe_src_root, d)
                   for d in ("python", "test/tools", "test/reference")],
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
# PyTorch and transformers, where installed (scripts/setup.sh; MOE_NO_TORCH=1
# leaves them out): the package's torch parts are tested on the CPU.
import subprocess
if subprocess.run([config.python_executable, "-c", "import torch, transformers"],
                  capture_output=True).returncode == 0:
    config.available_features.add("torch")
else:
    lit_config.note("no torch and transformers for " + config.python_executable +
                    ": the PyTorch tests skip")
llvm_config.use_default_substitutions()
llvm_config.add_tool_substitutions(
    ["moe-opt", "moe-compile", "moe-exec", "moe-pack", "moe-quantize", "moe-reference", "moe-quantize-reference"], [config.moe_tools_dir, config.llvm_tools_dir])
