//===- FuseLayer.cpp - small buckets as one persistent kernel -------------===//
//
// A decode step's layer is a chain of seven small kernels whose launch
// gaps and ramps cost more than its weights take to read. For the buckets
// of at most `max-tokens` tokens, moe-build-kernels stitches the chain into
// one kernel with a block per multiprocessor that runs each step over the
// step's own grid and meets at a grid barrier between steps. This pass
// chooses those buckets (`moe.fused_buckets`); a layer or bucket that
// cannot run that way keeps its chain, with a remark saying why.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_FUSELAYER
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

/// Why bucket `tokens` of `func` keeps its chain of kernels, or "".
static std::string chainReason(func::FuncOp func, int64_t tokens) {
  std::string reason;
  // The exchange kernels spin on other ranks' flags, which a grid barrier
  // of the one fused kernel would wait behind.
  func.walk([&](Operation *op) {
    if (isa<EpDispatchSendOp, EpDispatchRecvOp, EpCombineSendOp,
            EpCombineRecvOp>(op))
      reason = "an expert-parallel exchange waits on other ranks";
  });
  if (!reason.empty())
    return reason;
  func.walk([&](GroupedMatmulOp op) {
    MatmulConfigAttr config = op.getConfigFor(tokens);
    if (!config)
      reason = "a grouped matmul has no configuration for it (run "
               "moe-configure-matmuls first)";
    else if (config.getClusterM() * config.getClusterN() > 1)
      reason = "a grouped matmul's tiles form clusters, which a grid of one "
               "block per multiprocessor cannot launch";
    else if (config.getPersistent())
      reason = "a grouped matmul is persistent (it walks its tiles itself)";
    return reason.empty() ? WalkResult::advance() : WalkResult::interrupt();
  });
  return reason;
}

namespace {
struct FuseLayerPass : public moe::impl::FuseLayerBase<FuseLayerPass> {
  using FuseLayerBase::FuseLayerBase;

  void runOnOperation() override {
    if (maxTokens < 0) {
      getOperation()->emitError()
          << "moe-fuse-layer's max-tokens must be at least 0, not "
          << static_cast<int64_t>(maxTokens);
      return signalPassFailure();
    }
    getOperation()->walk([&](func::FuncOp func) {
      auto buckets =
          func->getAttrOfType<DenseI64ArrayAttr>(kTokenBucketsAttrName);
      if (!buckets || maxTokens == 0)
        return;
      // Attention's kernels stay a chain: theirs is a split schedule of
      // its own (moe-split-attention).
      Operation *attention = nullptr;
      func.walk([&](Operation *op) {
        if (isa<AttentionOp, TiledAttentionOp>(op))
          attention = op;
      });
      SmallVector<int64_t> fused;
      for (int64_t size : buckets.asArrayRef()) {
        if (size > maxTokens)
          break;
        if (attention) {
          func.emitRemark() << "bucket " << size
                            << " keeps its chain of kernels: attention is "
                               "launched as its own kernels";
          continue;
        }
        std::string reason = chainReason(func, size);
        if (!reason.empty()) {
          func.emitRemark()
              << "bucket " << size << " keeps its chain of kernels: " << reason;
          continue;
        }
        fused.push_back(size);
      }
      if (!fused.empty())
        func->setAttr(kFusedBucketsAttrName,
                      DenseI64ArrayAttr::get(func.getContext(), fused));
    });
  }
};
} // namespace
