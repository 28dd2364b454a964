//===- TrainTest.cpp - derived gradients vs float64 finite differences ----===//
//
// Each router, activation and shared-expert variant is decomposed and
// differentiated (moe-differentiate), lowered by the CPU backend and run on
// random inputs: its training forward, then its backward on a random output
// gradient. Every gradient the backward returns (tokens, router weight and
// bias, expert weights and biases, shared experts and their gate) must match
// central differences of the float64 reference layer (test/reference) of
// L = sum(output gradient x output), which shares no code with the compiler.
// A quantized layer's gradients are straight-through: the reference takes
// the weights as the layer's quantization decodes them, and the bound allows
// for the activations it quantizes (the reference does not).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "test/reference/Layer.h"
#include "test/reference/Quantize.h"
#include "test/unit/CpuJit.h"
#include "test/unit/Layers.h"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>

using namespace mlir;
using namespace ::moe::test;
using ::moe::ref::LayerConfig;
using ::moe::ref::Router;

namespace {
/// What moe-differentiate made of the layer: the training forward's saved
/// values (names and types) and the backward's gradients (argument numbers
/// and types).
struct Derived {
  std::vector<std::string> savedNames;
  std::vector<RankedTensorType> savedTypes;
  std::vector<int64_t> gradientOf;
  std::vector<RankedTensorType> gradientTypes;
};

std::optional<Derived> derive(MLIRContext &context, const std::string &source,
                              bool recompute) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &context);
  if (!module)
    return std::nullopt;
  PassManager pm(&context);
  mlir::moe::PipelineOptions options;
  options.train = true;
  options.trainRecompute = recompute;
  options.stopAfter = mlir::moe::Stop::L1;
  mlir::moe::buildCpuPipeline(pm, options);
  if (failed(pm.run(*module)))
    return std::nullopt;
  auto train = module->lookupSymbol<func::FuncOp>("layer_train");
  auto backward = module->lookupSymbol<func::FuncOp>("layer_backward");
  if (!train || !backward)
    return std::nullopt;
  Derived d;
  for (Attribute name : train->getAttrOfType<ArrayAttr>("moe.saved"))
    d.savedNames.push_back(cast<StringAttr>(name).str());
  for (Type t : train.getFunctionType().getResults().drop_front())
    d.savedTypes.push_back(cast<RankedTensorType>(t));
  for (int64_t i :
       backward->getAttrOfType<DenseI64ArrayAttr>("moe.gradients").asArrayRef())
    d.gradientOf.push_back(i);
  for (Type t : backward.getFunctionType().getResults())
    d.gradientTypes.push_back(cast<RankedTensorType>(t));
  return d;
}

/// A buffer of `type` for `tokens` tokens: rows of the dispatched layout
/// (tokens x top-k on the CPU, whose experts' rows are not aligned) for the
/// experts' matmuls' operands and results, else a row a token.
struct Owned {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> shape;
  Type element;
};
Owned allocate(RankedTensorType type, int64_t rows) {
  Owned o{{}, {}, type.getElementType()};
  int64_t n = 1;
  for (int64_t d : type.getShape()) {
    o.shape.push_back(ShapedType::isDynamic(d) ? rows : d);
    n *= o.shape.back();
  }
  // Poisoned: 0xFF bytes are NaN in bf16 and f32.
  o.bytes.assign(n * ((type.getElementTypeBitWidth() + 7) / 8), 0xFF);
  return o;
}
double element(const Owned &o, int64_t i) {
  if (o.element.isF32()) {
    float f;
    std::memcpy(&f, &o.bytes[4 * i], 4);
    return f;
  }
  uint16_t v;
  std::memcpy(&v, &o.bytes[2 * i], 2);
  return fromBF16(v);
}

/// A compiled layer's training forward and backward on `inputs` (tokens
/// first) and the output's gradient: the gradients the backward returns.
struct Trained {
  Derived derived;
  std::unique_ptr<ExecutionEngine> engine;

  /// Derives and compiles `source`; false (with the error printed) on
  /// failure.
  bool build(MLIRContext &context, const std::string &source, bool recompute) {
    std::optional<Derived> d = derive(context, source, recompute);
    if (!d)
      return false;
    derived = *d;
    mlir::moe::PipelineOptions options;
    options.train = true;
    options.trainRecompute = recompute;
    engine = compile(source, options);
    return static_cast<bool>(engine);
  }

  /// The training forward's output, bf16 (poisoned first).
  std::vector<uint16_t> output;

