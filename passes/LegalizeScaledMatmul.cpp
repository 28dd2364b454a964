//===- LegalizeScaledMatmul.cpp - FP8 matmuls for targets without them ---===//
//
// A target whose matmul kernel reads bf16 runs an FP8 matmul as dequantize
// plus bf16 matmul. The scheme comes from the scales' type: E8M0 scales are
// MXFP8's, f32 scales FP8 block-128's.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_LEGALIZESCALEDMATMUL
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
struct DequantizeOperands : OpRewritePattern<GroupedMatmulOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(GroupedMatmulOp op,
                                PatternRewriter &rewriter) const override {
    if (!op.getLhsScale())
      return failure();
    // Each dequantize is named after the matmul's step and its operand.
    auto named = [&](StringRef operand) -> Location {
      auto step = dyn_cast<NameLoc>(op.getLoc());
      if (!step)
        return op.getLoc();
      return NameLoc::get(
          rewriter.getStringAttr(step.getName().strref() + "_" + operand),
          step.getChildLoc());
    };
    auto dequantize = [&](Value data, Value scales, StringRef operand) {
      auto dataType = cast<RankedTensorType>(data.getType());
      auto type =
          RankedTensorType::get(dataType.getShape(), rewriter.getBF16Type());
      return DequantizeOp::create(rewriter, named(operand), type, data, scales,
                                  op.getScheme())
          .getOutput();
    };
    Value lhs = dequantize(op.getLhs(), op.getLhsScale(), "input");
    Value rhs = dequantize(op.getRhs(), op.getRhsScale(), "weights");
    rewriter.replaceOpWithNewOp<GroupedMatmulOp>(
        op, op.getOut().getType(), op.getExtras().getTypes(), lhs, rhs,
        op.getTokensPerExpert(), op.getExpertOffsets(), Value(), Value(),
        op.getBias(), op.getActivationAttr(), op.getOutQuantAttr(),
        /*configs=*/ArrayAttr(),
        /*transpose_rhs=*/false, Value(), Value(), Value());
    return success();
  }
};

struct LegalizeScaledMatmulPass
    : public moe::impl::LegalizeScaledMatmulBase<LegalizeScaledMatmulPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<DequantizeOperands>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace
