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
