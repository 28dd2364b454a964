//===- Quantize.cpp - reference FP8 quantizers ----------------------------===//

#include "test/reference/Quantize.h"

#include <algorithm>
#include <cmath>

using namespace moe::ref;

static constexpr double kE4M3Max = 448.0;

uint8_t moe::ref::encodeE4M3(double value) {
  uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value))
    return sign | 0x7F;
  double magnitude = std::min(std::fabs(value), kE4M3Max);
  // Below 2^-6 the grid is the subnormal step 2^-9; nearbyint rounds ties to
  // even under the default rounding mode, and code 8 is the least normal.
  if (magnitude < std::ldexp(1.0, -6))
    return sign |
           static_cast<uint8_t>(std::nearbyint(std::ldexp(magnitude, 9)));
  int exponent;
  double fraction = std::frexp(magnitude, &exponent); // [0.5, 1)
  --exponent; // magnitude in [2^e, 2^e+1)
  double mantissa = std::nearbyint((fraction * 2.0 - 1.0) * 8.0);
  if (mantissa == 8.0) {
    mantissa = 0.0;
    ++exponent;
  }
  int code = ((exponent + 7) << 3) | static_cast<int>(mantissa);
  return sign | static_cast<uint8_t>(std::min(code, 0x7E));
}

double moe::ref::decodeE4M3(uint8_t code) {
  double sign = (code & 0x80) ? -1.0 : 1.0;
  int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7)
    return std::nan("");
  if (exponent == 0)
    return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

uint8_t moe::ref::encodeE8M0(int exponent) {
  return static_cast<uint8_t>(std::clamp(exponent, -127, 127) + 127);
}

double moe::ref::decodeE8M0(uint8_t code) {
  return code == 0xFF ? std::nan("") : std::ldexp(1.0, code - 127);
}

int moe::ref::mxScaleExponent(float amax, ScaleRounding rounding) {
  if (amax == 0.0f)
    return -127;
  int exponent;
  std::frexp(amax, &exponent); // amax in [2^(e-1), 2^e)
  int floorLog2 = exponent - 1;
  if (rounding == ScaleRounding::Floor)
    return std::clamp(floorLog2 - 8, -127, 127);
  // The least e with amax <= 448 * 2^e; 448 * 2^e is exact in double.
  int e = floorLog2 - 8;
  while (amax > std::ldexp(kE4M3Max, e))
    ++e;
  while (amax <= std::ldexp(kE4M3Max, e - 1))
    --e;
  return std::clamp(e, -127, 127);
}

Quantized moe::ref::quantizeMXFP8(const std::vector<float> &matrix,
                                  int64_t rows, int64_t cols,
                                  ScaleRounding rounding) {
  int64_t blocks = (cols + 31) / 32;
  Quantized out;
  out.data.resize(rows * cols);
  out.e8m0.resize(rows * blocks);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t begin = b * 32, end = std::min(cols, begin + 32);
      float amax = 0.0f;
      bool special = false;
      for (int64_t c = begin; c < end; ++c) {
        float x = matrix[r * cols + c];
        special |= !std::isfinite(x);
        amax = std::max(amax, std::fabs(x));
      }
      int e = special ? 0 : mxScaleExponent(amax, rounding);
      out.e8m0[r * blocks + b] = special ? 0xFF : encodeE8M0(e);
      for (int64_t c = begin; c < end; ++c) {
        float x = matrix[r * cols + c];
        // NaN scale: elements keep their NaN or saturate, as E4M3 encodes
        // them, so the block decodes to NaN either way.
        out.data[r * cols + c] = encodeE4M3(std::ldexp(double(x), -e));
      }
    }
  }
  return out;
}

Quantized moe::ref::quantizeFP8Block128(const std::vector<float> &matrix,
                                        int64_t rows, int64_t cols,
                                        int64_t blockRows) {
  int64_t rowBlocks = (rows + blockRows - 1) / blockRows;
  int64_t colBlocks = (cols + 127) / 128;
  Quantized out;
  out.data.resize(rows * cols);
  out.f32Scales.resize(rowBlocks * colBlocks);
  for (int64_t rb = 0; rb < rowBlocks; ++rb) {
    for (int64_t cb = 0; cb < colBlocks; ++cb) {
      int64_t r0 = rb * blockRows, r1 = std::min(rows, r0 + blockRows);
      int64_t c0 = cb * 128, c1 = std::min(cols, c0 + 128);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(matrix[r * cols + c]));
      float scale = std::max(amax, 1e-4f) / 448.0f;
      out.f32Scales[rb * colBlocks + cb] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          out.data[r * cols + c] = encodeE4M3(matrix[r * cols + c] / scale);
    }
  }
  return out;
}
