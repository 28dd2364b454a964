//===- SimtMatmul.cpp - matmuls the tensor cores do not take --------------===//
//
// The router's backward multiplies its f32 logit gradient [T, E] by bf16
// operands: the hidden states (its weight's gradient, a contraction over
// tokens) and the router weights (the hidden states' gradient, over
// experts). wgmma takes no f32 operand, and rounding the gradient to bf16
// would leave the router, which DeepSeek-V3's recipe keeps in high
// precision, less exact than the CPU backend. These products are small
// (2 T E H flops, E <= 256), so they run on CUDA cores in f32: a block
// per 64 x 64 tile of the result, 16 of the contraction at a time staged
// through shared memory, each thread 4 x 4 adjacent results.
//
// Two reductions of the same backward share the file: the sums of an
// expert's rows (a bias's gradient, a weight gradient without a matrix
// lhs: lanes on columns, warps on rows, summed across warps in shared
// memory in a fixed order) and the dot of each row with its expert's bias
// (a dgrad's bias_dot: a warp per row).
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
constexpr int64_t kTile = 64, kStep = 16, kThreads = 256, kPer = 4,
                  kSide = kTile / kPer, kMaxSplits = 32;

/// C[m, n] (+ acc[m, n]) = sum over k in [kBegin, kEnd) of A(m, k) B(k, n),
/// where A(m, k) is a[m, k], or a[k, m] where `aTransposed`, and B(k, n)
/// is b[k, n]; C[m, n] goes to c[cRow + m, n].
struct SimtProduct {
  Value a, b, acc, c;
  bool aTransposed;
  Value m, n, k; // The extents, as indices.
  Value kBegin, kEnd, cRow;
};

