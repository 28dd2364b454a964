//===- Pipeline.cpp - decomposed layers to the LLVM dialect ---------------===//

#include "codegen/cpu/Passes.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void moe::cpu::buildLowerToLLVMPipeline(OpPassManager &pm) {
  pm.addPass(createLowerToLoops());
  pm.addPass(createCanonicalizerPass());
  // bf16 conversions become integer arithmetic (round to nearest even), so
  // the object needs no compiler runtime for them.
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void moe::cpu::registerCpuPipelines() {
  PassPipelineRegistration<>(
      "moe-cpu-to-llvm",
      "Lower decomposed layers to the LLVM dialect through the CPU reference "
      "backend",
      buildLowerToLLVMPipeline);
}
