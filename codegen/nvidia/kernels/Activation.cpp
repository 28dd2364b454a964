//===- Activation.cpp - the training forward's and backward's activations -===//
//
// moe.activation (a gated matmul's epilogue as a step of its own, so the
// training forward keeps its input; quantized for the down matmul, with
// moe.quantize's arithmetic) and moe.activation_grad (its backward
// with the row's routing weight) as elementwise kernels, with the CPU
// backend's arithmetic (common::activate, common::activationGrad) so both
// backends round alike. The forward: a block per row. The backward: a warp
// per token (its choices' rows one after another) or per row (shared
// experts), whose lanes sum the weight's gradient <g, a> and combine it by
// shuffles.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static constexpr int64_t kThreads = 128, kWarps = kThreads / 32;

/// Row `r`'s activations quantized as moe.quantize quantizes the bf16 ones:
/// each thread 8 columns of a 1024-column stride (every thread takes every
/// stride, so a block's lanes can combine its largest magnitude by
/// shuffles: 16 lanes a 128-column block, 4 a 32-column MX block); or, when
/// the columns split into no 16-byte pieces, a thread a block.
static void quantizedActivations(Kernel &k, ActivationOp op, Value input,
                                 Value out, Value scales, Value r,
                                 int64_t outN) {
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Location loc = e.loc;
  QuantAttr quant = op.getQuantAttr();
  int64_t blockColumns = quant.getBlockSize();
  Value tid = k.threadId();
  // The activation as the bf16 result would hold it.
  auto activation = [&](Value gate, Value up) {
    return common::roundedToBF16(
        e, common::activate(e, op.getActivation(), gate, up));
  };
  auto stats = [&](Value x, Value &amax, Value &special) {
    Value s;
    amax = arith::MaxNumFOp::create(b, loc, amax, common::blockStats(e, x, s));
    special = arith::MaximumFOp::create(b, loc, special, s);
  };
  if (outN % 8 != 0) {
    int64_t blocks = llvm::divideCeil(outN, blockColumns);
    e.forEach(
        tid, e.index(blocks),
        [&](Value blk) {
          Value first = e.imul(blk, e.index(blockColumns));
          Value last =
              e.minUI(e.iadd(first, e.index(blockColumns)), e.index(outN));
          auto value = [&](Value c) {
            return activation(e.load(input, {r, c}),
                              e.load(input, {r, e.iadd(c, e.index(outN))}));
          };
          auto found =
              e.reduce(first, last, {e.f32(0.0), e.f32(0.0)},
                       [&](Value c, ValueRange acc) -> SmallVector<Value> {
                         Value amax = acc[0], special = acc[1];
                         stats(value(c), amax, special);
                         return {amax, special};
                       });
          common::BlockScale scale =
              common::blockScale(e, quant, found[0], found[1]);
          e.forEach(first, last, [&](Value c) {
            e.storeRaw(scale.encode(e, value(c)), out, {r, c});
          });
          e.storeRaw(scale.stored, scales, {r, blk});
        },
        e.index(kThreads));
    return;
  }
  constexpr int64_t width = 8;
  int64_t lanes = blockColumns / width;
  int64_t strides = llvm::divideCeil(outN, kThreads * width);
  Type i8 = b.getI8Type();
  e.forEach(e.index(0), e.index(strides), [&](Value stride) {
    Value c = e.iadd(e.imul(stride, e.index(kThreads * width)),
                     e.imul(tid, e.index(width)));
    Value inside = e.ult(c, e.index(outN));
    // Past the row: its last piece again, left out of the block's stats.
    Value at = e.minUI(c, e.index(outN - width));
    Value gates = loadF32Vector(e, input, {r, at}, width);
    Value ups = loadF32Vector(e, input, {r, e.iadd(at, e.index(outN))}, width);
    SmallVector<Value> xs;
    Value amax = e.f32(0.0), special = e.f32(0.0);
    for (int64_t j = 0; j < width; ++j) {
      xs.push_back(activation(vector::ExtractOp::create(b, loc, gates, j),
                              vector::ExtractOp::create(b, loc, ups, j)));
      stats(e.select(inside, xs.back(), e.f32(0.0)), amax, special);
    }
    for (int64_t offset = 1; offset < lanes; offset *= 2) {
      auto partner = [&](Value v) {
        return gpu::ShuffleOp::create(b, loc, v, offset, 32,
                                      gpu::ShuffleMode::XOR)
            .getShuffleResult();
      };
      amax = arith::MaxNumFOp::create(b, loc, amax, partner(amax));
      special = arith::MaximumFOp::create(b, loc, special, partner(special));
    }
    common::BlockScale scale = common::blockScale(e, quant, amax, special);
    e.ifThen(inside, [&] {
      SmallVector<Value> codes;
      for (Value x : xs)
        codes.push_back(scale.encode(e, x));
      vector::StoreOp::create(b, loc,
                              vector::FromElementsOp::create(
                                  b, loc, VectorType::get({width}, i8), codes),
                              out, ValueRange{r, c}, false,
                              vectorAlign(width, i8));
      e.ifThen(e.eq(e.remUI(tid, e.index(lanes)), e.index(0)), [&] {
        e.storeRaw(scale.stored, scales,
                   {r, e.divUI(c, e.index(blockColumns))});
      });
    });
  });
}

