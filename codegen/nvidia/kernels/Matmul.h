//===- Matmul.h - what the grouped matmul's two kernels share ---*- C++ -*-===//
//
// The grouped matmul has two sm_90a kernels: the tile of 128 rows x 256
// weight rows (GroupedMatmul.cpp) and the decode tile, whose operands are
// swapped (DecodeMatmul.cpp). They find their rows, load their tiles and sum
// their split-K partials the same way.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_MATMUL_H
#define MOE_CODEGEN_NVIDIA_KERNELS_MATMUL_H

#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/support/KernelBuilder.h"

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

/// The views of a grouped matmul kernel's tensor parameters, `buffers`
/// being the op's tensors in parameter order (null where the op has none).
struct MatmulViews {
  MatmulViews(LayerKernels &layer, GroupedMatmulOp op, const MatmulConfig &c,
              Kernel &k, ArrayRef<Value> buffers);
  Value out, counts, offsets, bias, lhsScale, rhsScale, outScale;
  /// An activation's backward epilogue: h, the rows' weights, the first
  /// partial's term and the partial sums of <g, a>.
  Value activationInput, rowWeights, rowTerm, rowDots;
};

/// The descriptor type of a TMA map of K-major tiles of `rows` x 128 bytes
/// (`element` is bf16 or i8 for E4M3), 128-byte swizzled.
nvgpu::TensorMapDescriptorType matmulMapType(MLIRContext *ctx, Type element,
                                             int64_t rows, int64_t tileK);
/// The same for a box of any shape (outer dimensions of 1 first).
nvgpu::TensorMapDescriptorType matmulMapType(MLIRContext *ctx, Type element,
                                             ArrayRef<int64_t> box);

/// Split-K: where this block's split stores its partial for output row
/// `row`, weight row `wr` in the [splits x rows, n] f32 partials of a call
/// of `rows` rows.
SmallVector<Value> splitPartialAt(Kernel &k, TokenLinear rows, Value split,
                                  Value row, Value wr);

/// Split-K, once every split has stored its partials: the tile's blocks
/// count themselves in on its counter (the host sets every counter to the
/// token count before a call, so the last split sees T + splits - 1, and
/// nothing is reset), and only the last continues, after an acquire fence:
/// the builder is left inside an scf.if of it. `consumerBarrier` joins
/// the block's consumer threads; `tid` 0 takes the ticket.
void enterLastSplit(Kernel &k, Value tid, Value counters, Value tile,
                    int64_t splits, function_ref<void()> consumerBarrier);

/// The sums, in split order, of split partials at each (row, wr) of `at`
/// (the same sums whichever split is last), `mine[j]` standing for this
/// block's own split's. A loop over the splits carries the sums: unrolled
/// over splits and elements, a thread would hold every split's partials
/// at once (a decode tile at 8 splits spilled 2832 bytes).
SmallVector<Value> sumSplits(Kernel &k, Value partials, TokenLinear rows,
                             int64_t splits, Value split, ArrayRef<Value> mine,
                             ArrayRef<std::pair<Value, Value>> at);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_MATMUL_H