  std::vector<Owned> run(const std::vector<Buffer> &inputs, Buffer outGrad,
                         int64_t tokens, int64_t topK, int64_t hidden) {
    output.assign(tokens * hidden, 0x7FC0);
    std::vector<Owned> saved;
    for (size_t i = 0; i < derived.savedTypes.size(); ++i) {
      const std::string &name = derived.savedNames[i];
      bool perRow = name.rfind("dispatch.dispatched", 0) == 0 ||
                    name.rfind("gate_up.", 0) == 0 ||
                    name.rfind("gate_up_input.", 0) == 0;
      saved.push_back(
          allocate(derived.savedTypes[i], perRow ? tokens * topK : tokens));
    }
    // The training forward: the output, then what it saves.
    std::vector<Buffer> trainArgs = inputs;
    trainArgs.push_back({output.data(), {tokens, hidden}});
    for (Owned &o : saved)
      trainArgs.push_back({o.bytes.data(), o.shape});
    std::vector<Owned> grads;
    if (!call(*engine, "layer_train", trainArgs))
      return grads;
    // The backward: the inputs, the output's gradient, the saved values,
    // then a gradient for each argument that has one.
    std::vector<Buffer> backwardArgs = inputs;
    backwardArgs.push_back(outGrad);
    for (Owned &o : saved)
      backwardArgs.push_back({o.bytes.data(), o.shape});
    for (RankedTensorType type : derived.gradientTypes)
      grads.push_back(allocate(type, tokens));
    for (Owned &o : grads)
      backwardArgs.push_back({o.bytes.data(), o.shape});
    if (!call(*engine, "layer_backward", backwardArgs))
      grads.clear();
    return grads;
  }
};

/// The values a layer with the `quant` scheme multiplies for a bf16 weight
/// it quantizes itself ([E, N, K] or [N, K]): each expert's matrix
/// quantized as the scheme quantizes weights (MXFP8 along K; FP8 block-128
/// in 128 x 128 blocks), decoded.
std::vector<double> dequantizedWeight(const std::string &quant,
                                      const Input &in) {
  int64_t k = in.shape.back(), n = in.shape[in.shape.size() - 2];
  int64_t experts = in.shape.size() == 3 ? in.shape[0] : 1;
  bool mx = quant.find("mxfp8") != std::string::npos;
  std::vector<double> out(in.values.size());
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<float> matrix(in.values.begin() + e * n * k,
                              in.values.begin() + (e + 1) * n * k);
    ::moe::ref::Quantized q =
        mx ? ::moe::ref::quantizeMXFP8(matrix, n, k,
                                       ::moe::ref::ScaleRounding::Floor)
           : ::moe::ref::quantizeFP8Block128(matrix, n, k, 128);
    int64_t kBlocks = mx ? (k + 31) / 32 : (k + 127) / 128;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        double scale = mx ? ::moe::ref::decodeE8M0(q.e8m0[r * kBlocks + c / 32])
                          : q.f32Scales[(r / 128) * kBlocks + c / 128];
        out[e * n * k + r * k + c] =
            ::moe::ref::decodeE4M3(q.data[r * k + c]) * scale;
      }
  }
  return out;
}

class CpuTrainTest : public ::testing::TestWithParam<LayerCase> {};
} // namespace