LogicalResult nvidia::buildActivation(LayerKernels &layer, ActivationOp op) {
  TokenLinear rows = layer.info(op.getInput()).rows;
  int64_t outN = cast<RankedTensorType>(op.getOut().getType()).getDimSize(1);
  layer.define(op.getOut(), rows);
  SmallVector<Value> buffers = {op.getInput(), op.getOut()};
  if (op.getScales()) {
    layer.define(op.getScales(), rows);
    buffers.push_back(op.getScales());
  }
  if (op.getRowWeights())
    buffers.push_back(op.getRowWeights());
  Kernel k = layer.kernel(op, "activation", buffers);
  k.launch.work = rows;
  k.launch.block = kThreads;
  Emitter &e = k.e;
  Value input = k.view(0, layer.info(op.getInput()));
  Value out = k.view(1, layer.info(op.getOut()));
  Value r = k.blockId(gpu::Dimension::x);
  k.onlyIf(e.ult(r, k.linear(rows)));
  if (op.getScales()) {
    quantizedActivations(k, op, input, out,
                         k.view(2, layer.info(op.getScales())), r, outN);
    return k.finish(op);
  }
  Value w = op.getRowWeights()
                ? e.loadColumn(k.view(2, layer.info(op.getRowWeights())), r)
                : Value();
  // 16-byte pieces of a row where its columns split into them.
  int64_t width = vectorWidth(outN);
  auto f32Vec = VectorType::get({width}, e.b.getF32Type());
  e.forEach(
      e.imul(k.threadId(), width), e.index(outN),
      [&](Value c) {
        Value gates = loadF32Vector(e, input, {r, c}, width);
        Value ups =
            loadF32Vector(e, input, {r, e.iadd(c, e.index(outN))}, width);
        SmallVector<Value> as;
        for (int64_t j = 0; j < width; ++j) {
          Value a =
              common::activate(e, op.getActivation(),
                               vector::ExtractOp::create(e.b, e.loc, gates, j),
                               vector::ExtractOp::create(e.b, e.loc, ups, j));
          // Weighted: the activation as the forward rounded it, times w.
          if (w)
            a = e.mul(w, common::roundedToBF16(e, a));
          as.push_back(a);
        }
        Value v = arith::TruncFOp::create(
            e.b, e.loc, VectorType::get({width}, e.b.getBF16Type()),
            vector::FromElementsOp::create(e.b, e.loc, f32Vec, as));
        vector::StoreOp::create(e.b, e.loc, v, out, {r, c}, false,
                                vectorAlign(width, e.b.getBF16Type()));
      },
      e.index(kThreads * width));
  return k.finish(op);
}

namespace {
/// One warp's part of moe.activation_grad: a row's dh and w a stored, and
/// the weight's gradient <g, a> summed over the warp.
struct RowGrad {
  ActivationGradOp op;
  Emitter &e;
  Value g, h, dh, aw, lane;
  int64_t outN;

  /// Row `r` of weight `w`; every lane gets the sum.
  Value row(Value r, Value w) {
    ActivationAttr activation = op.getActivation();
    Value partial = e.reduce(
        lane, e.index(outN), {e.f32(0.0)},
        [&](Value c, ValueRange acc) -> SmallVector<Value> {
          Value upCol = e.iadd(c, e.index(outN));
          Value gate = e.load(h, {r, c}), up = e.load(h, {r, upCol});
          // a as the forward rounded it for the down matmul.
          Value a = common::roundedToBF16(
              e, common::activate(e, activation, gate, up));
          auto [dGate, dUp] = common::activationGrad(e, activation, gate, up);
          Value gr = e.load(g, {r, c});
          Value wg = e.mul(w, gr);
          e.store(e.mul(wg, dGate), dh, {r, c});
          e.store(e.mul(wg, dUp), dh, {r, upCol});
          e.store(e.mul(w, a), aw, {r, c});
          return {e.add(acc[0], e.mul(gr, a))};
        },
        e.index(32))[0];
    return warpButterfly(e, partial,
                         [&](Value x, Value y) { return e.add(x, y); });
  }
};
} // namespace

