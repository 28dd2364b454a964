//===- moe-opt.cpp - the moe dialect and passes, mlir-opt style -----------===//

#include "codegen/cpu/Passes.h"
#include "codegen/nvidia/passes/Passes.h"
#include "codegen/nvidia/passes/Registration.h"
#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "tools/Version.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  llvm::cl::SetVersionPrinter(mlir::moe::printVersion);
  mlir::DialectRegistry registry;
  registry.insert<mlir::moe::MoeDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::tensor::TensorDialect,
                  mlir::math::MathDialect, mlir::memref::MemRefDialect,
                  mlir::scf::SCFDialect>();
  mlir::moe::registerMoePasses();
  mlir::moe::cpu::registerCpuPasses();
  mlir::moe::nvidia::registerNvidiaPasses();
  mlir::moe::registerPipelines();
  mlir::moe::nvidia::registerNvidiaCodegen(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "moe-compiler optimizer: the moe dialect and its passes\n",
      registry));
}