/// Block (x, y) takes the tile of rows x % mTiles and columns y.
void emitProduct(Kernel &kernel, const SimtProduct &p, int64_t mTiles) {
  Emitter &e = kernel.e;
  Type f32 = e.b.getF32Type();
  Value as = kernel.workgroupBuffer({kStep, kTile}, f32);
  Value bs = kernel.workgroupBuffer({kStep, kTile}, f32);
  Value tid = kernel.threadId();
  Value tx = e.remUI(tid, e.index(kSide)), ty = e.divUI(tid, e.index(kSide));
  Value m0 = e.imul(e.remUI(kernel.blockId(gpu::Dimension::x), e.index(mTiles)),
                    kTile);
  Value n0 = e.imul(kernel.blockId(gpu::Dimension::y), kTile);
  // An element of a tile, zero outside the operand (its index clamped in).
  auto element = [&](Value buffer, Value row, Value col, Value rows,
                     Value cols) {
    Value inside = e.andi(e.ult(row, rows), e.ult(col, cols));
    Value r = e.minUI(row, e.isub(rows, e.index(1)));
    Value c = e.minUI(col, e.isub(cols, e.index(1)));
    return e.select(inside, e.load(buffer, {r, c}), e.f32(0.0));
  };
  SmallVector<Value> init(kPer * kPer, e.f32(0.0));
  SmallVector<Value> sums = e.reduce(
      p.kBegin, p.kEnd, init,
      [&](Value k0, ValueRange acc) -> SmallVector<Value> {
        for (int64_t i = 0; i < kTile * kStep / kThreads; ++i) {
          Value l = e.iadd(tid, e.index(i * kThreads));
          // Consecutive threads read consecutive addresses of each operand.
          Value am, ak;
          if (p.aTransposed) {
            am = e.remUI(l, e.index(kTile)), ak = e.divUI(l, e.index(kTile));
            e.storeRaw(element(p.a, e.iadd(k0, ak), e.iadd(m0, am), p.k, p.m),
                       as, {ak, am});
          } else {
            ak = e.remUI(l, e.index(kStep)), am = e.divUI(l, e.index(kStep));
            e.storeRaw(element(p.a, e.iadd(m0, am), e.iadd(k0, ak), p.m, p.k),
                       as, {ak, am});
          }
          Value bn = e.remUI(l, e.index(kTile)),
                bk = e.divUI(l, e.index(kTile));
          e.storeRaw(element(p.b, e.iadd(k0, bk), e.iadd(n0, bn), p.k, p.n), bs,
                     {bk, bn});
        }
        gpu::BarrierOp::create(e.b, e.loc);
        SmallVector<Value> next(acc.begin(), acc.end());
        // A thread's 4 rows and 4 columns are adjacent: one 16-byte shared
        // load each a step (ncu: scalar loads bound the kernel on the
        // shared-memory pipe, L1 at 78-95%).
        auto quad = [&](Value buffer, Value kk, Value first) {
          Value v =
              vector::LoadOp::create(e.b, e.loc, VectorType::get({kPer}, f32),
                                     buffer, ValueRange{kk, first});
          SmallVector<Value> parts;
          for (int64_t i = 0; i < kPer; ++i)
            parts.push_back(vector::ExtractOp::create(e.b, e.loc, v, i));
          return parts;
        };
        for (int64_t kk = 0; kk < kStep; ++kk) {
          SmallVector<Value> av = quad(as, e.index(kk), e.imul(ty, kPer));
          SmallVector<Value> bv = quad(bs, e.index(kk), e.imul(tx, kPer));
          for (int64_t i = 0; i < kPer; ++i)
            for (int64_t j = 0; j < kPer; ++j)
              next[i * kPer + j] = math::FmaOp::create(e.b, e.loc, av[i], bv[j],
                                                       next[i * kPer + j]);
        }
        gpu::BarrierOp::create(e.b, e.loc);
        return next;
      },
      e.index(kStep));
  for (int64_t i = 0; i < kPer; ++i)
    for (int64_t j = 0; j < kPer; ++j) {
      Value m = e.iadd(m0, e.iadd(e.imul(ty, kPer), e.index(i)));
      Value n = e.iadd(n0, e.iadd(e.imul(tx, kPer), e.index(j)));
      e.ifThen(e.andi(e.ult(m, p.m), e.ult(n, p.n)), [&] {
        Value v = sums[i * kPer + j];
        if (p.acc)
          v = e.add(v, e.load(p.acc, {m, n}));
        e.store(v, p.c, {e.iadd(p.cRow, m), n});
      });
    }
}

int64_t dimOf(Value v, unsigned d) {
  return cast<RankedTensorType>(v.getType()).getDimSize(d);
}

} // namespace

bool nvidia::takesSimtMatmul(Operation *op) {
  auto f32Grad = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getElementType().isF32();
  };
  if (auto wgrad = dyn_cast<GroupedMatmulWgradOp>(op))
    return !wgrad.getQuant() &&
           (f32Grad(wgrad.getOutGrad()) || !wgrad.getLhs() ||
            cast<RankedTensorType>(wgrad.getLhs().getType()).getRank() == 1);
  return isa<GroupedMatmulDgradOp>(op);
}

namespace {
constexpr int64_t kSumWarps = 32;

/// The expert (group) of row `r`: the last x in [0, E] with offsets[x] <=
/// r, E where r is past every expert (empty experts are skipped, as the
/// next offset is no greater). A bisection of fixed steps: the answer
/// stays in [lo, lo + len).
Value expertOfRow(Emitter &e, Value offsets, int64_t experts, Value r) {
  Value lo = e.index(0);
  for (int64_t len = experts + 1; len > 1;) {
    int64_t half = len / 2;
    Value mid = e.iadd(lo, e.index(half));
    Value at = e.toIndex(e.loadRaw(offsets, {mid}));
    lo = e.select(e.icmp(arith::CmpIPredicate::ule, at, r), mid, lo);
    len -= half;
  }
  return lo;
}
} // namespace

