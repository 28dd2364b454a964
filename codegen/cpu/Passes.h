//===- Passes.h - CPU reference backend passes ------------------*- C++ -*-===//

#ifndef MOE_CODEGEN_CPU_PASSES_H
#define MOE_CODEGEN_CPU_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Pass/Pass.h"

namespace mlir::moe::cpu {
#define GEN_PASS_DECL
#include "codegen/cpu/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "codegen/cpu/Passes.h.inc"
} // namespace mlir::moe::cpu

#endif // MOE_CODEGEN_CPU_PASSES_H
