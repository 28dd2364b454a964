//===- CpuBackendTest.cpp - CPU reference backend vs float64 layers -------===//
//
// Each router, activation and shared-expert variant is decomposed, lowered by
// the CPU backend, JIT-compiled and run on random inputs at several token
// counts; the output must match the float64 reference of test/reference.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "test/unit/CpuJit.h"
#include "test/unit/Layers.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "test/reference/Layer.h"
#include "test/reference/Quantize.h"

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
using namespace ::moe::test;

namespace {
class CpuBackendTest : public ::testing::TestWithParam<LayerCase> {};

} // namespace

TEST_P(CpuBackendTest, MatchesTheFloat64Reference) {
  const LayerCase &tc = GetParam();
  const LayerConfig &c = tc.config;
  int64_t h = c.hidden;

  // The layer, its arguments in ABI order.
  std::mt19937 rng(1234);
  std::vector<std::pair<std::string, Input>> weights = layerWeights(tc, rng);
  std::string source = layerSource(tc, weights);

  auto engine = compile(source);
  ASSERT_TRUE(engine) << source;

  for (int64_t tokens : {0, 1, 37}) {
    Input hidden = randomInput(rng, {tokens, h}, 1.0);
    std::vector<uint16_t> output(tokens * h, 0x7FC0); // poisoned: NaN

    std::vector<Buffer> buffers = {{hidden.bf16.data(), hidden.shape}};
    for (auto &[name, in] : weights)
      buffers.push_back({in.isF32 ? static_cast<void *>(in.f32.data())
                                  : static_cast<void *>(in.bf16.data()),
                         in.shape});
    buffers.push_back({output.data(), {tokens, h}});
    ASSERT_TRUE(call(*engine, "layer", buffers));

    ::moe::ref::LayerTensors t;
    t.hiddenStates = hidden.values;
    for (auto &[name, in] : weights) {
      *referenceSlot(t, name) = in.values;
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
    // bf16: the backend rounds to bf16 four times on the way (activation,
    // expert rows, shared output, result), each within 2^-9 relative; f32
    // versus f64 accumulation adds far less. 1e-2 leaves room for that and
    // nothing like a wrong expert or weight. FP8: E4M3 keeps 3 mantissa
    // bits, so each quantized operand is off by up to 2^-4 relative (about
    // 3.6% RMS); four quantized operands (two per matmul) give about
    // sqrt(4) x 3.6% = 7%, which is what runs show. 0.15 is twice that and
    // still far from a wrong expert or scale (errors near 100%).
    double bound = tc.quant.empty() ? 1e-2 : 0.15;
    EXPECT_LT(relative, bound) << tc.name << " at " << tokens << " tokens";
    std::printf("%s, %ld tokens: relative error %.2e\n", tc.name,
                static_cast<long>(tokens), relative);
  }
}

static std::vector<LayerCase> cases() {
  std::vector<LayerCase> all = modelLayers();
  LayerCase mixtral = all[0], qwen2 = all[1], deepseek = all[2];
  all.push_back(
      {"mixtral_mxfp8", mixtral.config, false, false, "<kind = mxfp8>"});
  all.push_back({"qwen2_moe_mxfp8_ceil", qwen2.config, false, false,
                 "<kind = mxfp8, rounding = ceil>"});
  all.push_back({"deepseek_v3_fp8_block128", deepseek.config, true, false,
                 "<kind = fp8_block128>"});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Layers, CpuBackendTest, ::testing::ValuesIn(cases()),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

namespace {
/// Wide-range values with the awkward ones quantizers get wrong: zeros,
/// exact 448s, values past 448, tiny values, NaN and infinities.
std::vector<float> awkwardMatrix(std::mt19937 &rng, int64_t rows,
                                 int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> m(rows * cols);
  for (float &v : m)
    v = std::ldexp(normal(rng), exponent(rng) / 3);
  for (int64_t c = 0; c < cols; ++c) {
    m[0 * cols + c] = 0.0f;
    m[1 * cols + c] = c % 2 ? 448.0f : -448.0f;
    m[2 * cols + c] = 464.0f + c;
    m[3 * cols + c] = std::ldexp(1.0f, -130) * (c + 1);
  }
  m[4 * cols + 5] = std::nanf("");
  m[5 * cols + 40] = INFINITY;
  m[6 * cols + 70] = -INFINITY;
  return m;
}

std::string quantizeSource(const std::string &shape, const std::string &data,
                           const std::string &scales,
                           const std::string &scheme) {
  return "func.func @q(%x: tensor<" + shape + "xf32>) -> (tensor<" + data +
         "xf8E4M3FN>, tensor<" + scales +
         ">) attributes {llvm.emit_c_interface} {\n"
         "  %d, %s = moe.quantize %x {scheme = #moe.quant<" +
         scheme + ">} : (tensor<" + shape + "xf32>) -> (tensor<" + data +
         "xf8E4M3FN>, tensor<" + scales + ">)\n  return %d, %s : tensor<" +
         data + "xf8E4M3FN>, tensor<" + scales + ">\n}\n";
}
/// Expert `expert`'s codes and scales, `data` and `scales` from their
/// first, are the reference's of its [rows, cols] matrix `slice` in 128 x
/// 128 blocks (NaN scales alike).
void expectBlocksOf(const std::vector<float> &slice, int64_t rows, int64_t cols,
                    const uint8_t *data, const float *scales, int64_t expert) {
  auto ref = ::moe::ref::quantizeFP8Block128(slice, rows, cols, 128);
  EXPECT_TRUE(std::equal(ref.data.begin(), ref.data.end(), data))
      << "expert " << expert;
  for (size_t i = 0; i < ref.f32Scales.size(); ++i)
    EXPECT_TRUE(scales[i] == ref.f32Scales[i] ||
                (std::isnan(scales[i]) && std::isnan(ref.f32Scales[i])))
        << "expert " << expert << " block " << i;
}
} // namespace

// The backend's quantizers equal the reference ones bit for bit, which are
// themselves checked against ml_dtypes (test/reference).
TEST(CpuBackendQuantize, MatchesTheReferenceQuantizersBitForBit) {
  std::mt19937 rng(7);
  int64_t rows = 37, cols = 100;
  std::vector<float> m = awkwardMatrix(rng, rows, cols);
  using ::moe::ref::ScaleRounding;
  for (auto [scheme, rounding] :
       {std::pair<const char *, ScaleRounding>{"kind = mxfp8",
                                               ScaleRounding::Floor},
        {"kind = mxfp8, rounding = ceil", ScaleRounding::Ceil}}) {
    auto engine =
        compile(quantizeSource("?x100", "?x100", "?x4xf8E8M0FNU", scheme));
    ASSERT_TRUE(engine);
    std::vector<uint8_t> data(rows * cols, 0xAA), scales(rows * 4, 0xAA);
    ASSERT_TRUE(call(*engine, "q",
                     {{m.data(), {rows, cols}},
                      {data.data(), {rows, cols}},
                      {scales.data(), {rows, 4}}}));
    auto expected = ::moe::ref::quantizeMXFP8(m, rows, cols, rounding);
    EXPECT_EQ(data, expected.data) << scheme;
    EXPECT_EQ(scales, expected.e8m0) << scheme;
  }

  // FP8 block-128: activations in 1 x 128 blocks...
  auto act = compile(
      quantizeSource("?x100", "?x100", "?x1xf32", "kind = fp8_block128"));
  ASSERT_TRUE(act);
  std::vector<uint8_t> data(rows * cols);
  std::vector<float> scales(rows);
  ASSERT_TRUE(call(*act, "q",
                   {{m.data(), {rows, cols}},
                    {data.data(), {rows, cols}},
                    {scales.data(), {rows, 1}}}));
  auto expected = ::moe::ref::quantizeFP8Block128(m, rows, cols, 1);
  EXPECT_EQ(data, expected.data);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(scales[r] == expected.f32Scales[r] ||
                (std::isnan(scales[r]) && std::isnan(expected.f32Scales[r])))
        << r;

  // ...and weights [experts, N, K] in 128 x 128 blocks.
  int64_t experts = 2, n = 130, k = 300;
  std::vector<float> w = awkwardMatrix(rng, experts * n, k);
  auto weight = compile(quantizeSource("2x130x300", "2x130x300", "2x2x3xf32",
                                       "kind = fp8_block128"));
  ASSERT_TRUE(weight);
  std::vector<uint8_t> wData(experts * n * k);
  std::vector<float> wScales(experts * 2 * 3);
  ASSERT_TRUE(call(*weight, "q",
                   {{w.data(), {experts, n, k}},
                    {wData.data(), {experts, n, k}},
                    {wScales.data(), {experts, 2, 3}}}));
  for (int64_t x = 0; x < experts; ++x)
    expectBlocksOf(
        std::vector<float>(w.begin() + x * n * k, w.begin() + (x + 1) * n * k),
        n, k, wData.data() + x * n * k, wScales.data() + x * 6, x);
}

TEST(CpuBackendQuantize, DequantizeInvertsTheCodes) {
  std::vector<uint8_t> data(256);
  for (int i = 0; i < 256; ++i)
    data[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> scales = {127 - 3, 127 + 2, 0, 0xFF, 127, 127, 127, 127};
  auto engine = compile(
      "func.func @dq(%d: tensor<1x256xf8E4M3FN>, %s: tensor<1x8xf8E8M0FNU>) "
      "-> tensor<1x256xf32> attributes {llvm.emit_c_interface} {\n"
      "  %r = moe.dequantize %d, %s {scheme = #moe.quant<kind = mxfp8>} : "
      "(tensor<1x256xf8E4M3FN>, tensor<1x8xf8E8M0FNU>) -> tensor<1x256xf32>\n"
      "  return %r : tensor<1x256xf32>\n}\n");
  ASSERT_TRUE(engine);
  std::vector<float> out(256);
  ASSERT_TRUE(call(*engine, "dq",
                   {{data.data(), {1, 256}},
                    {scales.data(), {1, 8}},
                    {out.data(), {1, 256}}}));
  for (int i = 0; i < 256; ++i) {
    double expected = ::moe::ref::decodeE4M3(data[i]) *
                      ::moe::ref::decodeE8M0(scales[i / 32]);
    if (std::isnan(expected))
      EXPECT_TRUE(std::isnan(out[i])) << i;
    else
      EXPECT_EQ(out[i], static_cast<float>(expected)) << i;
  }
}

// A quantize with `transpose` gives the codes and scales of its input's
// transpose (a dgrad's weights, quantized along N), partial blocks too.
TEST(CpuBackendQuantize, TransposedQuantizeQuantizesTheTranspose) {
  std::mt19937 rng(5);
  int64_t experts = 2, n = 130, k = 300;
  std::vector<float> w = awkwardMatrix(rng, experts * n, k);
  auto engine = compile(
      "func.func @q(%x: tensor<2x130x300xf32>) -> (tensor<2x300x130xf8E4M3FN>, "
      "tensor<2x3x2xf32>) attributes {llvm.emit_c_interface} {\n"
      "  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>, "
      "transpose} : (tensor<2x130x300xf32>) -> (tensor<2x300x130xf8E4M3FN>, "
      "tensor<2x3x2xf32>)\n"
      "  return %d, %s : tensor<2x300x130xf8E4M3FN>, tensor<2x3x2xf32>\n}\n");
  ASSERT_TRUE(engine);
  std::vector<uint8_t> data(experts * n * k, 0xAA);
  std::vector<float> scales(experts * 6, -1.0f);
  ASSERT_TRUE(call(*engine, "q",
                   {{w.data(), {experts, n, k}},
                    {data.data(), {experts, k, n}},
                    {scales.data(), {experts, 3, 2}}}));
  for (int64_t x = 0; x < experts; ++x) {
    std::vector<float> t(k * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        t[j * n + i] = w[(x * n + i) * k + j];
    expectBlocksOf(t, k, n, data.data() + x * n * k, scales.data() + x * 6, x);
  }
}

// Quantized both ways, the codes and scales are the input's and its
// transpose's, each as a quantize of its own gives them.
TEST(CpuBackendQuantize, BothWaysQuantizesTheInputAndItsTranspose) {
  std::mt19937 rng(6);
  int64_t experts = 2, n = 130, k = 300;
  std::vector<float> w = awkwardMatrix(rng, experts * n, k);
  auto engine = compile(
      "func.func @q(%x: tensor<2x130x300xf32>) -> (tensor<2x130x300xf8E4M3FN>, "
      "tensor<2x2x3xf32>, tensor<2x300x130xf8E4M3FN>, tensor<2x3x2xf32>) "
      "attributes {llvm.emit_c_interface} {\n"
      "  %d, %s, %t:2 = moe.quantize %x {scheme = #moe.quant<kind = "
      "fp8_block128>} : (tensor<2x130x300xf32>) -> (tensor<2x130x300xf8E4M3FN>,"
      " tensor<2x2x3xf32>, tensor<2x300x130xf8E4M3FN>, tensor<2x3x2xf32>)\n"
      "  return %d, %s, %t#0, %t#1 : tensor<2x130x300xf8E4M3FN>, "
      "tensor<2x2x3xf32>, tensor<2x300x130xf8E4M3FN>, tensor<2x3x2xf32>\n}\n");
  ASSERT_TRUE(engine);
  std::vector<uint8_t> data(experts * n * k, 0xAA), tData(data);
  std::vector<float> scales(experts * 6, -1.0f), tScales(scales);
  ASSERT_TRUE(call(*engine, "q",
                   {{w.data(), {experts, n, k}},
                    {data.data(), {experts, n, k}},
                    {scales.data(), {experts, 2, 3}},
                    {tData.data(), {experts, k, n}},
                    {tScales.data(), {experts, 3, 2}}}));
  for (int64_t x = 0; x < experts; ++x) {
    std::vector<float> plain(w.begin() + x * n * k,
                             w.begin() + (x + 1) * n * k);
    expectBlocksOf(plain, n, k, data.data() + x * n * k, scales.data() + x * 6,
                   x);
    std::vector<float> t(k * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        t[j * n + i] = w[(x * n + i) * k + j];
    expectBlocksOf(t, k, n, tData.data() + x * n * k, tScales.data() + x * 6,
                   x);
  }
}

// An E4M3 weight gradient quantizes each expert's rows in blocks of 128
// from its first, each column of a block with its own scale (its values
// times the scale's reciprocal, in f32, to E4M3), and sums each
// block's product of the codes times its two columns' scales; rows of codes
// with 1 x 128 scales are taken as the values they stand for first.
TEST(CpuBackendQuantize, FP8WgradQuantizesEachExpertsRowsAlongTheRows) {
  std::mt19937 rng(13);
  int64_t experts = 3, n = 20, k = 33, rows = 140;
  // Expert 0 takes a full block and a partial one; row 130 is no expert's.
  std::vector<int32_t> counts = {130, 0, 9}, offsets = {0, 131, 131, 140};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6), code(0, 0x7E), sign(0, 1);
  std::vector<float> dy(rows * n), x(rows * k), xScales(rows);
  std::vector<uint8_t> xCodes(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < n; ++c)
      dy[r * n + c] = std::ldexp(normal(rng), exponent(rng));
    for (int64_t c = 0; c < k; ++c) {
      x[r * k + c] = std::ldexp(normal(rng), exponent(rng));
      xCodes[r * k + c] = static_cast<uint8_t>(code(rng) | (sign(rng) << 7));
    }
    xScales[r] = std::ldexp(1.0f + normal(rng) * 0.1f, exponent(rng));
  }
  // Column c of rows [from, from + count) of a [rows, cols] matrix, as the
  // values its block's codes stand for, and its scale.
  auto columns = [&](const std::vector<float> &m, int64_t cols, int64_t from,
                     int64_t count, std::vector<double> &values,
                     std::vector<double> &scales) {
    values.assign(cols * count, 0.0);
    scales.assign(cols, 0.0);
    for (int64_t c = 0; c < cols; ++c) {
      float amax = 0.0f;
      for (int64_t r = 0; r < count; ++r)
        amax = std::max(amax, std::fabs(m[(from + r) * cols + c]));
      float scale = std::max(amax, 1e-4f) / 448.0f, inverse = 1.0f / scale;
      scales[c] = scale;
      for (int64_t r = 0; r < count; ++r)
        values[c * count + r] = ::moe::ref::decodeE4M3(
            ::moe::ref::encodeE4M3(m[(from + r) * cols + c] * inverse));
    }
  };
  // The sums and the sums of their terms' magnitudes (what f32 rounding
  // is relative to).
  std::vector<double> magnitude(experts * n * k);
  auto expected = [&](const std::vector<float> &lhs) {
    std::vector<double> out(experts * n * k, 0.0);
    std::fill(magnitude.begin(), magnitude.end(), 0.0);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t from = offsets[e]; from < offsets[e] + counts[e];
           from += 128) {
        int64_t count = std::min<int64_t>(128, offsets[e] + counts[e] - from);
        std::vector<double> qy, sy, qx, sx;
        columns(dy, n, from, count, qy, sy);
        columns(lhs, k, from, count, qx, sx);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < k; ++c) {
            double sum = 0.0, size = 0.0;
            for (int64_t r = 0; r < count; ++r) {
              sum += qy[i * count + r] * qx[c * count + r];
              size += std::fabs(qy[i * count + r] * qx[c * count + r]);
            }
            out[(e * n + i) * k + c] += sum * sy[i] * sx[c];
            magnitude[(e * n + i) * k + c] += size * sy[i] * sx[c];
          }
      }
    return out;
  };
  auto source = [&](bool codes) {
    std::string lhsType = codes ? "f8E4M3FN" : "f32";
    std::string args = "%dy: tensor<?x20xf32>, %x: tensor<?x33x" + lhsType +
                       ">, %c: tensor<3xi32>, %o: tensor<4xi32>";
    std::string operandTypes = "tensor<?x20xf32>, tensor<?x33x" + lhsType +
                               ">, tensor<3xi32>, tensor<4xi32>";
    if (codes) {
      args += ", %s: tensor<?x1xf32>";
      operandTypes += ", tensor<?x1xf32>";
    }
    return "func.func @w(" + args +
           ") -> tensor<3x20x33xf32> attributes {llvm.emit_c_interface} {\n"
           "  %r = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) " +
           (codes ? std::string("scale %s ") : std::string()) +
           "{quant = #moe.quant<kind = fp8_block128>} : (" + operandTypes +
           ") -> tensor<3x20x33xf32>\n  return %r : tensor<3x20x33xf32>\n}\n";
  };
  for (bool codes : {false, true}) {
    auto engine = compile(source(codes));
    ASSERT_TRUE(engine) << codes;
    std::vector<float> out(experts * n * k, -1.0f);
    std::vector<Buffer> args = {{dy.data(), {rows, n}}};
    if (codes)
      args.push_back({xCodes.data(), {rows, k}});
    else
      args.push_back({x.data(), {rows, k}});
    args.push_back({counts.data(), {experts}});
    args.push_back({offsets.data(), {experts + 1}});
    if (codes)
      args.push_back({xScales.data(), {rows, 1}});
    args.push_back({out.data(), {experts, n, k}});
    ASSERT_TRUE(call(*engine, "w", args));
    std::vector<float> lhs = x;
    if (codes)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c)
          lhs[r * k + c] = static_cast<float>(
              ::moe::ref::decodeE4M3(xCodes[r * k + c]) * xScales[r]);
    std::vector<double> want = expected(lhs);
    for (int64_t i = 0; i < experts * n * k; ++i)
      EXPECT_NEAR(out[i], want[i], 1e-6 * magnitude[i] + 1e-12)
          << "codes " << codes << " at " << i;
  }
}

