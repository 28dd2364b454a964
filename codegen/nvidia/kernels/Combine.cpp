//===- Combine.cpp - the combine kernel -----------------------------------===//
//
// moe.combine: a block per token gathers its experts' rows, weights and sums
// them in f32 in the reference's order (choices, then the shared experts and
// their gate), with 16-byte vectors where rows allow.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

CombineConfig nvidia::configureCombine(CombineOp op, TokenLinear tokens) {
  CombineConfig c;
  c.hidden = cast<RankedTensorType>(op.getExpertOut().getType()).getDimSize(1);
  c.topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  c.tokens = tokens;
  c.width = vectorWidth(c.hidden);
  // A decode call's few rows are spread over as many SMs as they fill.
  c.columnBlocks = llvm::divideCeil(c.hidden, c.threads * c.width);
  return c;
}

/// Token `t`'s weighted sum of its chosen rows at columns [c, c + width),
/// in f32 and in the choices' order, as the reference sums them.
static Value sumChoices(Emitter &e, const CombineConfig &cfg, Value expertOut,
                        Value rows, Value weights, Value t, Value c) {
  OpBuilder &b = e.b;
  auto f32Vec = VectorType::get({cfg.width}, b.getF32Type());
  Value zero = arith::ConstantOp::create(
      b, e.loc, DenseElementsAttr::get(f32Vec, b.getF32FloatAttr(0.0)));
  return e.reduce(
      e.index(0), e.index(cfg.topK), {zero},
      [&](Value j, ValueRange acc) -> SmallVector<Value> {
        Value row = e.loadRaw(rows, {t, j});
        Value valid = e.icmp(arith::CmpIPredicate::sge, row, e.i32(0));
        auto sel = scf::IfOp::create(b, e.loc, TypeRange{f32Vec}, valid,
                                     /*withElse=*/true);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(&sel.getThenRegion().front());
        Value term =
            loadF32Vector(e, expertOut, {e.toIndex(row), c}, cfg.width);
        if (weights)
          term = e.mul(term, vector::BroadcastOp::create(
                                 b, e.loc, f32Vec, e.loadRaw(weights, {t, j}))
                                 .getResult());
        scf::YieldOp::create(b, e.loc, e.add(acc[0], term));
        b.setInsertionPointToStart(&sel.getElseRegion().front());
        scf::YieldOp::create(b, e.loc, acc[0]);
        return {sel.getResult(0)};
      })[0];
}

LogicalResult nvidia::buildCombine(LayerKernels &layer, CombineOp op) {
  TokenLinear tokens = layer.info(op.getRows()).rows;
  CombineConfig cfg = configureCombine(op, tokens);
  int64_t width = cfg.width, step = cfg.threads * width;
  layer.define(op.getOut(), tokens);
  SmallVector<Value> buffers = {op.getExpertOut(), op.getRows(), op.getOut()};
  for (Value v : {op.getWeights(), op.getShared(), op.getGate()})
    if (v)
      buffers.push_back(v);
  Kernel k = layer.kernel(op, "combine", buffers);
  k.launch.work = tokens;
  k.launch.block = cfg.threads;
  k.launch.gridY = cfg.columnBlocks;
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  unsigned next = 3;
  Value expertOut = k.view(0, layer.info(op.getExpertOut()));
  Value rows = k.view(1, layer.info(op.getRows()));
  Value out = k.view(2, layer.info(op.getOut()));
  Value weights =
      op.getWeights() ? k.view(next++, layer.info(op.getWeights())) : Value();
  Value shared =
      op.getShared() ? k.view(next++, layer.info(op.getShared())) : Value();
  Value gate =
      op.getGate() ? k.view(next++, layer.info(op.getGate())) : Value();
  Value t = k.blockId(gpu::Dimension::x), tid = k.threadId();
  k.onlyIf(e.ult(t, k.linear(tokens)));
  auto f32Vec = VectorType::get({width}, b.getF32Type());
  Type outElement = cast<MemRefType>(out.getType()).getElementType();
  Value gateScale = gate ? e.sigmoid(e.load(gate, {t, e.index(0)})) : Value();
  Value chunk = e.imul(k.blockId(gpu::Dimension::y), step);
  e.forEach(
      e.iadd(chunk, e.imul(tid, width)),
      e.minUI(e.iadd(chunk, e.index(step)), e.index(cfg.hidden)),
      [&](Value c) {
        // The same order as the reference: choices first, then the shared
        // expert.
        Value sum = sumChoices(e, cfg, expertOut, rows, weights, t, c);
        if (shared) {
          Value s = loadF32Vector(e, shared, {t, c}, width);
          sum = e.add(sum, gate ? e.mul(s, vector::BroadcastOp::create(
                                               b, e.loc, f32Vec, gateScale)
                                               .getResult())
                                : s);
        }
        Value result =
            outElement.isF32()
                ? sum
                : arith::TruncFOp::create(
                      b, e.loc, VectorType::get({width}, outElement), sum)
                      .getResult();
        vector::StoreOp::create(b, e.loc, result, out, {t, c}, false,
                                vectorAlign(width, outElement));
      },
      e.index(step));
  return k.finish(op);
}
