//===- CpuJit.h - layers JIT-compiled by the CPU backend, for tests -*- C++
//-*-===//
//
// Compiles a module of moe ops through the CPU pipeline into an execution
// engine and calls its functions' C interfaces on row-major buffers; bf16
// conversions and random inputs whose double values are exactly their bf16.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_UNIT_CPUJIT_H
#define MOE_TEST_UNIT_CPUJIT_H

#include "dialects/moe/MoeOps.h"
#include "passes/Pipelines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/Support/TargetSelect.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace moe::test {
using namespace mlir;

inline uint16_t toBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7FFF + ((bits >> 16) & 1); // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}
inline double fromBF16(uint16_t value) {
  uint32_t bits = uint32_t(value) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// One input of the layer: its bf16 or f32 data and the same values in
/// double for the reference.
struct Input {
  std::vector<int64_t> shape;
  bool isF32 = false;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  std::vector<double> values;
};

inline Input randomInput(std::mt19937 &rng, std::vector<int64_t> shape,
                         double stddev, bool isF32 = false) {
  Input in{shape, isF32, {}, {}, {}};
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (isF32) {
      in.f32.push_back(v);
      in.values.push_back(v);
    } else {
      in.bf16.push_back(toBF16(v));
      in.values.push_back(fromBF16(in.bf16.back()));
    }
  }
  return in;
}

inline std::string tensorType(const std::vector<int64_t> &shape, bool isF32,
                              bool dynamicTokens) {
  std::string text = "tensor<";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i == 0 && dynamicTokens ? std::string("?")
                                     : std::to_string(shape[i])) +
            "x";
  return text + (isF32 ? "f32>" : "bf16>");
}

/// A buffer the JIT-compiled function reads or writes: row-major data.
struct Buffer {
  void *data;
  std::vector<int64_t> shape;
};

/// Decomposes, lowers and JIT-compiles `source`; null (with the error
/// printed) on failure.
inline std::unique_ptr<ExecutionEngine> compile(
    const std::string &source,
    const mlir::moe::PipelineOptions &pipeline = mlir::moe::PipelineOptions()) {
  static bool initialized = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)initialized;
  DialectRegistry registry;
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  // The engine holds its own LLVM IR: the MLIR context may go.
  MLIRContext context(registry);
  context.loadDialect<mlir::moe::MoeDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &context);
  if (!module)
    return nullptr;
  PassManager pm(&context);
  mlir::moe::buildCpuPipeline(pm, pipeline);
  if (failed(pm.run(*module)))
    return nullptr;
  ExecutionEngineOptions options;
  options.transformer = makeOptimizingTransformer(2, 0, nullptr);
  auto engine = ExecutionEngine::create(*module, options);
  if (!engine) {
    llvm::errs() << llvm::toString(engine.takeError()) << "\n";
    return nullptr;
  }
  return std::move(*engine);
}

/// Calls the C interface of `name` with one strided memref descriptor per
/// buffer: {allocated, aligned, offset, sizes..., strides...}.
inline bool call(ExecutionEngine &engine, const std::string &name,
                 const std::vector<Buffer> &buffers) {
  std::vector<std::vector<int64_t>> descriptors;
  for (const Buffer &buffer : buffers) {
    auto address = reinterpret_cast<int64_t>(buffer.data);
    std::vector<int64_t> d = {address, address, 0};
    d.insert(d.end(), buffer.shape.begin(), buffer.shape.end());
    std::vector<int64_t> strides(buffer.shape.size());
    int64_t stride = 1;
    for (int64_t r = int64_t(buffer.shape.size()) - 1; r >= 0; --r) {
      strides[r] = stride;
      stride *= buffer.shape[r];
    }
    d.insert(d.end(), strides.begin(), strides.end());
    descriptors.push_back(std::move(d));
  }
  std::vector<void *> pointers, packed;
  for (auto &d : descriptors)
    pointers.push_back(d.data());
  for (void *&p : pointers)
    packed.push_back(&p);
  llvm::Error error = engine.invokePacked("_mlir_ciface_" + name, packed);
  if (error) {
    llvm::errs() << llvm::toString(std::move(error)) << "\n";
    return false;
  }
  return true;
}

} // namespace moe::test

#endif // MOE_TEST_UNIT_CPUJIT_H