TEST_P(CpuTrainTest, GradientsMatchFloat64FiniteDifferences) {
  const LayerCase &tc = GetParam();
  const LayerConfig &c = tc.config;
  int64_t h = c.hidden;
  std::mt19937 rng(4321);
  auto weights = layerWeights(tc, rng);
  std::string source = layerSource(tc, weights);

  DialectRegistry registry;
  MLIRContext context(registry);
  context.loadDialect<mlir::moe::MoeDialect, func::FuncDialect>();
  // The gate/up outputs saved, and recomputed in the backward.
  Trained saving, recomputing;
  ASSERT_TRUE(saving.build(context, source, /*recompute=*/false)) << source;
  ASSERT_TRUE(recomputing.build(context, source, /*recompute=*/true)) << source;
  const Derived *derived = &saving.derived;

  // No tokens: every weight's gradient is zero, and nothing is read.
  for (int64_t tokens : {6, 0}) {
    Input hidden = randomInput(rng, {tokens, h}, 1.0);
    Input outGrad = randomInput(rng, {tokens, h}, 1.0);
    std::vector<Buffer> inputs = {{hidden.bf16.data(), hidden.shape}};
    for (auto &[name, in] : weights)
      inputs.push_back({in.isF32 ? static_cast<void *>(in.f32.data())
                                 : static_cast<void *>(in.bf16.data()),
                        in.shape});
    Buffer dout{outGrad.bf16.data(), outGrad.shape};
    std::vector<Owned> grads = saving.run(inputs, dout, tokens, c.topK, h);
    ASSERT_EQ(grads.size(), derived->gradientTypes.size());
    // The training forward computes the layer (its activation a step of its
    // own, after the gate/up output is rounded to bf16).
    ::moe::ref::LayerTensors t;
    t.hiddenStates = hidden.values;
    for (auto &[name, in] : weights) {
      bool quantized = name == "w13" || name == "w2" || name == "shared_w13" ||
                       name == "shared_w2";
      *referenceSlot(t, name) = !tc.quant.empty() && quantized
                                    ? dequantizedWeight(tc.quant, in)
                                    : in.values;
    }
    std::vector<double> expected = ::moe::ref::referenceLayer(c, t, tokens);
    // bf16 rounding (see below) within 1e-2; a quantized layer's E4M3
    // activations (dispatched rows, activation output) are each off by up
    // to 2^-4 relative, about 3.6% RMS, which the reference does not do.
    double bound = tc.quant.empty() ? 1e-2 : 0.1;
    double outDiff = 0.0, outNorm = 0.0;
    for (int64_t i = 0; i < tokens * h; ++i) {
      double got = fromBF16(saving.output[i]);
      ASSERT_TRUE(std::isfinite(got)) << "output " << i << " not written";
      outDiff += (got - expected[i]) * (got - expected[i]);
      outNorm += expected[i] * expected[i];
    }
    EXPECT_LT(tokens ? std::sqrt(outDiff / outNorm) : 0.0, bound)
        << tc.name << ": the training forward's output";
    // Recomputing computes the same gate/up outputs: the same gradients.
    std::vector<Owned> again = recomputing.run(inputs, dout, tokens, c.topK, h);
    ASSERT_EQ(again.size(), grads.size());
    for (size_t g = 0; g < grads.size(); ++g)
      EXPECT_EQ(again[g].bytes, grads[g].bytes) << "gradient " << g;

    // The float64 reference's L = sum(dout x out) at perturbed inputs.
    std::vector<std::string> names = {"hidden_states"};
    for (auto &[name, in] : weights)
      names.push_back(name);
    auto loss = [&]() {
      std::vector<double> out = ::moe::ref::referenceLayer(c, t, tokens);
      double sum = 0.0;
      for (int64_t i = 0; i < tokens * h; ++i)
        sum += out[i] * outGrad.values[i];
      return sum;
    };
    // A selection-only bias has no gradient; every other argument has one.
    bool biasRanksOnly = c.router == Router::SigmoidGroupedTopK;
    EXPECT_EQ(derived->gradientOf.size(),
              names.size() - (tc.routerBias && biasRanksOnly ? 1 : 0));
    for (size_t g = 0; g < grads.size(); ++g) {
      const std::string &name = names[derived->gradientOf[g]];
      std::vector<double> &values = *referenceSlot(t, name);
      int64_t n = values.size();
      // Every element of small tensors, a random sample of large ones (an
      // even stride would keep to a few columns of a row-major weight).
      std::vector<int64_t> sample;
      std::uniform_int_distribution<int64_t> any(0,
                                                 std::max<int64_t>(n, 1) - 1);
      for (int64_t i = 0; i < std::min<int64_t>(n, 256); ++i)
        sample.push_back(n <= 256 ? i : any(rng));
      double diff = 0.0, norm = 0.0;
      for (int64_t i : sample) {
        double got = element(grads[g], i);
        ASSERT_TRUE(std::isfinite(got)) << name << "[" << i << "] not written";
        double saved = values[i], eps = 1e-6;
        values[i] = saved + eps;
        double up = loss();
        values[i] = saved - eps;
        double down = loss();
        values[i] = saved;
        double expected = (up - down) / (2 * eps);
        diff += (got - expected) * (got - expected);
        norm += expected * expected;
      }
      double relative = std::sqrt(diff / std::max(norm, 1e-30));
      // bf16: the backward rounds its row gradients and the activations it
      // recomputes to bf16 (each within 2^-9 relative) and the forward it
      // differentiates rounds its own steps the same way; sums are f32.
      EXPECT_LT(relative, bound) << tc.name << ": gradient of " << name;
      std::printf("%s, %ld tokens: gradient of %s, relative error %.2e\n",
                  tc.name, static_cast<long>(tokens), name.c_str(), relative);
      if (tokens == 0) {
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(element(grads[g], i), 0.0) << name << "[" << i << "]";
      }
    }
  }
}

