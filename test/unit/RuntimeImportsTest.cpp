//===- RuntimeImportsTest.cpp - the import table against the headers ------===//
//
// Generated code declares the runtime's functions from
// codegen/common/RuntimeImports.def; a header that changes a signature
// without the table (or the reverse) fails here, not in a caller's process.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/RuntimeImports.h"
#include "lib/transport/moe_transport.h"
#include "runtime/moe_ep.h"
#include "runtime/moert.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace {
/// The ABI class of a C type: v void, i 32-bit integer (or enum), l 64-bit
/// integer, p pointer; '?' for anything generated code cannot pass.
template <typename T> char abiClass() {
  if constexpr (std::is_void_v<T>)
    return 'v';
  else if constexpr (std::is_pointer_v<T>)
    return 'p';
  else if constexpr ((std::is_integral_v<T> || std::is_enum_v<T>)&&sizeof(T) ==
                     4)
    return 'i';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8)
    return 'l';
  else
    return '?';
}

template <typename R, typename... Args> std::string signature(R (*)(Args...)) {
  std::string text(1, abiClass<R>());
  text += '(';
  (text.push_back(abiClass<Args>()), ...);
  return text + ')';
}

std::string tableSignature(mlir::moe::RuntimeImport fn) {
  mlir::moe::RuntimeSignature s = mlir::moe::getRuntimeSignature(fn);
  return (s.result + "(" + s.params + ")").str();
}

TEST(RuntimeImports, EveryImportMatchesItsHeader) {
  int checked = 0;
#define MOE_RUNTIME_IMPORT(fn, result, params)                                 \
  EXPECT_EQ(tableSignature(mlir::moe::RuntimeImport::fn), signature(&fn))      \
      << #fn;                                                                  \
  EXPECT_EQ(mlir::moe::getRuntimeSignature(mlir::moe::RuntimeImport::fn).name, \
            #fn);                                                              \
  ++checked;
#include "codegen/common/RuntimeImports.def"
  EXPECT_EQ(checked, 34);
}

TEST(RuntimeImports, ClassesTellTypesApart) {
  // The check above can fail: a 64-bit argument where the table says 32.
  EXPECT_EQ(signature(static_cast<int32_t (*)(int64_t, void *)>(nullptr)),
            "i(lp)");
  EXPECT_NE(signature(&moe_ep_begin), "i(i)");
  EXPECT_EQ(abiClass<double>(), '?');
}
} // namespace