/// out[x, i] = the sum over group x's rows r of dy[r, i] (times lhs[r]
/// where lhs is rank 1): a block per group and 32 columns, a lane a
/// column, its 32 warps on every 32nd row, their sums added in warp order.
static LogicalResult buildRowSums(LayerKernels &layer,
                                  GroupedMatmulWgradOp op) {
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts = grouped ? dimOf(op.getTokensPerExpert(), 0) : int64_t(1);
  int64_t n = dimOf(op.getOutGrad(), 1);
  TensorInfo grad = layer.info(op.getOutGrad());
  TensorInfo out = layer.define(op.getOut(), {});
  SmallVector<Value> buffers = {op.getOutGrad(), op.getOut()};
  if (op.getLhs())
    buffers.push_back(op.getLhs());
  if (grouped)
    buffers.append({op.getTokensPerExpert(), op.getExpertOffsets()});
  Kernel k = layer.kernel(op, "simt_row_sums", buffers);
  int64_t chunks = llvm::divideCeil(n, 32);
  k.launch.work = {experts * chunks, 0};
  k.launch.block = kSumWarps * 32;
  Emitter &e = k.e;
  auto view = [&](Value v) {
    return k.view(llvm::find(buffers, v) - buffers.begin(), layer.info(v));
  };
  Value dy = k.view(0, grad), result = k.view(1, out);
  Value scale = op.getLhs() ? view(op.getLhs()) : Value();
  Value id = k.blockId(gpu::Dimension::x);
  Value x = e.divUI(id, e.index(chunks));
  Value tid = k.threadId();
  Value warp = e.divUI(tid, e.index(32)), lane = e.remUI(tid, e.index(32));
  Value col = e.iadd(e.imul(e.remUI(id, e.index(chunks)), 32), lane);
  Value first = e.index(0), count = k.linear(grad.rowCount());
  if (grouped) {
    first = e.toIndex(e.loadRaw(view(op.getExpertOffsets()), {x}));
    count = e.toIndex(e.loadRaw(view(op.getTokensPerExpert()), {x}));
  }
  Value inside = e.ult(col, e.index(n));
  Value c = e.minUI(col, e.index(n - 1));
  Value sum = e.reduce(
      e.iadd(first, warp), e.iadd(first, count), {e.f32(0.0)},
      [&](Value r, ValueRange acc) -> SmallVector<Value> {
        Value term = e.load(dy, {r, c});
        if (scale)
          term = e.mul(term, e.load(scale, {r}));
        return {e.add(acc[0], term)};
      },
      e.index(kSumWarps))[0];
  Value partials = k.workgroupBuffer({kSumWarps, 32}, e.b.getF32Type());
  e.storeRaw(sum, partials, {warp, lane});
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.andi(e.eq(warp, e.index(0)), inside), [&] {
    Value total =
        e.reduce(e.index(0), e.index(kSumWarps), {e.f32(0.0)},
                 [&](Value w, ValueRange acc) -> SmallVector<Value> {
                   return {e.add(acc[0], e.loadRaw(partials, {w, lane}))};
                 })[0];
    SmallVector<Value> index;
    if (grouped)
      index.push_back(x);
    index.push_back(c);
    e.store(total, result, index);
  });
  return k.finish(op);
}

