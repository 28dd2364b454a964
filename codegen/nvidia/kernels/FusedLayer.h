//===- FusedLayer.h - a bucket's chain of kernels as one kernel -*- C++ -*-===//
//
// The fused kernel that passes/FuseLaunches.cpp puts in a bucket's plan in
// place of its chain of kernels (FusedLayer.cpp says how it runs them).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_FUSEDLAYER_H
#define MOE_CODEGEN_NVIDIA_KERNELS_FUSEDLAYER_H

#include "codegen/nvidia/support/KernelBuilder.h"

namespace mlir::moe::nvidia {

/// Named barriers a sub-block may use: ids [0, 4) of its kernel become
/// [1 + 4s, 5 + 4s) for sub-block s (barrier 0 is the whole block's), so at
/// most three sub-blocks fit the sixteen.
constexpr int64_t kBarriersPerSubBlock = 4, kMaxSubBlocks = 3;

/// One kernel of the chain as a step of the fused kernel.
struct FusedStep {
  Launch *launch;
  gpu::GPUFuncOp func;
  /// Virtual blocks: gridX x gridY at the bucket's size.
  int64_t gridX = 0, gridY = 0;
  /// Threads of the kernel, whole warpgroups first; sub-blocks side by side.
  int64_t threads = 0, subBlocks = 1;
  int64_t staticBytes = 0;
  /// The fused kernel's arguments for the kernel's.
  SmallVector<unsigned> args;
  int64_t blocks() const { return gridX * gridY; }
  int64_t warpgroupThreads() const { return threads / 128 * 128; }
  int64_t restThreads() const { return threads % 128; }
};

/// The id operand of `op` when it is a named barrier that namedBarrierSync
/// or namedBarrierArrive emitted, else null.
Value namedBarrierId(LLVM::InlineAsmOp op);

/// Builds the kernel `name` of `threads` threads a block that runs `steps`
/// (the kernels of `plan`, built into `module`) one after another, and
/// makes its launch the plan's only one.
void emitFusedLayer(gpu::GPUModuleOp module, LaunchPlan &plan,
                    MutableArrayRef<FusedStep> steps, int64_t threads,
                    Location loc, StringRef name);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_FUSEDLAYER_H
