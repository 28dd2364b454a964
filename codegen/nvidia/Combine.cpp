//===- Combine.cpp - the combine kernel -----------------------------------===//
//
// moe.combine: a block per token gathers its experts' rows, weights and sums
// them in f32 in the reference's order (choices, then the shared experts and
// their gate), with 16-byte vectors where rows allow.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

LogicalResult nvidia::buildCombine(LayerKernels &layer, CombineOp op) {
  int64_t h = cast<RankedTensorType>(op.getExpertOut().getType()).getDimSize(1);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  TokenLinear tokens = layer.info(op.getRows()).rows;
  layer.define(op.getOut(), tokens);
  SmallVector<Value> buffers = {op.getExpertOut(), op.getRows(), op.getOut()};
  for (Value v : {op.getWeights(), op.getShared(), op.getGate()})
    if (v)
      buffers.push_back(v);
  Kernel k = layer.kernel(op, "combine", buffers);
  int64_t width = vectorWidth(h);
  // A block per token and 128 vectors of its row: a decode call's few rows
  // are spread over as many SMs as they fill.
  k.launch.work = tokens;
  k.launch.block = 128;
  k.launch.gridY = llvm::divideCeil(h, 128 * width);
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
  auto loadVec = [&](Value buffer, ValueRange index) {
    return loadF32Vector(e, buffer, index, width);
  };
  auto splat = [&](Value s) {
    return vector::BroadcastOp::create(b, e.loc, f32Vec, s).getResult();
  };
  Value gateScale = gate ? e.sigmoid(e.load(gate, {t, e.index(0)})) : Value();
  Value chunk = e.imul(k.blockId(gpu::Dimension::y), 128 * width);
  e.forEach(
      e.iadd(chunk, e.imul(tid, width)),
      e.minUI(e.iadd(chunk, e.index(128 * width)), e.index(h)),
      [&](Value c) {
        Value zero = arith::ConstantOp::create(
            b, e.loc, DenseElementsAttr::get(f32Vec, b.getF32FloatAttr(0.0)));
        // The same order as the reference: choices first, then the shared
        // expert.
        Value sum = e.reduce(
            e.index(0), e.index(topK), {zero},
            [&](Value j, ValueRange acc) -> SmallVector<Value> {
              Value row = e.loadRaw(rows, {t, j});
              Value valid = e.icmp(arith::CmpIPredicate::sge, row, e.i32(0));
              auto sel = scf::IfOp::create(b, e.loc, TypeRange{f32Vec}, valid,
                                           /*withElse=*/true);
              OpBuilder::InsertionGuard guard(b);
              b.setInsertionPointToStart(&sel.getThenRegion().front());
              Value term = loadVec(expertOut, {e.toIndex(row), c});
              if (weights)
                term = e.mul(term, splat(e.loadRaw(weights, {t, j})));
              scf::YieldOp::create(b, e.loc, e.add(acc[0], term));
              b.setInsertionPointToStart(&sel.getElseRegion().front());
              scf::YieldOp::create(b, e.loc, acc[0]);
              return {sel.getResult(0)};
            })[0];
        if (shared) {
          Value s = loadVec(shared, {t, c});
          sum = e.add(sum, gate ? e.mul(s, splat(gateScale)) : s);
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
      e.index(128 * width));
  return k.finish(op);
}
