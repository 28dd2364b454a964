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
// through shared memory, each thread 4 x 4 results.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
constexpr int64_t kTile = 64, kStep = 16, kThreads = 256, kPer = 4,
                  kSide = kTile / kPer;

/// C[m, n] (+ acc[m, n]) = sum over k of A(m, k) B(k, n), where A(m, k) is
/// a[m, k], or a[k, m] where `aTransposed`, and B(k, n) is b[k, n].
struct SimtProduct {
  Value a, b, acc, c;
  bool aTransposed;
  Value m, n, k; // The extents, as indices.
};

void emitProduct(Kernel &kernel, const SimtProduct &p) {
  Emitter &e = kernel.e;
  Type f32 = e.b.getF32Type();
  Value as = kernel.workgroupBuffer({kStep, kTile}, f32);
  Value bs = kernel.workgroupBuffer({kStep, kTile}, f32);
  Value tid = kernel.threadId();
  Value tx = e.remUI(tid, e.index(kSide)), ty = e.divUI(tid, e.index(kSide));
  Value m0 = e.imul(kernel.blockId(gpu::Dimension::x), kTile);
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
      e.index(0), p.k, init,
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
        for (int64_t kk = 0; kk < kStep; ++kk) {
          SmallVector<Value> av, bv;
          for (int64_t i = 0; i < kPer; ++i) {
            av.push_back(
                e.loadRaw(as, {e.index(kk), e.iadd(ty, e.index(i * kSide))}));
            bv.push_back(
                e.loadRaw(bs, {e.index(kk), e.iadd(tx, e.index(i * kSide))}));
          }
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
      Value m = e.iadd(m0, e.iadd(ty, e.index(i * kSide)));
      Value n = e.iadd(n0, e.iadd(tx, e.index(j * kSide)));
      e.ifThen(e.andi(e.ult(m, p.m), e.ult(n, p.n)), [&] {
        Value v = sums[i * kPer + j];
        if (p.acc)
          v = e.add(v, e.load(p.acc, {m, n}));
        e.store(v, p.c, {m, n});
      });
    }
}

int64_t dimOf(Value v, unsigned d) {
  return cast<RankedTensorType>(v.getType()).getDimSize(d);
}

/// The rows of `info` for a call: its dynamic count, or its static size.
TokenLinear rowsOf(const TensorInfo &info) {
  if (info.type.isDynamicDim(0))
    return info.rows;
  return {info.type.getDimSize(0), 0};
}
} // namespace

bool nvidia::takesSimtMatmul(Operation *op) {
  auto f32Grad = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getElementType().isF32();
  };
  if (auto wgrad = dyn_cast<GroupedMatmulWgradOp>(op))
    return f32Grad(wgrad.getOutGrad());
  return isa<GroupedMatmulDgradOp>(op);
}

LogicalResult nvidia::buildSimtWgrad(LayerKernels &layer,
                                     GroupedMatmulWgradOp op) {
  Value lhs = op.getLhs();
  if (op.getTokensPerExpert() || !lhs ||
      cast<RankedTensorType>(lhs.getType()).getRank() != 2)
    return op.emitOpError()
           << "has an f32 output gradient and groups or no matrix lhs: "
              "sm_90a takes an f32 one only in a dense product with a "
              "matrix (the router's weight gradient)";
  TensorInfo grad = layer.info(op.getOutGrad()), rows = layer.info(lhs);
  TensorInfo out = layer.define(op.getOut(), {});
  Kernel k =
      layer.kernel(op, "simt_wgrad", {op.getOutGrad(), lhs, op.getOut()});
  int64_t m = dimOf(op.getOutGrad(), 1), n = dimOf(lhs, 1);
  k.launch.work = {m, 0};
  k.launch.perBlock = kTile;
  k.launch.gridY = llvm::divideCeil(n, kTile);
  k.launch.block = kThreads;
  Emitter &e = k.e;
  // out[m, n] = sum over rows r of grad[r, m] lhs[r, n].
  emitProduct(k, {k.view(0, grad), k.view(1, rows), Value(), k.view(2, out),
                  /*aTransposed=*/true, e.index(m), e.index(n),
                  k.linear(rowsOf(grad))});
  return k.finish(op);
}

LogicalResult nvidia::buildSimtDgrad(LayerKernels &layer,
                                     GroupedMatmulDgradOp op) {
  if (op.getTokensPerExpert() || op.getBias())
    return op.emitOpError()
           << "has groups or a bias, or operands other than bf16: sm_90a "
              "takes such an input gradient only without groups or bias "
              "(the router's), and as a matmul on transposed weights "
              "otherwise (moe-legalize)";
  TensorInfo grad = layer.info(op.getOutGrad());
  TensorInfo weights = layer.info(op.getRhs());
  TokenLinear rowCount = rowsOf(grad);
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
  emitProduct(k, {k.view(0, grad), k.view(1, weights), acc, k.view(2, out),
                  /*aTransposed=*/false, k.linear(rowCount), e.index(n),
                  e.index(kDim)});
  return k.finish(op);
}
