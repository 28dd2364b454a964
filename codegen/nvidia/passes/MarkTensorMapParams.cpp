//===- MarkTensorMapParams.cpp - TMA descriptors by value -----------------===//

#include "codegen/nvidia/passes/Passes.h"

#include "codegen/nvidia/support/KernelBuilder.h"

namespace mlir::moe::nvidia {
#define GEN_PASS_DEF_MARKTENSORMAPPARAMS
#include "codegen/nvidia/passes/Passes.h.inc"
} // namespace mlir::moe::nvidia

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
struct MarkTensorMapParamsPass
    : public nvidia::impl::MarkTensorMapParamsBase<MarkTensorMapParamsPass> {
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    auto descriptor =
        TypeAttr::get(LLVM::LLVMArrayType::get(IntegerType::get(ctx, 8), 128));
    auto align = IntegerAttr::get(IntegerType::get(ctx, 64), 64);
    getOperation().walk([&](LLVM::LLVMFuncOp f) {
      auto maps = f->getAttrOfType<DenseI64ArrayAttr>(kTensorMapArgs);
      if (!maps)
        return;
      f->removeAttr(kTensorMapArgs);
      for (int64_t i : maps.asArrayRef()) {
        f.setArgAttr(i, LLVM::LLVMDialect::getByValAttrName(), descriptor);
        f.setArgAttr(i, LLVM::LLVMDialect::getAlignAttrName(), align);
        f.setArgAttr(i, NVVM::NVVMDialect::getGridConstantAttrName(),
                     UnitAttr::get(ctx));
      }
    });
  }
};
} // namespace
