//===- RuntimeImports.h - runtime functions generated code calls -*- C++
//-*-===//

#ifndef MOE_CODEGEN_COMMON_RUNTIMEIMPORTS_H
#define MOE_CODEGEN_COMMON_RUNTIMEIMPORTS_H

#include "mlir/IR/BuiltinTypes.h"

namespace mlir::moe {

enum class RuntimeImport {
#define MOE_RUNTIME_IMPORT(name, result, params) name,
#include "codegen/common/RuntimeImports.def"
};

/// An import's C name and signature in ABI classes (RuntimeImports.def).
struct RuntimeSignature {
  StringRef name;
  StringRef result, params;
};
RuntimeSignature getRuntimeSignature(RuntimeImport fn);

/// `fn`'s signature as a builtin function type, for func.call: 32- and
/// 64-bit integers as i32 and i64, pointers as `pointer`.
FunctionType getRuntimeFunctionType(MLIRContext *context, RuntimeImport fn,
                                    Type pointer);

} // namespace mlir::moe

#endif // MOE_CODEGEN_COMMON_RUNTIMEIMPORTS_H
