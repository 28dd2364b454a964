//===- Passes.h - NVIDIA (sm_90a) codegen passes ----------------*- C++ -*-===//

#ifndef MOE_CODEGEN_NVIDIA_PASSES_PASSES_H
#define MOE_CODEGEN_NVIDIA_PASSES_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::moe::nvidia {
#define GEN_PASS_DECL
#include "codegen/nvidia/passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "codegen/nvidia/passes/Passes.h.inc"

/// The toolkit ptxas comes from when none is named: $CUDA_HOME, else
/// /usr/local/cuda.
std::string defaultCudaPath();
} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_PASSES_PASSES_H
