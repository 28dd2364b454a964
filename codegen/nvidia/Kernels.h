//===- Kernels.h - sm_90a kernels for a decomposed layer --------*- C++ -*-===//
//
// lowerToKernels turns a function of L1 moe ops into a gpu.module of kernels
// and a launch plan: which buffers each kernel reads and writes, its grid as a
// function of the token count, and the TMA descriptors the matmuls need. The
// host code (codegen/host/LaunchEntry.cpp) carries the plan out on a stream.
//
// Kernels take only pointers and the token count; each builds its memref
// views itself, so the host passes neither sizes nor strides.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_H
#define MOE_CODEGEN_NVIDIA_KERNELS_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace mlir::moe::nvidia {

/// A size that depends on the token count T: fixed + perToken * T.
struct Linear {
  int64_t fixed = 0, perToken = 0;
};

/// A device buffer: one of the caller's arguments, or a slice of the
/// workspace of `bytes`.
struct Buffer {
  int argIndex = -1;
  Linear bytes;
};

/// A TMA descriptor of a row-major [rows, cols] buffer read in
/// [boxRows, boxCols] tiles.
struct TensorMap {
  unsigned buffer;
  int64_t elementBytes;
  Linear rows;
  int64_t cols, boxRows, boxCols;
};

/// One grid dimension: ceil((fixed + perToken * T) / divisor) + plus.
struct GridDim {
  Linear count;
  int64_t divisor = 1, plus = 0;
};

/// A kernel argument: a buffer's address, a TMA descriptor's, or T.
struct KernelArg {
  enum Kind { BufferAddress, TensorMapAddress, Tokens } kind;
  unsigned index = 0;
};

struct Launch {
  std::string kernel;
  GridDim gridX, gridY;
  int64_t block = 128, sharedBytes = 0;
  std::vector<KernelArg> args;
};

struct Plan {
  std::vector<Buffer> buffers;
  std::vector<TensorMap> tensorMaps;
  std::vector<Launch> launches;
};

/// Builds `module`'s gpu.module @kernels for `func` (L1 ops on tensors whose
/// only dynamic size is the leading token dimension; results are returned in
/// the caller's output buffers, numbered after the arguments) and returns
/// the plan that runs them.
FailureOr<Plan> lowerToKernels(func::FuncOp func, ModuleOp module);

/// Lowers the gpu.module of `module` to NVVM and serializes it for sm_90a
/// with ptxas from `cudaPath`: a cubin, or PTX when `ptx` is set.
FailureOr<std::string> compileKernels(ModuleOp module, StringRef cudaPath,
                                      bool ptx);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_H
