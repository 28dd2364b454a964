//===- GatherDot.cpp - each choice's row dotted with its token ------------===//
//
// moe.gather_dot, the gradient of a routing weight that scaled a token into
// its row (Llama-4): a warp per token, its choices in turn, the lanes on
// columns and their products summed by shuffles.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

LogicalResult nvidia::buildGatherDot(LayerKernels &layer, GatherDotOp op) {
  constexpr int64_t warps = 8;
  // Without rows, a warp per row, summing its own partials.
  Value units = op.getRows() ? op.getRows() : op.getRowValues();
  TokenLinear tokens = layer.info(units).rows;
  int64_t h = cast<RankedTensorType>(op.getRowValues().getType()).getDimSize(1);
  int64_t topK =
      op.getRows()
          ? cast<RankedTensorType>(op.getRows().getType()).getDimSize(1)
          : 1;
  layer.define(op.getOut(), tokens);
  // Without tokens, each row's partials summed: the units stand in for
  // them (never read).
  Value xs = op.getTokens() ? op.getTokens() : units;
  Kernel k = layer.kernel(op, "gather_dot",
                          {op.getRowValues(), xs, units, op.getOut()});
  k.launch.work = tokens;
  k.launch.perBlock = warps;
  k.launch.block = warps * 32;
  Emitter &e = k.e;
  Value values = k.view(0, layer.info(op.getRowValues()));
  Value x = op.getTokens() ? k.view(1, layer.info(op.getTokens())) : Value();
  Value rows = op.getRows() ? k.view(2, layer.info(op.getRows())) : Value();
  Value out = k.view(3, layer.info(op.getOut()));
  Value tid = k.threadId();
  Value lane = e.remUI(tid, e.index(32));
  Value t = e.iadd(e.imul(k.blockId(gpu::Dimension::x), warps),
                   e.divUI(tid, e.index(32)));
  // Warp-uniform: a whole warp has a token or none.
  e.ifThen(e.ult(t, k.linear(tokens)), [&] {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value r = rows ? e.loadRaw(rows, {t, j}) : e.toI32(t);
      Value valid = e.icmp(arith::CmpIPredicate::sge, r, e.i32(0));
      Value ri = e.toIndex(e.select(valid, r, e.i32(0)));
      Value partial = e.reduce(
          lane, e.index(h), {e.f32(0.0)},
          [&](Value c, ValueRange acc) -> SmallVector<Value> {
            Value v = e.load(values, {ri, c});
            return {e.add(acc[0], x ? e.mul(v, e.load(x, {t, c})) : v)};
          },
          e.index(32))[0];
      partial = warpButterfly(e, partial,
                              [&](Value x, Value y) { return e.add(x, y); });
      e.ifThen(e.eq(lane, e.index(0)), [&] {
        e.storeRaw(e.select(valid, partial, e.f32(0.0)), out, {t, j});
      });
    });
  });
  return k.finish(op);
}