LogicalResult nvidia::buildActivationGrad(LayerKernels &layer,
                                          ActivationGradOp op) {
  TokenLinear rowCount = layer.info(op.getInput()).rows;
  // A warp per token (routed experts) or per row.
  TokenLinear units = op.getRows() ? layer.info(op.getRows()).rows : rowCount;
  layer.define(op.getInputGrad(), rowCount);
  layer.define(op.getWeighted(), rowCount);
  if (op.getWeightGrad())
    layer.define(op.getWeightGrad(), units);
  SmallVector<Value> buffers = {op.getOutGrad(), op.getInput(),
                                op.getInputGrad(), op.getWeighted()};
  for (Value v : {op.getWeightGrad(), op.getRows(), op.getWeights(),
                  op.getGate(), op.getBiasTerm()})
    if (v)
      buffers.push_back(v);
  Kernel k = layer.kernel(op, "activation_grad", buffers);
  k.launch.work = units;
  k.launch.perBlock = kWarps;
  k.launch.block = kThreads;
  Emitter &e = k.e;
  auto view = [&](Value v) {
    if (!v)
      return Value();
    return k.view(llvm::find(buffers, v) - buffers.begin(), layer.info(v));
  };
  Value tid = k.threadId();
  Value unit =
      e.iadd(e.imul(k.blockId(gpu::Dimension::x), kWarps), e.divUI(tid, 32));
  Value lane = e.remUI(tid, 32);
  RowGrad grad{op,
               e,
               view(op.getOutGrad()),
               view(op.getInput()),
               view(op.getInputGrad()),
               view(op.getWeighted()),
               lane,
               cast<RankedTensorType>(op.getOutGrad().getType()).getDimSize(1)};
  Value dw = view(op.getWeightGrad()), biasTerm = view(op.getBiasTerm());
  auto withBias = [&](Value dot, Value r) {
    return biasTerm ? e.add(dot, e.loadRaw(biasTerm, {r, e.index(0)})) : dot;
  };
  Value first = e.eq(lane, e.index(0));
  // Warps past the units have nothing to do; no barrier follows.
  e.ifThen(e.ult(unit, k.linear(units)), [&] {
    if (!op.getRows()) {
      Value gate = view(op.getGate());
      bool linear = op.getLinearGate();
      Value s = e.f32(1.0);
      if (gate) {
        s = e.load(gate, {unit, e.index(0)});
        if (!linear)
          s = e.sigmoid(s);
      }
      Value dot = withBias(grad.row(unit, s), unit);
      // d sigmoid(x) / dx = s (1 - s).
      if (gate && !linear)
        dot = e.mul(dot, e.mul(s, e.sub(e.f32(1.0), s)));
      if (gate)
        e.ifThen(first, [&] { e.storeRaw(dot, dw, {unit, e.index(0)}); });
      return;
    }
    Value rows = view(op.getRows()), weights = view(op.getWeights());
    int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value r = e.loadRaw(rows, {unit, j});
      auto valid = scf::IfOp::create(
          e.b, e.loc, TypeRange{e.b.getF32Type()},
          e.icmp(arith::CmpIPredicate::sge, r, e.i32(0)), /*withElse=*/true);
      {
        OpBuilder::InsertionGuard guard(e.b);
        e.b.setInsertionPointToStart(&valid.getThenRegion().front());
        Value ri = e.toIndex(r);
        scf::YieldOp::create(
            e.b, e.loc,
            withBias(grad.row(ri, e.loadRaw(weights, {unit, j})), ri));
        e.b.setInsertionPointToStart(&valid.getElseRegion().front());
        scf::YieldOp::create(e.b, e.loc, e.f32(0.0));
      }
      if (dw)
        e.ifThen(first, [&] { e.storeRaw(valid.getResult(0), dw, {unit, j}); });
    });
  });
  return k.finish(op);
}