// An FP8 grouped matmul equals the float64 product of the decoded operands
// to f32 accumulation accuracy, for both scale layouts.
TEST(CpuBackendQuantize, FP8GroupedMatmulMatchesFloat64) {
  std::mt19937 rng(11);
  int64_t experts = 3, n = 40, k = 300, rows = 20;
  std::vector<int32_t> counts = {7, 0, 11}, offsets = {0, 8, 8, 20};
  std::uniform_int_distribution<int> code(0, 0x7E), sign(0, 1);
  auto codes = [&](int64_t count) {
    std::vector<uint8_t> v(count);
    for (uint8_t &c : v)
      c = static_cast<uint8_t>(code(rng) | (sign(rng) << 7));
    return v;
  };
  std::vector<uint8_t> a = codes(rows * k), b = codes(experts * n * k);
  for (auto [scaleType, kBlock, squareRhs] :
       {std::tuple<const char *, int64_t, bool>{"f8E8M0FNU", 32, false},
        {"f32", 128, false},
        {"f32", 128, true}}) {
    int64_t kBlocks = (k + kBlock - 1) / kBlock;
    int64_t rhsScaleRows = squareRhs ? (n + 127) / 128 : n;
    bool e8m0 = std::string(scaleType) == "f8E8M0FNU";
    std::uniform_int_distribution<int> exponent(120, 134);
    std::uniform_real_distribution<float> real(0.01f, 2.0f);
    std::vector<uint8_t> aScale8(rows * kBlocks),
        bScale8(experts * rhsScaleRows * kBlocks);
    std::vector<float> aScale32(aScale8.size()), bScale32(bScale8.size());
    for (auto *v : {&aScale8, &bScale8})
      for (uint8_t &s : *v)
        s = static_cast<uint8_t>(exponent(rng));
    for (auto *v : {&aScale32, &bScale32})
      for (float &s : *v)
        s = real(rng);
    auto scaleAt = [&](bool lhs, int64_t i) -> double {
      return e8m0 ? ::moe::ref::decodeE8M0(lhs ? aScale8[i] : bScale8[i])
                  : (lhs ? aScale32[i] : bScale32[i]);
    };
    auto t = [](std::vector<int64_t> shape, const std::string &element) {
      std::string text = "tensor<";
      for (int64_t d : shape)
        text += (d < 0 ? std::string("?") : std::to_string(d)) + "x";
      return text + element + ">";
    };
    std::string types = t({-1, k}, "f8E4M3FN") + ", " +
                        t({experts, n, k}, "f8E4M3FN") + ", " +
                        t({experts}, "i32") + ", " + t({experts + 1}, "i32") +
                        ", " + t({-1, kBlocks}, scaleType) + ", " +
                        t({experts, rhsScaleRows, kBlocks}, scaleType);
    std::string source =
        "func.func @mm(%a: " + t({-1, k}, "f8E4M3FN") +
        ", %b: " + t({experts, n, k}, "f8E4M3FN") +
        ", %c: " + t({experts}, "i32") + ", %o: " + t({experts + 1}, "i32") +
        ", %as: " + t({-1, kBlocks}, scaleType) +
        ", %bs: " + t({experts, rhsScaleRows, kBlocks}, scaleType) + ") -> " +
        t({-1, n}, "f32") + " attributes {llvm.emit_c_interface} {\n" +
        "  %y = moe.grouped_matmul %a, %b groups(%c, %o) scales(%as, %bs) : (" +
        types + ") -> " + t({-1, n}, "f32") +
        "\n  return %y : " + t({-1, n}, "f32") + "\n}\n";
    auto engine = compile(source);
    ASSERT_TRUE(engine) << source;
    std::vector<float> out(rows * n, NAN);
    void *as = e8m0 ? static_cast<void *>(aScale8.data()) : aScale32.data();
    void *bs = e8m0 ? static_cast<void *>(bScale8.data()) : bScale32.data();
    ASSERT_TRUE(call(*engine, "mm",
                     {{a.data(), {rows, k}},
                      {b.data(), {experts, n, k}},
                      {counts.data(), {experts}},
                      {offsets.data(), {experts + 1}},
                      {as, {rows, kBlocks}},
                      {bs, {experts, rhsScaleRows, kBlocks}},
                      {out.data(), {rows, n}}}));
    double diff = 0, norm = 0;
    for (int64_t r = 0; r < rows; ++r) {
      // Rows 7 and 19 are alignment padding.
      int64_t x = r < 7 ? 0 : (r >= 8 && r < 19 ? 2 : -1);
      for (int64_t c = 0; c < n; ++c) {
        double expected = 0;
        if (x >= 0)
          for (int64_t kk = 0; kk < k; ++kk) {
            int64_t kb = kk / kBlock;
            int64_t sr = squareRhs ? c / 128 : c;
            expected += ::moe::ref::decodeE4M3(a[r * k + kk]) *
                        ::moe::ref::decodeE4M3(b[(x * n + c) * k + kk]) *
                        scaleAt(true, r * kBlocks + kb) *
                        scaleAt(false, (x * rhsScaleRows + sr) * kBlocks + kb);
          }
        diff += (out[r * n + c] - expected) * (out[r * n + c] - expected);
        norm += expected * expected;
      }
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-6) << scaleType;
  }
}
