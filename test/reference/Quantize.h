//===- Quantize.h - reference FP8 quantizers --------------------*- C++ -*-===//
//
// The numerics every backend's moe.quantize must reproduce bit for bit,
// written plainly (docs/numerics.md explains each choice). Tests check these
// against ml_dtypes and compiled layers against these.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_REFERENCE_QUANTIZE_H
#define MOE_TEST_REFERENCE_QUANTIZE_H

#include <cstdint>
#include <vector>

namespace moe::ref {

/// E4M3 (f8E4M3FN) of `value`: round to nearest, ties to even; magnitudes
/// above 448 saturate to 448, infinities too; NaN gives 0x7F (sign kept).
uint8_t encodeE4M3(double value);
double decodeE4M3(uint8_t code);

/// E8M0 code of 2^exponent, exponent clamped to [-127, 127]; 0xFF is NaN.
uint8_t encodeE8M0(int exponent);
/// 2^(code - 127), NaN for 0xFF.
double decodeE8M0(uint8_t code);

enum class ScaleRounding { Floor, Ceil };

/// The power-of-two exponent of an MXFP8 block whose largest magnitude is
/// `amax`: floor(log2(amax)) - 8 (OCP MX v1.0), or the least e with
/// amax <= 448 * 2^e (ceil); -127 for an all-zero block.
int mxScaleExponent(float amax, ScaleRounding rounding);

/// A quantized [rows, cols] matrix: E4M3 codes and one scale per block.
struct Quantized {
  std::vector<uint8_t> data;    // rows * cols E4M3 codes.
  std::vector<uint8_t> e8m0;    // MXFP8: rows * ceil(cols / 32) codes.
  std::vector<float> f32Scales; // FP8 block-128: one per block.
};

/// MXFP8 along each row: 32-element blocks (the last may be partial), E8M0
/// scale 2^e, elements E4M3(x / 2^e). A block holding NaN or an infinity
/// gets the NaN scale 0xFF.
Quantized quantizeMXFP8(const std::vector<float> &matrix, int64_t rows,
                        int64_t cols, ScaleRounding rounding);

/// FP8 block-128 as DeepSeek-V3: scale = max(amax, 1e-4) / 448 in f32,
/// elements E4M3(x / scale) with the division in f32. `blockRows` is 1 for
/// activations (1 x 128 blocks) and 128 for weights (128 x 128 blocks).
Quantized quantizeFP8Block128(const std::vector<float> &matrix, int64_t rows,
                              int64_t cols, int64_t blockRows);

} // namespace moe::ref

#endif // MOE_TEST_REFERENCE_QUANTIZE_H
