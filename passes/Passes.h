//===- Passes.h - moe-compiler passes ---------------------------*- C++ -*-===//

#ifndef MOE_PASSES_PASSES_H
#define MOE_PASSES_PASSES_H

#include "codegen/nvidia/support/Sm90a.h"
#include "dialects/moe/MoeOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::moe {
#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"
} // namespace mlir::moe

#endif // MOE_PASSES_PASSES_H
