//===- Matmul.h - what the grouped matmul's two kernels share ---*- C++ -*-===//
//
// The grouped matmul has two sm_90a kernels: the tile of 128 rows x 256
// weight rows (GroupedMatmul.cpp) and the decode tile, whose operands are
// swapped (DecodeMatmul.cpp). They find their rows the same way.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_MATMUL_H
#define MOE_CODEGEN_NVIDIA_MATMUL_H

#include "codegen/nvidia/KernelBuilder.h"
#include "codegen/nvidia/KernelConfigs.h"

#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

namespace mlir::moe::nvidia {

/// The expert and rows [start, end) of row tile `target` (i32) when each
/// expert's rows are cut into tiles of `tileM` rows: (-1, 0, 0) past the
/// last. Every lane of every warp that calls it must run it.
SmallVector<Value> findTile(Emitter &e, Value tid, Value counts, Value offsets,
                            int64_t experts, int64_t tileM, Value target);

/// The tiles of `tileM` rows the experts' rows fill (each expert's own), as
/// an index every thread of a warp holds.
Value countTiles(Emitter &e, Value tid, Value counts, int64_t experts,
                 int64_t tileM);

/// The descriptor type of a TMA map of K-major tiles of `rows` x 128 bytes
/// (`element` is bf16 or i8 for E4M3), 128-byte swizzled.
nvgpu::TensorMapDescriptorType matmulMapType(MLIRContext *ctx, Type element,
                                             int64_t rows, int64_t tileK);

/// Emits the body of `op`'s decode-tile kernel (config `c`, swap_ab):
/// parameters `buffers` (the op's tensors, plan buffers `indices`), then
/// the split-K partials and counters, then the two tensor maps.
LogicalResult emitDecodeMatmul(LayerKernels &layer, GroupedMatmulOp op,
                               const MatmulConfig &c, const TensorInfo &lhs,
                               Kernel &k, ArrayRef<Value> buffers,
                               ArrayRef<unsigned> indices,
                               const TensorInfo &partials);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_MATMUL_H
