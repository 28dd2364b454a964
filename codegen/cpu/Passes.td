//===- Passes.td - CPU reference backend passes ------------*- tablegen -*-===//

#ifndef MOE_CODEGEN_CPU_PASSES_TD
#define MOE_CODEGEN_CPU_PASSES_TD

include "mlir/Pass/PassBase.td"

def LowerToLoops : Pass<"moe-lower-to-loops", "::mlir::ModuleOp"> {
  let summary = "Lower L1 moe ops to scalar loops on buffers (the CPU reference)";
  let description = [{
    Every function on tensors that holds L1 moe ops becomes a function on
    memrefs whose results are written into extra trailing arguments, so the
    caller owns the output. Each op becomes plain scf loops in the arithmetic
    docs/numerics.md defines: the reference every other backend must match.
    `f8E4M3FN` and `f8E8M0FNU` buffers hold their codes as `i8`.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
    "::mlir::func::FuncDialect"
  ];
}

#endif // MOE_CODEGEN_CPU_PASSES_TD
