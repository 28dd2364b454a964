//===- Kernels.h - the kernel families' entry points ------------*- C++ -*-===//
//
// moe-build-kernels hands each L1 op to its family's builder, one file a
// family; a family that reuses another's kernel calls its builder here.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_KERNELS_H
#define MOE_CODEGEN_NVIDIA_KERNELS_KERNELS_H

#include "codegen/nvidia/support/KernelBuilder.h"

namespace mlir::moe::nvidia {

/// Quantizes the rank-2 bf16 `input` (rows a multiple of 8 wide) row by
/// row into `data` and `scales`, a block of threads per row (Quantize.cpp).
LogicalResult buildRowQuantize(LayerKernels &layer, Operation *op, Value input,
                               Value data, Value scales, QuantAttr scheme);

/// In a fused bucket (moe-fuse-layer), after `route`: a kernel whose
/// blocks prefetch into L2 the first bytes of each row of the weights of
/// the experts the tokens chose, as much as L2 keeps while the dispatch
/// runs, so that the matmuls' weight streams start early (ExpertPrefetch.cpp).
LogicalResult buildExpertPrefetch(LayerKernels &layer, RouteOp route);

// The kernel families, one file each.
LogicalResult buildRoute(LayerKernels &layer, RouteOp op);
LogicalResult buildRouteGrad(LayerKernels &layer, RouteGradOp op);
LogicalResult buildDispatch(LayerKernels &layer, DispatchOp op);

/// The choices of `ids` ([T, k] i32, `choices` of them) of experts
/// [0, experts) numbered within their expert in choice order, by one block
/// of `warps` warps (Dispatch.cpp): each warp takes a run of consecutive
/// choices, 32 at a time, and counts them per expert; the numbers are
/// shared out among the warps in warp order, and each warp numbers its
/// choices of an expert in order (lanes of one expert meet by match.any).
/// `table` [warps, experts] i32, shared or global, holds each warp's count,
/// then its next number.
class OrderedChoices {
public:
  OrderedChoices(Kernel &k, Value ids, Value choices, int64_t experts,
                 int64_t topK, int64_t warps, Value table);
  /// Counts each expert's choices into `count` ([experts] i32, shared;
  /// none where null) and each warp's into the table; zeroes both first.
  void count(Value count);
  /// Each warp's first number of expert x: `first(x)`, plus the expert's
  /// choices in the warps before it.
  void startWarps(function_ref<Value(Value x)> first);
  /// `store(p, number)` for each choice p, -1 for one of no expert.
  void place(function_ref<void(Value p, Value number)> store);
  /// Choice p's token and place among its token's choices.
  SmallVector<Value> at(Value p);

private:
  static constexpr int64_t kBatch = 4, kBatchChoices = kBatch * 32;
  Value expertAt(Value p);
  void steps(function_ref<void(Value, Value)> body);

  Kernel &k;
  Emitter &e;
  Value ids;
  int64_t experts, topK, warps;
  Value table, warp, lane, run, runStart, runEnd;
};
LogicalResult buildScatter(LayerKernels &layer, ScatterOp op);
LogicalResult buildGroupedMatmul(LayerKernels &layer, GroupedMatmulOp op);
LogicalResult buildActivation(LayerKernels &layer, ActivationOp op);
LogicalResult buildActivationGrad(LayerKernels &layer, ActivationGradOp op);
LogicalResult buildGroupedMatmulWgrad(LayerKernels &layer,
                                      GroupedMatmulWgradOp op);
/// Whether `op` is a product sm_90a runs on CUDA cores (SimtMatmul.cpp): a
/// weight gradient of an f32 output gradient or without a matrix lhs (row
/// sums), or an input gradient moe-legalize left (not bf16 x bf16, with
/// `acc`, or kept for its bias_dot alone).
bool takesSimtMatmul(Operation *op);
LogicalResult buildSimtWgrad(LayerKernels &layer, GroupedMatmulWgradOp op);
LogicalResult buildSimtDgrad(LayerKernels &layer, GroupedMatmulDgradOp op);
LogicalResult buildGatherDot(LayerKernels &layer, GatherDotOp op);
LogicalResult buildCombine(LayerKernels &layer, CombineOp op);
LogicalResult buildQuantize(LayerKernels &layer, QuantizeOp op);
LogicalResult buildDequantize(LayerKernels &layer, DequantizeOp op);
LogicalResult buildPad(LayerKernels &layer, PadOp op);
LogicalResult buildTranspose(LayerKernels &layer, TransposeOp op);
LogicalResult buildAttention(LayerKernels &layer, TiledAttentionOp op);
LogicalResult buildEpDispatchSend(LayerKernels &layer, EpDispatchSendOp op);
LogicalResult buildEpDispatchRecv(LayerKernels &layer, EpDispatchRecvOp op);
LogicalResult buildEpCombineSend(LayerKernels &layer, EpCombineSendOp op);
LogicalResult buildEpCombineRecv(LayerKernels &layer, EpCombineRecvOp op);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_KERNELS_H
