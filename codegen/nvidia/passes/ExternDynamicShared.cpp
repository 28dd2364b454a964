//===- ExternDynamicShared.cpp - dynamic shared memory as PTX declares it -===//
//
// The GPU-to-NVVM conversion gives gpu.dynamic_shared_memory an internal
// zero-sized global, which the NVPTX backend prints as a one-byte static
// `.shared` variable: ptxas may place it below other static shared
// variables (mbarriers, workgroup buffers), and a kernel indexing past it
// then writes over them. Made external, it is printed as PTX's
// `.extern .shared` array, which starts after all static shared memory.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/passes/Passes.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace mlir::moe::nvidia {
#define GEN_PASS_DEF_EXTERNDYNAMICSHARED
#include "codegen/nvidia/passes/Passes.h.inc"
} // namespace mlir::moe::nvidia

using namespace mlir;

namespace {
struct ExternDynamicSharedPass
    : public moe::nvidia::impl::ExternDynamicSharedBase<
          ExternDynamicSharedPass> {
  void runOnOperation() override {
    getOperation().walk([&](LLVM::GlobalOp global) {
      auto type = dyn_cast<LLVM::LLVMArrayType>(global.getGlobalType());
      if (global.getAddrSpace() == 3 && type && type.getNumElements() == 0 &&
          global.getInitializerRegion().empty() && !global.getValue())
        global.setLinkage(LLVM::Linkage::External);
    });
  }
};
} // namespace