static std::vector<LayerCase> trainCases() {
  std::vector<LayerCase> all = modelLayers();
  // Odd sizes: 3 experts, hidden 40, intermediate 20, no renormalization.
  ::moe::ref::LayerConfig odd;
  odd.experts = 3, odd.topK = 2, odd.hidden = 40, odd.intermediate = 20;
  all.push_back({"odd", odd});
  // Quantized: each scheme, with shared experts and their gate, a selection
  // bias, and expert biases.
  LayerCase mixtral = all[0], qwen2 = all[1], deepseek = all[2],
            gptOss = all[3];
  all.push_back(
      {"mixtral_mxfp8", mixtral.config, false, false, "<kind = mxfp8>"});
  all.push_back({"qwen2_moe_fp8_block128", qwen2.config, false, false,
                 "<kind = fp8_block128>"});
  all.push_back({"deepseek_v3_fp8_block128", deepseek.config, true, false,
                 "<kind = fp8_block128>"});
  // GPT-OSS's own limit: at the bf16 case's tight one, the quantized
  // activations move many gate values across the clamp, whose derivative
  // jumps there, and the reference (not quantized) does not.
  gptOss.config.limit = 7.0;
  all.push_back({"gpt_oss_mxfp8", gptOss.config, true, true, "<kind = mxfp8>"});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Layers, CpuTrainTest,
                         ::testing::ValuesIn(trainCases()),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

// The parts sm_90a's fused down dgrad splits moe.activation_grad into, on
// the CPU backend: the scatter's row weights, the weighted activation
// (bit for bit activation_grad's), and the gather of each row's partial
// sums into its choice.
TEST(CpuTrainParts, FusedDgradPartsMatchActivationGrad) {
  constexpr int64_t kTokens = 4, kTopK = 2, kRows = 8, kN = 8, kParts = 3;
  auto engine = compile(R"(
func.func @parts(%src: tensor<4x8xbf16>, %rows: tensor<4x2xi32>,
                 %w: tensor<4x2xf32>, %off: tensor<3xi32>,
                 %h: tensor<8x16xbf16>, %g: tensor<8x8xbf16>,
                 %dots: tensor<8x3xf32>)
    -> (tensor<8x8xbf16>, tensor<8xf32>, tensor<8x8xbf16>, tensor<8x8xbf16>,
        tensor<4x2xf32>) attributes {llvm.emit_c_interface} {
  %s, %rw = moe.scatter %src, %rows offsets %off weights %w
      : (tensor<4x8xbf16>, tensor<4x2xi32>, tensor<3xi32>, tensor<4x2xf32>)
      -> (tensor<8x8xbf16>, tensor<8xf32>)
  %aw = moe.activation %h row_weights %rw
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<8x16xbf16>, tensor<8xf32>) -> tensor<8x8xbf16>
  %dh, %aw2, %dw = moe.activation_grad %g, %h rows(%rows, %w)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<8x8xbf16>, tensor<8x16xbf16>, tensor<4x2xi32>, tensor<4x2xf32>)
      -> (tensor<8x16xbf16>, tensor<8x8xbf16>, tensor<4x2xf32>)
  %sum = moe.gather_dot %dots rows %rows
      : (tensor<8x3xf32>, tensor<4x2xi32>) -> tensor<4x2xf32>
  return %s, %rw, %aw, %aw2, %sum : tensor<8x8xbf16>, tensor<8xf32>,
      tensor<8x8xbf16>, tensor<8x8xbf16>, tensor<4x2xf32>
}
)");
  ASSERT_TRUE(engine);
  std::mt19937 rng(7);
  Input src = randomInput(rng, {kTokens, kN}, 1.0);
  Input h = randomInput(rng, {kRows, 2 * kN}, 1.0);
  Input g = randomInput(rng, {kRows, kN}, 1.0);
  Input w = randomInput(rng, {kTokens, kTopK}, 1.0, /*isF32=*/true);
  Input dots = randomInput(rng, {kRows, kParts}, 1.0, /*isF32=*/true);
  // Seven choices over eight rows of two experts; one id out of range, and
  // row 5 no choice's.
  std::vector<int32_t> rows = {0, 4, 1, -1, 6, 2, 3, 7};
  std::vector<int32_t> offsets = {0, 4, 8};
  std::vector<uint16_t> scattered(kRows * kN, 0xFFFF), aw(kRows * kN, 0xFFFF),
      aw2(kRows * kN, 0xFFFF);
  std::vector<float> rowWeights(kRows, NAN), sums(kTokens * kTopK, NAN);
  ASSERT_TRUE(call(*engine, "parts",
                   {{src.bf16.data(), {kTokens, kN}},
                    {rows.data(), {kTokens, kTopK}},
                    {w.f32.data(), {kTokens, kTopK}},
                    {offsets.data(), {3}},
                    {h.bf16.data(), {kRows, 2 * kN}},
                    {g.bf16.data(), {kRows, kN}},
                    {dots.f32.data(), {kRows, kParts}},
                    {scattered.data(), {kRows, kN}},
                    {rowWeights.data(), {kRows}},
                    {aw.data(), {kRows, kN}},
                    {aw2.data(), {kRows, kN}},
                    {sums.data(), {kTokens, kTopK}}}));
  for (int64_t row = 0; row < kRows; ++row) {
    auto choice = std::find(rows.begin(), rows.end(), row);
    if (choice == rows.end()) {
      EXPECT_EQ(rowWeights[row], 0.0f) << row;
      continue;
    }
    int64_t c = choice - rows.begin();
    EXPECT_EQ(rowWeights[row], w.f32[c]) << row;
    for (int64_t j = 0; j < kN; ++j)
      EXPECT_EQ(scattered[row * kN + j], src.bf16[c / kTopK * kN + j]);
  }
  // The weighted activation is activation_grad's, bit for bit (padding
  // rows: zero either way).
  for (int64_t i = 0; i < kRows * kN; ++i) {
    if (i / kN == 5)
      EXPECT_EQ(fromBF16(aw[i]), 0.0) << i;
    else
      EXPECT_EQ(aw[i], aw2[i]) << i;
  }
  for (int64_t c = 0; c < kTokens * kTopK; ++c) {
    float expected = 0.0f;
    if (rows[c] >= 0)
      for (int64_t p = 0; p < kParts; ++p)
        expected += dots.f32[rows[c] * kParts + p];
    EXPECT_EQ(sums[c], expected) << c;
  }
}

