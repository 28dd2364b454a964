//===- FuseQuantization.cpp - quantize where activations are produced ----===//
//
// Moves each activation quantize into the op that produces its input (the
// dispatch's scatter, a matmul's epilogue, a training forward's activation)
// and each dequantize into the
// matmul that reads it, so no activation makes an extra trip through memory
// to change its encoding.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_FUSEQUANTIZATION
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

/// Whether `op` quantizes its input row by row (one scale per row and
/// block), as activations are.
static bool quantizesByRow(QuantizeOp op) {
  auto scales = cast<RankedTensorType>(op.getScales().getType());
  auto data = cast<RankedTensorType>(op.getData().getType());
  return data.getRank() == 2 && scales.getDimSize(0) == data.getDimSize(0);
}

/// ... and is the only user of `input`.
static bool quantizesRowsOf(QuantizeOp op, Value input) {
  return op.getInput() == input && input.hasOneUse() && quantizesByRow(op);
}

/// `dispatch` again, with `scheme` and these result types for its rows and
/// quantized results, in front of it; its layout results are replaced, and
/// the caller replaces the rest and erases it.
static DispatchOp rebuildDispatch(PatternRewriter &rewriter,
                                  DispatchOp dispatch, Type dispatched,
                                  TypeRange quantized, QuantAttr scheme) {
  rewriter.setInsertionPoint(dispatch);
  // Its operands and attributes as they are (alignment, ranks), but quant.
  OperationState state(dispatch.getLoc(), dispatch->getName());
  state.addOperands(dispatch->getOperands());
  state.addTypes({dispatched, dispatch.getTokensPerExpert().getType(),
                  dispatch.getExpertOffsets().getType(),
                  dispatch.getRows().getType()});
  state.addTypes(quantized);
  state.useProperties(dispatch.getProperties());
  auto fused = cast<DispatchOp>(rewriter.create(state));
  fused.setQuantAttr(scheme);
  rewriter.replaceAllUsesWith(dispatch.getTokensPerExpert(),
                              fused.getTokensPerExpert());
  rewriter.replaceAllUsesWith(dispatch.getExpertOffsets(),
                              fused.getExpertOffsets());
  rewriter.replaceAllUsesWith(dispatch.getRows(), fused.getRows());
  return fused;
}

namespace {
/// quantize(dispatch(x)) -> dispatch(x) {quant}.
struct IntoDispatch : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    auto dispatch = op.getInput().getDefiningOp<DispatchOp>();
    if (!dispatch || dispatch.getQuant() ||
        !quantizesRowsOf(op, dispatch.getDispatched()))
      return failure();
    DispatchOp fused =
        rebuildDispatch(rewriter, dispatch, op.getData().getType(),
                        op.getScales().getType(), op.getScheme());
    rewriter.replaceOp(op,
                       {fused.getDispatched(), fused.getDispatchedScales()});
    rewriter.eraseOp(dispatch);
    return success();
  }
};

/// quantize(x), where x is also what a quantizing dispatch scatters (with
/// the same scheme, unscaled) -> the dispatch's `tokens`: it has each row's
/// codes in hand already.
struct IntoDispatchTokens : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    DispatchOp dispatch;
    for (Operation *user : op.getInput().getUsers())
      if (auto d = dyn_cast<DispatchOp>(user))
        if (d.getHiddenStates() == op.getInput() &&
            d.getQuant() == op.getScheme() && !d.getScale() && !d.getTokens())
          dispatch = d;
    if (!dispatch || dispatch->getBlock() != op->getBlock() ||
        !dispatch->isBeforeInBlock(op) || !quantizesByRow(op))
      return failure();
    DispatchOp fused =
        rebuildDispatch(rewriter, dispatch, dispatch.getDispatched().getType(),
                        {dispatch.getDispatchedScales().getType(),
                         op.getData().getType(), op.getScales().getType()},
                        op.getScheme());
    rewriter.replaceOp(op, {fused.getTokens(), fused.getTokenScales()});
    rewriter.replaceAllUsesWith(dispatch.getDispatched(),
                                fused.getDispatched());
    rewriter.replaceAllUsesWith(dispatch.getDispatchedScales(),
                                fused.getDispatchedScales());
    rewriter.eraseOp(dispatch);
    return success();
  }
};

