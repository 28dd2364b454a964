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
  Value weights = op.getRhs();
  if (!direct) {
    SmallVector<int64_t> shape(dims);
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    weights = TransposeOp::create(b, op.getLoc(), rhs.clone(shape), weights);
  }
  auto matmul = GroupedMatmulOp::create(
      b, op.getLoc(), op.getOut().getType(), Type(), op.getOutGrad(), weights,
      op.getTokensPerExpert(), op.getExpertOffsets(), Value(), Value(), Value(),
      ActivationAttr(), QuantAttr(), ArrayAttr());
  matmul.setTransposeRhs(direct);
  op.getOut().replaceAllUsesWith(matmul.getOut());
  if (!op.getBias())
    op.erase();
}

namespace {
struct LegalizePass : public moe::impl::LegalizeBase<LegalizePass> {
  void runOnOperation() override {
    SmallVector<GroupedMatmulDgradOp> dgrads;
    getOperation()->walk(
        [&](GroupedMatmulDgradOp op) { dgrads.push_back(op); });
    for (GroupedMatmulDgradOp op : dgrads)
      dgradAsMatmul(op);
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
