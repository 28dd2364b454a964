//===- ExpertParallel.cpp - token exchanges between expert-parallel ranks -===//
//
// A dispatch whose experts live on several ranks becomes a send and a
// receive, and the combine it feeds sums expert outputs that a second send
// and receive brought home. Splitting each exchange in two halves lets other
// work (the shared experts here) run while tokens travel.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_EXPERTPARALLEL
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

/// Rewrites `dispatch` (ep_size > 1) and the combines that read its rows.
static LogicalResult splitDispatch(DispatchOp dispatch) {
  int64_t ranks = dispatch.getEpSize();
  auto rowsType = cast<RankedTensorType>(dispatch.getRows().getType());
  auto hiddenType =
      cast<RankedTensorType>(dispatch.getHiddenStates().getType());
  int64_t tokens = hiddenType.getDimSize(0), hidden = hiddenType.getDimSize(1);
  int64_t localExperts =
      cast<RankedTensorType>(dispatch.getTokensPerExpert().getType())
          .getDimSize(0);
  if (dispatch.getAlign() != 1)
    return dispatch.emitOpError()
           << "aligns expert rows to " << dispatch.getAlign()
           << "; expert-parallel dispatch lays them out back to back";
  SmallVector<CombineOp> combines;
  for (Operation *user : dispatch.getRows().getUsers()) {
    auto combine = dyn_cast<CombineOp>(user);
    if (!combine || combine.getRows() != dispatch.getRows() ||
        combine.getExpertOut() == dispatch.getRows())
      return user->emitOpError()
             << "reads an expert-parallel dispatch's rows; only moe.combine "
                "can, once the expert outputs have come home";
    combines.push_back(combine);
  }

  IRRewriter rewriter(dispatch);
  Location loc = dispatch.getLoc();
  Type i32 = rewriter.getI32Type();
  QuantAttr quant = dispatch.getQuantAttr();
  Value scale = dispatch.getScale();
  SmallVector<Type> travelling;
  if (quant && !scale) {
    auto codes = RankedTensorType::get({tokens, hidden},
                                       rewriter.getType<Float8E4M3FNType>());
    travelling = {codes, RankedTensorType::get(
                             getScaleShape(quant, {tokens, hidden}, false),
                             quant.getScaleType())};
  }
  auto send = EpDispatchSendOp::create(
      rewriter, loc, RankedTensorType::get({ranks}, i32), rowsType, travelling,
      dispatch.getHiddenStates(), dispatch.getExpertIds(), scale,
      rewriter.getI64IntegerAttr(localExperts), quant);
  SmallVector<Type> scales;
  if (Value s = dispatch.getDispatchedScales())
    scales.push_back(s.getType());
  auto recv = EpDispatchRecvOp::create(
      rewriter, loc, dispatch.getDispatched().getType(),
      dispatch.getTokensPerExpert().getType(),
      dispatch.getExpertOffsets().getType(),
      RankedTensorType::get({ShapedType::kDynamic, 2}, i32), scales,
      send.getSent(), scale ? rewriter.getUnitAttr() : UnitAttr(), UnitAttr(),
      quant);
  rewriter.replaceAllUsesWith(dispatch.getDispatched(), recv.getDispatched());
  rewriter.replaceAllUsesWith(dispatch.getTokensPerExpert(),
                              recv.getTokensPerExpert());
  rewriter.replaceAllUsesWith(dispatch.getExpertOffsets(),
                              recv.getExpertOffsets());
  if (Value s = dispatch.getDispatchedScales())
    rewriter.replaceAllUsesWith(s, recv.getQuantized()[0]);
  if (Value codes = dispatch.getTokens()) {
    rewriter.replaceAllUsesWith(codes, send.getQuantized()[0]);
    rewriter.replaceAllUsesWith(dispatch.getTokenScales(),
                                send.getQuantized()[1]);
  }

  for (CombineOp combine : combines) {
    Value expertOut = combine.getExpertOut();
    if (!cast<RankedTensorType>(expertOut.getType()).getElementType().isBF16())
      return combine.emitOpError()
             << "combines " << expertOut.getType()
             << " expert outputs; expert-parallel layers return them in bf16";
    // Outputs leave as soon as they exist; they are awaited only where
    // they are summed.
    if (Operation *producer = expertOut.getDefiningOp())
      rewriter.setInsertionPointAfter(producer);
    else
      rewriter.setInsertionPointAfter(recv);
    auto back = EpCombineSendOp::create(rewriter, combine.getLoc(),
                                        RankedTensorType::get({ranks}, i32),
                                        expertOut, recv.getOrigin(), Value());
    rewriter.setInsertionPoint(combine);
    auto home = EpCombineRecvOp::create(
        rewriter, combine.getLoc(),
        RankedTensorType::get({ShapedType::kDynamic, hidden},
                              rewriter.getBF16Type()),
        Type(), back.getSent(), send.getRows());
    rewriter.modifyOpInPlace(combine, [&] {
      combine.getExpertOutMutable().assign(home.getGathered());
      combine.getRowsMutable().assign(send.getRows());
    });
  }
  rewriter.eraseOp(dispatch);
  return success();
}

namespace {
struct ExpertParallelPass
    : public moe::impl::ExpertParallelBase<ExpertParallelPass> {
  void runOnOperation() override {
    SmallVector<DispatchOp> dispatches;
    getOperation()->walk([&](DispatchOp dispatch) {
      if (dispatch.isExpertParallel())
        dispatches.push_back(dispatch);
    });
    for (DispatchOp dispatch : dispatches)
      if (failed(splitDispatch(dispatch)))
        return signalPassFailure();
  }
};
} // namespace
