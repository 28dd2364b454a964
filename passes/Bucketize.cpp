//===- Bucketize.cpp - token buckets for a layer's dynamic token count ----===//
//
// Decode calls bring a few tokens, prefill thousands; kernels sized for one
// waste the other, and launching eight kernels from the host costs more
// than a decode step's weight reads. A layer with buckets gets a plan per
// bucket (moe-build-kernels specializes its kernels and grids to the
// bucket's size) and the host code replays one CUDA graph per bucket.
// An expert-parallel layer's bucket is its own token count: what its
// kernels receive from other ranks keeps the capacity's grids.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_BUCKETIZE
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
struct BucketizePass : public moe::impl::BucketizeBase<BucketizePass> {
  using BucketizeBase::BucketizeBase;

  void runOnOperation() override {
    // Layers that cannot take buckets say so only when buckets were asked
    // for by name.
    bool asked = !buckets.empty();
    SmallVector<int64_t> sizes(buckets.begin(), buckets.end());
    if (sizes.empty())
      for (int64_t b = 1; b <= 4096; b *= 2)
        sizes.push_back(b);
    for (auto [i, size] : llvm::enumerate(sizes)) {
      if (size < 1 || (i > 0 && size <= sizes[i - 1])) {
        getOperation()->emitError()
            << "token buckets must be ascending counts of at least 1; "
               "bucket "
            << i << " is " << size;
        return signalPassFailure();
      }
    }
    getOperation()->walk([&](func::FuncOp func) {
      bool moeOps = false;
      func.walk(
          [&](Operation *op) { moeOps |= isa<MoeDialect>(op->getDialect()); });
      // A training step (moe-differentiate's) runs at one count, the
      // caller's batch: its kernels take any count, with no graphs.
      if (!moeOps || func.isExternal() || func->hasAttr("moe.saved") ||
          func->hasAttr("moe.gradients"))
        return;
      bool dynamic = llvm::any_of(func.getArgumentTypes(), [](Type t) {
        auto tensor = dyn_cast<RankedTensorType>(t);
        return tensor && tensor.getRank() > 0 && tensor.isDynamicDim(0);
      });
      if (!dynamic) {
        if (asked)
          func.emitRemark() << "no token buckets: the token count is fixed";
        return;
      }
      func->setAttr(kTokenBucketsAttrName,
                    DenseI64ArrayAttr::get(func.getContext(), sizes));
    });
  }
};
} // namespace
