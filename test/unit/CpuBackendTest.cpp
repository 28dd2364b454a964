//===- CpuBackendTest.cpp - CPU reference backend vs float64 layers -------===//
//
// Each router, activation and shared-expert variant is decomposed, lowered by
// the CPU backend, JIT-compiled and run on random inputs at several token
// counts; the output must match the float64 reference of test/reference.
//
//===----------------------------------------------------------------------===//

#include "codegen/cpu/Passes.h"
#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"
#include "test/reference/Layer.h"

#include "mlir/ExecutionEngine/CRunnerUtils.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/Support/TargetSelect.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <random>

using namespace mlir;
using ::moe::ref::LayerConfig;
using ::moe::ref::Router;

namespace {
uint16_t toBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7FFF + ((bits >> 16) & 1); // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}
double fromBF16(uint16_t value) {
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

Input randomInput(std::mt19937 &rng, std::vector<int64_t> shape, double stddev,
                  bool isF32 = false) {
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

std::string tensorType(const std::vector<int64_t> &shape, bool isF32,
                       bool dynamicTokens) {
  std::string text = "tensor<";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i == 0 && dynamicTokens ? std::string("?")
                                     : std::to_string(shape[i])) +
            "x";
  return text + (isF32 ? "f32>" : "bf16>");
}

struct Case {
  const char *name;
  LayerConfig config;
  bool routerBias = false, expertBiases = false;
};

class CpuBackendTest : public ::testing::TestWithParam<Case> {
protected:
  static void SetUpTestSuite() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  }
};

std::string routerText(const LayerConfig &c) {
  static const char *kinds[] = {"softmax_topk", "topk_softmax",
                                "sigmoid_grouped_topk", "sigmoid_scale_input"};
  std::string text = std::string("<kind = ") + kinds[int(c.router)];
  if (c.renormalize)
    text += ", renormalize = true";
  if (c.nGroup > 1)
    text += ", n_group = " + std::to_string(c.nGroup) +
            ", topk_group = " + std::to_string(c.topkGroup);
  if (c.scaling != 1.0)
    text += ", scaling = " + std::to_string(c.scaling);
  return text + ">";
}
} // namespace