// The same parts for an expert-parallel backward's rows, whose weights come
// a row ([R, 1]) from the exchange: the weighted activation equals the one
// with the weights laid out [R], and each row's weight gradient is the sum
// of its own partials.
TEST(CpuTrainParts, RowGatePartsMatchTheScattersLayout) {
  constexpr int64_t kRows = 5, kN = 8, kParts = 3;
  auto engine = compile(R"(
func.func @parts(%h: tensor<5x16xbf16>, %w: tensor<5x1xf32>,
                 %w1: tensor<5xf32>, %dots: tensor<5x3xf32>)
    -> (tensor<5x8xbf16>, tensor<5x8xbf16>, tensor<5x1xf32>)
    attributes {llvm.emit_c_interface} {
  %a = moe.activation %h row_weights %w
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<5x16xbf16>, tensor<5x1xf32>) -> tensor<5x8xbf16>
  %a1 = moe.activation %h row_weights %w1
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<5x16xbf16>, tensor<5xf32>) -> tensor<5x8xbf16>
  %sum = moe.gather_dot %dots : (tensor<5x3xf32>) -> tensor<5x1xf32>
  return %a, %a1, %sum : tensor<5x8xbf16>, tensor<5x8xbf16>, tensor<5x1xf32>
}
)");
  ASSERT_TRUE(engine);
  std::mt19937 rng(11);
  Input h = randomInput(rng, {kRows, 2 * kN}, 1.0);
  Input w = randomInput(rng, {kRows, 1}, 1.0, /*isF32=*/true);
  Input dots = randomInput(rng, {kRows, kParts}, 1.0, /*isF32=*/true);
  std::vector<uint16_t> a(kRows * kN, 0xFFFF), a1(kRows * kN, 0xFFFF);
  std::vector<float> sums(kRows, NAN);
  ASSERT_TRUE(call(*engine, "parts",
                   {{h.bf16.data(), {kRows, 2 * kN}},
                    {w.f32.data(), {kRows, 1}},
                    {w.f32.data(), {kRows}},
                    {dots.f32.data(), {kRows, kParts}},
                    {a.data(), {kRows, kN}},
                    {a1.data(), {kRows, kN}},
                    {sums.data(), {kRows, 1}}}));
  for (int64_t i = 0; i < kRows * kN; ++i) {
    EXPECT_EQ(a[i], a1[i]) << i;
    EXPECT_NE(a[i], 0xFFFF) << i;
  }
  for (int64_t r = 0; r < kRows; ++r) {
    float expected = 0.0f;
    for (int64_t p = 0; p < kParts; ++p)
      expected += dots.f32[r * kParts + p];
    EXPECT_EQ(sums[r], expected) << r;
  }
}
