//===- DecodeMatmul.h - the expert matmul's decode tile ---------*- C++ -*-===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_DECODEMATMUL_H
#define MOE_CODEGEN_NVIDIA_KERNELS_DECODEMATMUL_H

#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/support/KernelBuilder.h"

namespace mlir::moe::nvidia {

/// Emits the body of `op`'s decode-tile kernel (config `c`, swap_ab):
/// parameters `buffers` (the op's tensors, plan buffers `indices`), then
/// the split-K partials and counters, then the two tensor maps.
LogicalResult emitDecodeMatmul(LayerKernels &layer, GroupedMatmulOp op,
                               const MatmulConfig &c, const TensorInfo &lhs,
                               Kernel &k, ArrayRef<Value> buffers,
                               ArrayRef<unsigned> indices,
                               const TensorInfo &partials);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_DECODEMATMUL_H