/// quantize(grouped_matmul(...)) -> grouped_matmul(...) {out_quant}.
struct IntoMatmulEpilogue : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    auto matmul = op.getInput().getDefiningOp<GroupedMatmulOp>();
    if (!matmul || matmul.getOutQuant() ||
        !cast<RankedTensorType>(matmul.getOut().getType())
             .getElementType()
             .isBF16() ||
        !quantizesRowsOf(op, matmul.getOut()))
      return failure();
    rewriter.setInsertionPoint(matmul);
    auto fused = GroupedMatmulOp::create(
        rewriter, matmul.getLoc(), op.getData().getType(),
        TypeRange(op.getScales().getType()), matmul.getLhs(), matmul.getRhs(),
        matmul.getTokensPerExpert(), matmul.getExpertOffsets(),
        matmul.getLhsScale(), matmul.getRhsScale(), matmul.getBias(),
        matmul.getActivationAttr(), op.getScheme(), /*configs=*/ArrayAttr(),
        /*transpose_rhs=*/false, Value(), Value(), Value());
    rewriter.replaceOp(op, {fused.getOut(), fused.getOutScale()});
    rewriter.eraseOp(matmul);
    return success();
  }
};

/// quantize(activation(h)) -> activation(h) {quant}: a training forward's
/// activation (kept apart from the gate/up matmul so the matmul's output
/// can be saved) quantizes what it computes for the down matmul.
struct IntoActivation : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    auto activation = op.getInput().getDefiningOp<ActivationOp>();
    if (!activation || activation.getQuant() || activation.getRowWeights() ||
        op.getTranspose() || !op.getTransposed().empty() ||
        !quantizesRowsOf(op, activation.getOut()))
      return failure();
    rewriter.setInsertionPoint(activation);
    auto fused = ActivationOp::create(
        rewriter, activation.getLoc(), op.getData().getType(),
        op.getScales().getType(), activation.getInput(), Value(),
        activation.getActivationAttr(), op.getScheme());
    rewriter.replaceOp(op, {fused.getOut(), fused.getScales()});
    rewriter.eraseOp(activation);
    return success();
  }
};

/// grouped_matmul(dequantize(a), dequantize(b)) -> grouped_matmul(a, b)
/// scales(...), when both use one scheme and the activations' scales are
/// per row.
struct DequantizeIntoMatmul : OpRewritePattern<GroupedMatmulOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(GroupedMatmulOp op,
                                PatternRewriter &rewriter) const override {
    auto lhs = op.getLhs().getDefiningOp<DequantizeOp>();
    auto rhs = op.getRhs().getDefiningOp<DequantizeOp>();
    if (op.getLhsScale() || !lhs || !rhs ||
        lhs.getScheme().getKind() != rhs.getScheme().getKind())
      return failure();
    auto lhsScales = cast<RankedTensorType>(lhs.getScales().getType());
    auto lhsData = cast<RankedTensorType>(lhs.getData().getType());
    if (lhsScales.getDimSize(0) != lhsData.getDimSize(0))
      return failure();
    rewriter.replaceOpWithNewOp<GroupedMatmulOp>(
        op, op.getOut().getType(), op.getExtras().getTypes(), lhs.getData(),
        rhs.getData(), op.getTokensPerExpert(), op.getExpertOffsets(),
        lhs.getScales(), rhs.getScales(), op.getBias(), op.getActivationAttr(),
        op.getOutQuantAttr(), /*configs=*/ArrayAttr(), /*transpose_rhs=*/false,
        Value(), Value(), Value());
    return success();
  }
};

struct FuseQuantizationPass
    : public moe::impl::FuseQuantizationBase<FuseQuantizationPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<IntoDispatch, IntoDispatchTokens, IntoMatmulEpilogue,
                 IntoActivation, DequantizeIntoMatmul>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace
