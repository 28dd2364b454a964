//===- Legalize.cpp - shapes sm_90a's kernels do not take, made to fit ----===//
//
// The matmul kernel loads its operands with TMA, which reads rows in whole
// 16-byte units. Rather than refuse a layer whose K is not a multiple of
// that (H 100 in bf16, I 40 in FP8), both operands get zero columns up to
// the next multiple; a remark says what that copies per call.
//
// A backward's dgrad (bf16 rows times bf16 weights read along N) becomes
// the grouped matmul reading the weights as they lie (transpose_rhs), or,
// where their rows are not whole 16-byte units for TMA, the matmul on a
// transposed copy (moe.transpose, then padded as above); one with a bias
// keeps only its bias_dot.
//
// A dgrad whose one reader is the backward of a gated activation (the
// down matmul's, without a shared experts' gate) takes that backward as
// its epilogue: the rows' gradient g never reaches memory. Its parts
// become: the scatter of the output's gradient also lays each row's
// routing weight out by row; the weighted activation w a (what the down
// matmul's weight gradient reads) is a step of its own, before the
// matmul, and so is that weight gradient; the matmul writes the gate/up
// gradient over the gate/up output (in_place), each row's <g, a> in
// partial sums that a gather_dot adds up by choice. A quantized dgrad
// (moe-differentiate's quantized rows times transposed quantized weights)
// takes the activation's backward into its epilogue the same way, and the
// transpose and quantize of its weights become one pass (moe.quantize's
// `transpose`).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "llvm/Support/FormatVariadic.h"