TEST_P(CpuBackendTest, MatchesTheFloat64Reference) {
  const Case &tc = GetParam();
  const LayerConfig &c = tc.config;
  int64_t e = c.experts, h = c.hidden, inter = c.intermediate;
  int64_t is = c.sharedIntermediate;

  // The layer, its arguments in ABI order.
  std::mt19937 rng(1234);
  double wScale = 1.0 / std::sqrt(double(h));
  std::vector<std::pair<std::string, Input>> weights;
  weights.push_back({"router_weight", randomInput(rng, {e, h}, wScale)});
  if (tc.routerBias)
    weights.push_back({"router_bias", randomInput(rng, {e}, 0.3, true)});
  weights.push_back({"w13", randomInput(rng, {e, 2 * inter, h}, wScale)});
  weights.push_back(
      {"w2", randomInput(rng, {e, h, inter}, 1.0 / std::sqrt(double(inter)))});
  if (tc.expertBiases) {
    weights.push_back({"w13_bias", randomInput(rng, {e, 2 * inter}, 0.3)});
    weights.push_back({"w2_bias", randomInput(rng, {e, h}, 0.3)});
  }
  if (is > 0) {
    weights.push_back({"shared_w13", randomInput(rng, {2 * is, h}, wScale)});
    weights.push_back(
        {"shared_w2", randomInput(rng, {h, is}, 1.0 / std::sqrt(double(is)))});
    if (c.sharedGate)
      weights.push_back({"shared_gate", randomInput(rng, {1, h}, wScale)});
  }
  std::string args = "%hidden_states: tensor<?x" + std::to_string(h) + "xbf16>";
  std::string types = "tensor<?x" + std::to_string(h) + "xbf16>";
  for (auto &[name, in] : weights) {
    args += ", %" + name + ": " + tensorType(in.shape, in.isF32, false);
    types += ", " + tensorType(in.shape, in.isF32, false);
  }
  std::string out = "tensor<?x" + std::to_string(h) + "xbf16>";
  std::string layer =
      "%out = moe.layer %hidden_states router(%router_weight" +
      std::string(tc.routerBias ? ", %router_bias" : "") +
      ") experts(%w13, %w2)" +
      (tc.expertBiases ? " biases(%w13_bias, %w2_bias)" : "") +
      (is > 0 ? std::string(" shared(%shared_w13, %shared_w2") +
                    (c.sharedGate ? ", %shared_gate)" : ")")
              : "") +
      " {config = #moe.config<experts = " + std::to_string(e) +
      ", top_k = " + std::to_string(c.topK) +
      ", hidden = " + std::to_string(h) +
      ", intermediate = " + std::to_string(inter) +
      ", router = " + routerText(c) + ", activation = " +
      (c.clampedSwiGLU
           ? "<kind = clamped_swiglu, alpha = " + std::to_string(c.alpha) +
                 ", limit = " + std::to_string(c.limit) + ">"
           : std::string("<kind = swiglu>")) +
      (is > 0 ? ", shared_intermediate = " + std::to_string(is) : "") +
      (c.sharedGate ? ", shared_gate = true" : "") + ">} : (" + types +
      ") -> " + out;
  std::string source = "func.func @layer(" + args + ") -> " + out +
                       " attributes {llvm.emit_c_interface} {\n  " + layer +
                       "\n  return %out : " + out + "\n}\n";

  DialectRegistry registry;
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  MLIRContext context(registry);
  context.loadDialect<mlir::moe::MoeDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &context);
  ASSERT_TRUE(module) << source;
  PassManager pm(&context);
  pm.addPass(mlir::moe::createDecompose());
  mlir::moe::cpu::buildLowerToLLVMPipeline(pm);
  ASSERT_TRUE(succeeded(pm.run(*module)));
  ExecutionEngineOptions options;
  options.transformer = makeOptimizingTransformer(2, 0, nullptr);
  auto engine = ExecutionEngine::create(*module, options);
  ASSERT_TRUE(static_cast<bool>(engine)) << llvm::toString(engine.takeError());

  for (int64_t tokens : {0, 1, 37}) {
    Input hidden = randomInput(rng, {tokens, h}, 1.0);
    std::vector<uint16_t> output(tokens * h, 0x7FC0); // poisoned: NaN

    // Descriptors for the C interface: one per argument, then the output.
    std::vector<std::vector<int64_t>> shapes = {hidden.shape};
    std::vector<void *> data = {hidden.bf16.data()};
    for (auto &[name, in] : weights) {
      shapes.push_back(in.shape);
      data.push_back(in.isF32 ? static_cast<void *>(in.f32.data())
                              : static_cast<void *>(in.bf16.data()));
    }
    shapes.push_back({tokens, h});
    data.push_back(output.data());
    std::vector<std::vector<int64_t>> descriptors;
    for (size_t i = 0; i < shapes.size(); ++i) {
      // {allocated, aligned, offset, sizes..., strides...} as 64-bit words.
      std::vector<int64_t> d = {reinterpret_cast<int64_t>(data[i]),
                                reinterpret_cast<int64_t>(data[i]), 0};
      d.insert(d.end(), shapes[i].begin(), shapes[i].end());
      int64_t stride = 1;
      std::vector<int64_t> strides(shapes[i].size());
      for (int64_t r = int64_t(shapes[i].size()) - 1; r >= 0; --r) {
        strides[r] = stride;
        stride *= shapes[i][r];
      }
      d.insert(d.end(), strides.begin(), strides.end());
      descriptors.push_back(std::move(d));
    }
    std::vector<void *> pointers, packed;
    for (auto &d : descriptors)
      pointers.push_back(d.data());
    for (void *&p : pointers)
      packed.push_back(&p);
    llvm::Error error = (*engine)->invokePacked("_mlir_ciface_layer", packed);
    ASSERT_FALSE(static_cast<bool>(error)) << llvm::toString(std::move(error));

    ::moe::ref::LayerTensors t;
    t.hiddenStates = hidden.values;
    for (auto &[name, in] : weights) {
      std::vector<double> *slot = name == "router_weight" ? &t.routerWeight
                                  : name == "router_bias" ? &t.routerBias
                                  : name == "w13"         ? &t.w13
                                  : name == "w2"          ? &t.w2
                                  : name == "w13_bias"    ? &t.w13Bias
                                  : name == "w2_bias"     ? &t.w2Bias
                                  : name == "shared_w13"  ? &t.sharedW13
                                  : name == "shared_w2"   ? &t.sharedW2
                                                          : &t.sharedGate;
      *slot = in.values;
    }
    std::vector<double> expected = ::moe::ref::referenceLayer(c, t, tokens);
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < tokens * h; ++i) {
      double got = fromBF16(output[i]);
      ASSERT_TRUE(std::isfinite(got)) << "output " << i << " not written";
      diff += (got - expected[i]) * (got - expected[i]);
      norm += expected[i] * expected[i];
    }
    double relative = tokens ? std::sqrt(diff / norm) : 0.0;
    // The backend rounds to bf16 four times on the way (activation, expert
    // rows, shared output, result), each within 2^-9 relative; f32 versus
    // f64 accumulation adds far less. 1e-2 leaves room for that and nothing
    // like a wrong expert or weight.
    EXPECT_LT(relative, 1e-2) << tc.name << " at " << tokens << " tokens";
    std::printf("%s, %ld tokens: relative error %.2e\n", tc.name,
                static_cast<long>(tokens), relative);
  }
}

static LayerConfig config(Router router, int64_t experts, int64_t topK) {
  LayerConfig c;
  c.router = router;
  c.experts = experts;
  c.topK = topK;
  c.hidden = 64;
  c.intermediate = 32;
  return c;
}

static std::vector<Case> cases() {
  std::vector<Case> all;
  LayerConfig mixtral = config(Router::SoftmaxTopK, 8, 2);
  mixtral.renormalize = true;
  all.push_back({"mixtral", mixtral});
  LayerConfig qwen2 = config(Router::SoftmaxTopK, 16, 4);
  qwen2.sharedIntermediate = 48;
  qwen2.sharedGate = true;
  all.push_back({"qwen2_moe", qwen2});
  LayerConfig deepseek = config(Router::SigmoidGroupedTopK, 16, 4);
  deepseek.renormalize = true;
  deepseek.nGroup = 4;
  deepseek.topkGroup = 2;
  deepseek.scaling = 2.5;
  deepseek.sharedIntermediate = 32;
  all.push_back({"deepseek_v3", deepseek, /*routerBias=*/true});
  LayerConfig gptOss = config(Router::TopKSoftmax, 8, 4);
  gptOss.clampedSwiGLU = true;
  gptOss.limit = 0.75; // small enough that clamping happens
  all.push_back({"gpt_oss", gptOss, true, /*expertBiases=*/true});
  LayerConfig llama4 = config(Router::SigmoidScaleInput, 8, 1);
  llama4.sharedIntermediate = 32;
  all.push_back({"llama4", llama4});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Layers, CpuBackendTest, ::testing::ValuesIn(cases()),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });
