//===- RuntimeImports.cpp - runtime functions generated code calls --------===//

#include "codegen/common/RuntimeImports.h"

#include "mlir/IR/TypeRange.h"

using namespace mlir;
using namespace mlir::moe;

RuntimeSignature mlir::moe::getRuntimeSignature(RuntimeImport fn) {
  static const RuntimeSignature table[] = {
#define MOE_RUNTIME_IMPORT(name, result, params) {#name, result, params},
#include "codegen/common/RuntimeImports.def"
  };
  return table[static_cast<size_t>(fn)];
}

FunctionType mlir::moe::getRuntimeFunctionType(MLIRContext *context,
                                               RuntimeImport fn, Type pointer) {
  auto type = [&](char abi) -> Type {
    switch (abi) {
    case 'i':
      return IntegerType::get(context, 32);
    case 'l':
      return IntegerType::get(context, 64);
    default:
      return pointer;
    }
  };
  RuntimeSignature signature = getRuntimeSignature(fn);
  SmallVector<Type> params;
  for (char abi : signature.params)
    params.push_back(type(abi));
  SmallVector<Type> results;
  if (signature.result != "v")
    results.push_back(type(signature.result.front()));
  return FunctionType::get(context, params, results);
}