namespace mlir::moe {
#define GEN_PASS_DEF_LEGALIZE
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

/// `value` with its last dimension padded with zeros to `k`.
static Value padded(OpBuilder &b, Location loc, Value value, int64_t k) {
  auto type = cast<RankedTensorType>(value.getType());
  SmallVector<int64_t> shape(type.getShape());
  shape.back() = k;
  return PadOp::create(b, loc, type.clone(shape), value);
}

static int64_t bytesOf(RankedTensorType type) {
  int64_t n = type.getElementTypeBitWidth() / 8;
  for (int64_t d : type.getShape())
    n *= ShapedType::isDynamic(d) ? 1 : d;
  return n;
}

/// Whether `value` is available before `op` in its block.
static bool definedBefore(Value value, Operation *op) {
  Operation *def = value.getDefiningOp();
  return !def ||
         (def->getBlock() == op->getBlock() && def->isBeforeInBlock(op));
}

/// A dgrad's product g = dy W (W read along N), as the activation backward
/// that reads it may take it into its epilogue: bf16 weights read as they
/// lie (transpose_rhs), or quantized rows times quantized weights already
/// transposed. `rows` is the bf16 dy (quantized into `lhs` in the latter).
struct DgradProduct {
  Operation *op;
  Value out, rows, lhs, rhs, lhsScale, rhsScale, counts, offsets;
  bool transposed;
};

/// The dgrad `product` with the activation backward `grads`, its one reader,
/// as its epilogue; false where they do not fit that form.
static bool fuseActivationGrad(const DgradProduct &product,
                               ActivationGradOp grads) {
  // A gate fits only as an expert-parallel backward's: each row's routing
  // weight, linear ([R, 1]), which the epilogue takes as the row's weight.
  bool rowGate = grads.getGate() && grads.getLinearGate() && !grads.getRows() &&
                 cast<RankedTensorType>(grads.getGate().getType())
                     .getElementType()
                     .isF32();
  if ((grads.getGate() && !rowGate) || grads.getOutGrad() != product.out)
    return false;
  ScatterOp scatter;
  if (grads.getRows()) {
    scatter = product.rows.getDefiningOp<ScatterOp>();
    if (!scatter || scatter.getScale() || scatter.getWeights() ||
        scatter.getRows() != grads.getRows() ||
        !definedBefore(grads.getWeights(), scatter))
      return false;
  }
  Location loc = product.op->getLoc();
  Value lhs = product.lhs, rowWeights = rowGate ? grads.getGate() : Value();
  Value h = grads.getInput();
  int64_t rows = cast<RankedTensorType>(h.getType()).getDimSize(0);
  Type f32 = Float32Type::get(product.op->getContext());
  if (scatter) {
    // The scatter also lays each row's routing weight out by row.
    OpBuilder at(scatter);
    auto laid = ScatterOp::create(
        at, scatter.getLoc(), scatter.getOut().getType(),
        RankedTensorType::get({rows}, f32), scatter.getSource(),
        scatter.getRows(), scatter.getExpertOffsets(), Value(),
        grads.getWeights(), scatter.getAlign());
    scatter.getOut().replaceAllUsesWith(laid.getOut());
    scatter.erase();
    if (lhs == product.rows)
      lhs = laid.getOut();
    rowWeights = laid.getRowWeights();
  }
  OpBuilder b(grads);
  ActivationAttr activation = grads.getActivationAttr();
  Value weighted =
      ActivationOp::create(b, loc, grads.getWeighted().getType(), Type(), h,
                           rowWeights, activation, QuantAttr())
          .getOut();
  int64_t n = cast<RankedTensorType>(product.out.getType()).getDimSize(1);
  SmallVector<Type> rowDots;
  if (rowWeights)
    rowDots.push_back(RankedTensorType::get(
        {rows, int64_t(llvm::divideCeil(n, GroupedMatmulOp::kRowDotColumns))},
        f32));
  auto fused = GroupedMatmulOp::create(
      b, loc, grads.getInputGrad().getType(), rowDots, lhs, product.rhs,
      product.counts, product.offsets, product.lhsScale, product.rhsScale,
      Value(), activation, QuantAttr(), ArrayAttr(), product.transposed, h,
      rowWeights, grads.getBiasTerm());
  grads.getInputGrad().replaceAllUsesWith(fused.getOut());
  grads.getWeighted().replaceAllUsesWith(weighted);
  // Each choice's (or, gated, each row's) sum of its row's partials.
  if (Value weightGrad = grads.getWeightGrad())
    weightGrad.replaceAllUsesWith(
        GatherDotOp::create(b, loc, weightGrad.getType(), fused.getRowDots(),
                            Value(), grads.getRows()));
  grads.erase();
  // The weight gradient that reads w a runs before the matmul, so w a and
  // the gate/up gradient never live at once.
  for (Operation *user : llvm::to_vector(weighted.getUsers()))
    if (user->getBlock() == fused->getBlock() && fused->isBeforeInBlock(user) &&
        llvm::all_of(user->getOperands(),
                     [&](Value v) { return definedBefore(v, fused); }))
      user->moveBefore(fused);
  // The gate/up gradient over the gate/up output, which nothing reads
  // after it.
  fused.setInPlace(llvm::all_of(h.getUsers(), [&](Operation *user) {
    return user == fused || (user->getBlock() == fused->getBlock() &&
                             user->isBeforeInBlock(fused));
  }));
  return true;
}

/// A quantized dgrad product (moe-differentiate's: quantized rows times
/// the weights transposed and quantized) with its one reader, the
/// activation backward, as its epilogue where that fits.
static void fuseQuantizedDgrad(GroupedMatmulOp op) {
  if (!op.getLhsScale() || op.getTransposeRhs() || op.getActivationAttr() ||
      op.getBias() || !op.getOut().hasOneUse())
    return;
  auto grads = dyn_cast<ActivationGradOp>(*op.getOut().user_begin());
  auto quantize = op.getLhs().getDefiningOp<QuantizeOp>();
  if (!grads || !quantize)
    return;
  DgradProduct product{op,
                       op.getOut(),
                       quantize.getInput(),
                       op.getLhs(),
                       op.getRhs(),
                       op.getLhsScale(),
                       op.getRhsScale(),
                       op.getTokensPerExpert(),
                       op.getExpertOffsets(),
                       /*transposed=*/false};
  if (fuseActivationGrad(product, grads))
    op.erase();
}

/// `op` as a grouped matmul, where it is one: bf16 operands, a bf16 or f32
/// result, no `acc`. With a `bias`, the op stays for its bias_dot alone
/// (its `out` unused), which sm_90a computes on CUDA cores.
static void dgradAsMatmul(GroupedMatmulDgradOp op) {
  auto type = [](Value v) { return cast<RankedTensorType>(v.getType()); };
  if (op.getAcc() || op.getOut().use_empty() ||
      !type(op.getOutGrad()).getElementType().isBF16() ||
      !type(op.getRhs()).getElementType().isBF16())
    return;
  OpBuilder b(op);
  RankedTensorType rhs = type(op.getRhs());
  ArrayRef<int64_t> dims = rhs.getShape();
  // TMA rows of both weight dimensions (K and N of the matmul) in whole
  // 16-byte units: read the weights as they lie.
  bool direct =
      dims[dims.size() - 1] % 8 == 0 && dims[dims.size() - 2] % 8 == 0;
  if (direct && op.getOut().hasOneUse())
    if (auto grads = dyn_cast<ActivationGradOp>(*op.getOut().user_begin());
        grads && fuseActivationGrad({op, op.getOut(), op.getOutGrad(),
                                     op.getOutGrad(), op.getRhs(), Value(),
                                     Value(), op.getTokensPerExpert(),
                                     op.getExpertOffsets(), true},
                                    grads)) {
      if (!op.getBias())
        op.erase();
      return;
    }
  Value weights = op.getRhs();
  if (!direct) {
    SmallVector<int64_t> shape(dims);
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    weights = TransposeOp::create(b, op.getLoc(), rhs.clone(shape), weights);
  }
  auto matmul = GroupedMatmulOp::create(
      b, op.getLoc(), op.getOut().getType(), TypeRange(), op.getOutGrad(),
      weights, op.getTokensPerExpert(), op.getExpertOffsets(), Value(), Value(),
      Value(), ActivationAttr(), QuantAttr(), ArrayAttr(), direct, Value(),
      Value(), Value());
  op.getOut().replaceAllUsesWith(matmul.getOut());
  if (!op.getBias())
    op.erase();
}

/// A quantize of a transpose as one pass over the input, where sm_90a's
/// square-block kernel takes it: bf16 weights in 128 x 128 blocks whose
/// last two dimensions are static multiples of 8 (a dgrad's weights).
static void quantizeTransposed(QuantizeOp op) {
  auto transpose = op.getInput().getDefiningOp<TransposeOp>();
  if (!transpose || !transpose.getResult().hasOneUse() || op.getTranspose())
    return;
  auto input = cast<RankedTensorType>(transpose.getInput().getType());
  ArrayRef<int64_t> shape = input.getShape();
  auto scales = cast<RankedTensorType>(op.getScales().getType());
  int64_t rank = input.getRank();
  bool square = op.getScheme().getKind() == QuantKind::FP8Block128 &&
                scales.getRank() == rank &&
                scales.getDimSize(rank - 2) ==
                    int64_t(llvm::divideCeil(shape[rank - 1], 128));
  if (!input.getElementType().isBF16() || !square || (rank != 2 && rank != 3) ||
      !input.hasStaticShape() || shape[rank - 1] % 8 != 0 ||
      shape[rank - 2] % 8 != 0)
    return;
  OpBuilder b(op);
  auto fused = QuantizeOp::create(b, op.getLoc(), op.getData().getType(),
                                  op.getScales().getType(), TypeRange(),
                                  transpose.getInput(), op.getScheme(),
                                  /*transpose=*/true);
  op.getData().replaceAllUsesWith(fused.getData());
  op.getScales().replaceAllUsesWith(fused.getScales());
  op.erase();
  transpose.erase();
}

/// A weight quantized in 128 x 128 blocks both as it is and transposed
/// (the forward's codes and the dgrad's) becomes one moe.quantize giving
/// both: one read of the weights.
static void quantizeBothWays(QuantizeOp transposed) {
  // `a`'s shape with its last two dimensions swapped is `b`'s.
  auto swapped = [](Value a, Value b) {
    auto at = cast<RankedTensorType>(a.getType());
    SmallVector<int64_t> shape(at.getShape());
    if (shape.size() < 2)
      return false;
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    return at.clone(shape) == b.getType();
  };
  QuantizeOp plain;
  for (Operation *user : transposed.getInput().getUsers())
    if (auto q = dyn_cast<QuantizeOp>(user);
        q && q != transposed && !q.getTranspose() &&
        q.getTransposed().empty() && q.getScheme() == transposed.getScheme() &&
        q->getBlock() == transposed->getBlock() &&
        swapped(q.getData(), transposed.getData()) &&
        swapped(q.getScales(), transposed.getScales()))
      plain = q;
  if (!plain)
    return;
  OpBuilder b(plain->isBeforeInBlock(transposed) ? plain : transposed);
  auto both = QuantizeOp::create(
      b, plain.getLoc(), plain.getData().getType(), plain.getScales().getType(),
      TypeRange{transposed.getData().getType(),
                transposed.getScales().getType()},
      plain.getInput(), plain.getScheme(), /*transpose=*/false);
  plain.getData().replaceAllUsesWith(both.getData());
  plain.getScales().replaceAllUsesWith(both.getScales());
  transposed.getData().replaceAllUsesWith(both.getTransposed()[0]);
  transposed.getScales().replaceAllUsesWith(both.getTransposed()[1]);
  plain.erase();
  transposed.erase();
}

namespace {
struct LegalizePass : public moe::impl::LegalizeBase<LegalizePass> {
  void runOnOperation() override {
    SmallVector<GroupedMatmulDgradOp> dgrads;
    getOperation()->walk(
        [&](GroupedMatmulDgradOp op) { dgrads.push_back(op); });
    for (GroupedMatmulDgradOp op : dgrads)
      dgradAsMatmul(op);
    SmallVector<GroupedMatmulOp> products;
    getOperation()->walk([&](GroupedMatmulOp op) { products.push_back(op); });
    for (GroupedMatmulOp op : products)
      fuseQuantizedDgrad(op);
    SmallVector<QuantizeOp> quantizes;
    getOperation()->walk([&](QuantizeOp op) { quantizes.push_back(op); });
    for (QuantizeOp op : quantizes)
      quantizeTransposed(op);
    quantizes.clear();
    getOperation()->walk([&](QuantizeOp op) {
      if (op.getTranspose())
        quantizes.push_back(op);
    });
    for (QuantizeOp op : quantizes)
      quantizeBothWays(op);
    getOperation()->walk([&](GroupedMatmulOp op) {
      if (op.getTransposeRhs())
        return;
      auto lhsType = cast<RankedTensorType>(op.getLhs().getType());
      auto rhsType = cast<RankedTensorType>(op.getRhs().getType());
      int64_t k = lhsType.getShape().back();
      int64_t elementBytes = lhsType.getElementTypeBitWidth() / 8;
      int64_t unit = 16 / elementBytes;
      if (k % unit == 0)
        return;
      int64_t kPadded = llvm::alignTo(k, unit);
      OpBuilder b(op);
      op.getLhsMutable().assign(padded(b, op.getLoc(), op.getLhs(), kPadded));
      op.getRhsMutable().assign(padded(b, op.getLoc(), op.getRhs(), kPadded));
      bool dynamic = lhsType.isDynamicDim(0);
      int64_t rowBytes = kPadded * elementBytes;
      auto step = dyn_cast<NameLoc>(op.getLoc());
      op.emitRemark()
          << "K = " << k
          << (step ? " (" + step.getName().str() + " matmul)" : std::string())
          << " padded with zeros to " << kPadded
          << ": sm_90a loads matmul operands with TMA, whose rows "
             "must be a multiple of 16 bytes; each call copies "
          << llvm::formatv("{0}", bytesOf(rhsType)) << " bytes of weights and "
          << (dynamic ? llvm::formatv("{0} bytes per row", rowBytes).str()
                      : llvm::formatv("{0} bytes", bytesOf(lhsType)).str())
          << " of its input";
    });
  }
};
} // namespace