/// A dgrad moe-legalize kept only for its bias_dot ([R, 1] f32): row r of
/// the output's gradient dotted with its expert's bias, 0 past every
/// expert; a warp a row.
static LogicalResult buildBiasDot(LayerKernels &layer,
                                  GroupedMatmulDgradOp op) {
  int64_t n = dimOf(op.getOutGrad(), 1);
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts = grouped ? dimOf(op.getTokensPerExpert(), 0) : 1;
  TensorInfo grad = layer.info(op.getOutGrad());
  TokenLinear rowCount = grad.rowCount();
  layer.define(op.getBiasDot(), grad.rows);
  SmallVector<Value> buffers = {op.getOutGrad(), op.getBias(), op.getBiasDot()};
  if (grouped)
    buffers.push_back(op.getExpertOffsets());
  Kernel k = layer.kernel(op, "bias_dot", buffers);
  constexpr int64_t warps = 8;
  k.launch.work = rowCount;
  k.launch.perBlock = warps;
  k.launch.block = warps * 32;
  Emitter &e = k.e;
  auto view = [&](unsigned i) { return k.view(i, layer.info(buffers[i])); };
  Value dy = view(0), bias = view(1), out = view(2);
  Value tid = k.threadId();
  Value lane = e.remUI(tid, e.index(32));
  Value r = e.iadd(e.imul(k.blockId(gpu::Dimension::x), warps),
                   e.divUI(tid, e.index(32)));
  // Warp-uniform: a whole warp has a row or none.
  e.ifThen(e.ult(r, k.linear(rowCount)), [&] {
    Value x = grouped ? expertOfRow(e, view(3), experts, r) : Value();
    Value inside = grouped ? e.ult(x, e.index(experts)) : Value();
    Value xc = grouped ? e.minUI(x, e.index(experts - 1)) : Value();
    Value partial = e.reduce(
        lane, e.index(n), {e.f32(0.0)},
        [&](Value c, ValueRange acc) -> SmallVector<Value> {
          SmallVector<Value> index;
          if (grouped)
            index.push_back(xc);
          index.push_back(c);
          return {
              e.add(acc[0], e.mul(e.load(dy, {r, c}), e.load(bias, index)))};
        },
        e.index(32))[0];
    partial = warpButterfly(e, partial,
                            [&](Value x, Value y) { return e.add(x, y); });
    if (inside)
      partial = e.select(inside, partial, e.f32(0.0));
    e.ifThen(e.eq(lane, e.index(0)), [&] {
      e.storeRaw(partial, out, {r, e.index(0)});
    });
  });
  return k.finish(op);
}

/// out[m, n] = the sum of partial[s * M + m, n] over the splits s, in
/// order: a thread an element.
static LogicalResult sumSplits(LayerKernels &layer, GroupedMatmulWgradOp op,
                               const TensorInfo &partial, const TensorInfo &out,
                               int64_t splits) {
  int64_t m = out.type.getDimSize(0), n = out.type.getDimSize(1);
  Kernel k = layer.kernelOn(op, "simt_wgrad_sum", {partial.buffer, out.buffer});
  k.launch.work = {m * n, 0};
  k.launch.perBlock = kThreads;
  k.launch.block = kThreads;
  Emitter &e = k.e;
  Value parts = k.view(0, partial), result = k.view(1, out);
  Value i =
      e.iadd(e.imul(k.blockId(gpu::Dimension::x), kThreads), k.threadId());
  e.ifThen(e.ult(i, e.index(m * n)), [&] {
    Value row = e.divUI(i, e.index(n)), col = e.remUI(i, e.index(n));
    Value sum = e.reduce(e.index(0), e.index(splits), {e.f32(0.0)},
                         [&](Value s, ValueRange acc) -> SmallVector<Value> {
                           Value r = e.iadd(e.imul(s, m), row);
                           return {e.add(acc[0], e.loadRaw(parts, {r, col}))};
                         })[0];
    e.store(sum, result, {row, col});
  });
  return k.finish(op);
}

