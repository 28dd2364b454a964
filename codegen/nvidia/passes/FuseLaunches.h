//===- FuseLaunches.h - a fused bucket's plan -------------------*- C++ -*-===//

#ifndef MOE_CODEGEN_NVIDIA_PASSES_FUSELAUNCHES_H
#define MOE_CODEGEN_NVIDIA_PASSES_FUSELAUNCHES_H

#include "codegen/nvidia/support/LaunchPlan.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::moe::nvidia {

/// Stitches the launches of `plan`, whose kernels were just built into
/// `module`, into one cooperative kernel of a block per multiprocessor
/// (kernels/FusedLayer.cpp), named uniquely among `names`. Where one of the
/// kernels cannot be a step of it, leaves the chain (less any prefetch step)
/// with a remark on `anchor` saying why.
void fuseLaunches(gpu::GPUModuleOp module, LaunchPlan &plan,
                  llvm::StringSet<> &names, Operation *anchor);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_PASSES_FUSELAUNCHES_H
