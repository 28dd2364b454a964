//===- Hopper.cpp - sm_90a instructions the kernel families share ---------===//

#include "codegen/nvidia/support/Hopper.h"

#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

#include <string>

using namespace mlir;

Value moe::nvidia::inlinePtx(OpBuilder &b, Location loc, TypeRange results,
                             ValueRange operands, StringRef text,
                             StringRef constraints) {
  auto op = LLVM::InlineAsmOp::create(
      b, loc, results.empty() ? Type() : results.front(), operands, text,
      constraints, /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
  return results.empty() ? Value() : op.getResult(0);
}

Value moe::nvidia::swizzledDescriptor(OpBuilder &b, Location loc, Value address,
                                      int64_t leadingBytes,
                                      int64_t strideBytes) {
  Type i64 = b.getI64Type();
  auto c = [&](int64_t v) { return LLVM::ConstantOp::create(b, loc, i64, v); };
  Value field = LLVM::LShrOp::create(
      b, loc, LLVM::AndOp::create(b, loc, address, c(0x3FFFF)), c(4));
  int64_t fixedBits = (int64_t(1) << 62) | ((strideBytes >> 4) << 32) |
                      ((leadingBytes >> 4) << 16);
  return LLVM::OrOp::create(b, loc, field, c(fixedBits));
}

Value moe::nvidia::zeroFragment(OpBuilder &b, Location loc, Type fragment) {
  Value acc = LLVM::PoisonOp::create(b, loc, fragment);
  Value zero =
      LLVM::ConstantOp::create(b, loc, b.getF32Type(), b.getF32FloatAttr(0.0));
  int64_t n = cast<LLVM::LLVMStructType>(fragment).getBody().size();
  for (int64_t i = 0; i < n; ++i)
    acc = LLVM::InsertValueOp::create(b, loc, acc, zero, ArrayRef<int64_t>{i});
  return acc;
}

Value moe::nvidia::wgmmaKMajor(OpBuilder &b, Location loc, Type fragment,
                               Value acc, Value a, Value bDesc, int64_t n,
                               int64_t k, NVVM::WGMMATypes type,
                               bool accumulate) {
  return wgmma(b, loc, fragment, acc, a, bDesc, n, k, type, accumulate,
               /*aMNMajor=*/false, /*bMNMajor=*/false);
}

Value moe::nvidia::wgmma(OpBuilder &b, Location loc, Type fragment, Value acc,
                         Value a, Value bDesc, int64_t n, int64_t k,
                         NVVM::WGMMATypes type, bool accumulate, bool aMNMajor,
                         bool bMNMajor) {
  MLIRContext *ctx = b.getContext();
  auto types = [&](NVVM::WGMMATypes t) {
    return NVVM::WGMMATypesAttr::get(ctx, t);
  };
  auto one = NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one);
  // K-major is NVVM's `row` for A and `col` for B (PTX's imm-trans 0).
  auto layout = [&](bool transposed, NVVM::MMALayout kMajor,
                    NVVM::MMALayout mnMajor) {
    return NVVM::MMALayoutAttr::get(ctx, transposed ? mnMajor : kMajor);
  };
  return NVVM::WgmmaMmaAsyncOp::create(
      b, loc, fragment, acc, a, bDesc, NVVM::MMAShapeAttr::get(ctx, 64, n, k),
      types(type), types(type), types(NVVM::WGMMATypes::f32),
      NVVM::WGMMAScaleOutAttr::get(ctx, accumulate ? NVVM::WGMMAScaleOut::one
                                                   : NVVM::WGMMAScaleOut::zero),
      one, one, layout(aMNMajor, NVVM::MMALayout::row, NVVM::MMALayout::col),
      layout(bMNMajor, NVVM::MMALayout::col, NVVM::MMALayout::row),
      NVVM::MMAIntOverflowAttr());
}

Value moe::nvidia::fenceFragment(OpBuilder &b, Location loc, Value fragment) {
  auto type = cast<LLVM::LLVMStructType>(fragment.getType());
  int64_t n = type.getBody().size();
  SmallVector<Value> fields;
  std::string constraints;
  for (int64_t i = 0; i < n; ++i) {
    fields.push_back(
        LLVM::ExtractValueOp::create(b, loc, fragment, ArrayRef<int64_t>{i}));
    constraints += "=f,";
  }
  for (int64_t i = 0; i < n; ++i)
    constraints += std::to_string(i) + (i + 1 < n ? "," : "");
  return inlinePtx(b, loc, type, fields, "", constraints);
}

void moe::nvidia::mbarrierArrive(OpBuilder &b, Location loc, Value group,
                                 Value slot) {
  // As inline PTX: the NVVM arrive's token is unused, and the op without a
  // use is dropped.
  Value address =
      nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(), group, slot);
  inlinePtx(b, loc, {}, address, "mbarrier.arrive.shared::cta.b64 _, [$0];",
            "r");
}

void moe::nvidia::mbarrierArriveRemote(OpBuilder &b, Location loc, Value group,
                                       Value slot, Value block) {
  // Block-scope release: at cluster scope every arrive waits on a fence.
  Value address =
      nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(), group, slot);
  inlinePtx(b, loc, {}, {address, block},
            "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $0, $1; "
            "mbarrier.arrive.shared::cluster.b64 _, [remote]; }",
            "r,r");
}

void moe::nvidia::namedBarrierSync(OpBuilder &b, Location loc, Value id,
                                   int64_t threads) {
  inlinePtx(b, loc, {}, id, "bar.sync $0, " + std::to_string(threads) + ";",
            "r");
}

void moe::nvidia::namedBarrierArrive(OpBuilder &b, Location loc, Value id,
                                     int64_t threads) {
  inlinePtx(b, loc, {}, id, "bar.arrive $0, " + std::to_string(threads) + ";",
            "r");
}