LogicalResult nvidia::buildSimtWgrad(LayerKernels &layer,
                                     GroupedMatmulWgradOp op) {
  Value lhs = op.getLhs();
  if (!lhs || cast<RankedTensorType>(lhs.getType()).getRank() == 1)
    return buildRowSums(layer, op);
  if (op.getTokensPerExpert())
    return op.emitOpError()
           << "has an f32 output gradient and groups: sm_90a takes an f32 "
              "one only in a dense product (the router's weight gradient)";
  TensorInfo grad = layer.info(op.getOutGrad()), rows = layer.info(lhs);
  TensorInfo out = layer.define(op.getOut(), {});
  int64_t m = dimOf(op.getOutGrad(), 1), n = dimOf(lhs, 1);
  int64_t mTiles = llvm::divideCeil(m, kTile),
          nTiles = llvm::divideCeil(n, kTile);
  // The contraction runs over the tokens, thousands of them, and the
  // result has few tiles (2 x 32 for Qwen3's router): the tokens are split
  // so that two blocks an SM run, each split's sums go to the workspace,
  // and a second kernel adds them in split order.
  int64_t splits = std::clamp<int64_t>(
      llvm::divideCeil(2 * sm90a::kMultiprocessors, mTiles * nTiles), 1,
      kMaxSplits);
  auto f32 = Float32Type::get(op.getContext());
  TensorInfo partial = out;
  if (splits > 1)
    partial = TensorInfo{layer.plan.addWorkspace({splits * m * n * 4, 0}),
                         MemRefType::get({splits * m, n}, f32),
                         TokenLinear{splits * m, 0}};
  Kernel k = layer.kernelOn(op, "simt_wgrad",
                            {grad.buffer, rows.buffer, partial.buffer});
  k.launch.work = {mTiles * splits * kTile, 0};
  k.launch.perBlock = kTile;
  k.launch.gridY = nTiles;
  k.launch.block = kThreads;
  Emitter &e = k.e;
  // Block x: row tile x % mTiles of split x / mTiles, whose tokens are a
  // whole number of kStep each, the last split's to the end.
  Value count = k.linear(grad.rowCount());
  Value split = e.divUI(k.blockId(gpu::Dimension::x), e.index(mTiles));
  Value per = e.imul(e.divUI(e.iadd(count, e.index(splits * kStep - 1)),
                             e.index(splits * kStep)),
                     kStep);
  Value begin = e.minUI(e.imul(split, per), count);
  Value end = e.minUI(e.iadd(begin, per), count);
  Value cRow = e.imul(split, m);
  // out[m, n] = sum over rows r of grad[r, m] lhs[r, n].
  emitProduct(k,
              {k.view(0, grad), k.view(1, rows), Value(), k.view(2, partial),
               /*aTransposed=*/true, e.index(m), e.index(n), count, begin, end,
               cRow},
              mTiles);
  if (failed(k.finish(op)))
    return failure();
  if (splits == 1)
    return success();
  return sumSplits(layer, op, partial, out, splits);
}

LogicalResult nvidia::buildSimtDgrad(LayerKernels &layer,
                                     GroupedMatmulDgradOp op) {
  if (op.getBias() && op.getOut().use_empty())
    return buildBiasDot(layer, op);
  if (op.getTokensPerExpert() || op.getBias())
    return op.emitOpError()
           << "has groups or a bias, or operands other than bf16: sm_90a "
              "takes such an input gradient only without groups or bias "
              "(the router's), and as a matmul on transposed weights "
              "otherwise (moe-legalize)";
  TensorInfo grad = layer.info(op.getOutGrad());
  TensorInfo weights = layer.info(op.getRhs());
  TokenLinear rowCount = grad.rowCount();
  TensorInfo out = layer.define(op.getOut(), grad.rows);
  SmallVector<Value> buffers = {op.getOutGrad(), op.getRhs(), op.getOut()};
  if (op.getAcc())
    buffers.push_back(op.getAcc());
  Kernel k = layer.kernel(op, "simt_dgrad", buffers);
  int64_t n = dimOf(op.getRhs(), 1), kDim = dimOf(op.getRhs(), 0);
  k.launch.work = rowCount;
  k.launch.perBlock = kTile;
  k.launch.gridY = llvm::divideCeil(n, kTile);
  k.launch.block = kThreads;
  Emitter &e = k.e;
  Value acc = op.getAcc() ? k.view(3, layer.info(op.getAcc())) : Value();
  // out[r, n] = sum over j of grad[r, j] rhs[j, n] (+ acc[r, n]).
  emitProduct(k,
              {k.view(0, grad), k.view(1, weights), acc, k.view(2, out),
               /*aTransposed=*/false, k.linear(rowCount), e.index(n),
               e.index(kDim), e.index(0), e.index(kDim), e.index(0)},
              std::numeric_limits<int32_t>::max());
  return k.finish(op);
}
