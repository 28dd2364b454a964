//===- Registration.h - what the NVIDIA path needs registered ---*- C++ -*-===//

#ifndef MOE_CODEGEN_NVIDIA_PASSES_REGISTRATION_H
#define MOE_CODEGEN_NVIDIA_PASSES_REGISTRATION_H

#include "mlir/IR/DialectRegistry.h"

namespace mlir::moe::nvidia {
/// The dialects, their conversions to LLVM, the NVVM target (without which
/// gpu-module-to-binary crashes) and the LLVM IR translations that lowering
/// GPU kernels to PTX and cubin needs.
void registerNvidiaCodegen(DialectRegistry &registry);
} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_PASSES_REGISTRATION_H
