//===- QuantizeTest.cpp - reference quantizers on hand-computed values ----===//

#include "test/reference/Quantize.h"

#include <cmath>
#include <gtest/gtest.h>
#include <limits>

using namespace moe::ref;

TEST(E4M3, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(encodeE4M3(0.0), 0x00);
  EXPECT_EQ(encodeE4M3(-0.0), 0x80);
  EXPECT_EQ(encodeE4M3(1.0), 0x38);    // exponent 7 + bias 7, mantissa 0
  EXPECT_EQ(encodeE4M3(-1.5), 0xBC);   // sign, exponent 7, mantissa 4
  EXPECT_EQ(encodeE4M3(1.0625), 0x38); // tie of 1.0 and 1.125: even
  EXPECT_EQ(encodeE4M3(1.1875), 0x3A); // tie of 1.125 and 1.25: even
  EXPECT_EQ(encodeE4M3(std::ldexp(1.0, -6)), 0x08);   // least normal
  EXPECT_EQ(encodeE4M3(std::ldexp(1.0, -9)), 0x01);   // least subnormal
  EXPECT_EQ(encodeE4M3(std::ldexp(1.0, -10)), 0x00);  // tie of 0 and 2^-9
  EXPECT_EQ(encodeE4M3(std::ldexp(3.0, -10)), 0x02);  // tie of 1 and 2 steps
  EXPECT_EQ(encodeE4M3(std::ldexp(15.5, -10)), 0x08); // rounds up to normal
  EXPECT_EQ(encodeE4M3(448.0), 0x7E);
  EXPECT_EQ(encodeE4M3(-448.0), 0xFE);
  EXPECT_EQ(encodeE4M3(464.0), 0x7E); // past the largest value: saturates
  EXPECT_EQ(encodeE4M3(1e30), 0x7E);
  EXPECT_EQ(encodeE4M3(-std::numeric_limits<double>::infinity()), 0xFE);
  EXPECT_EQ(encodeE4M3(std::nan("")), 0x7F);
}

TEST(E4M3, EveryCodeDecodesAndEncodesBack) {
  for (int code = 0; code < 256; ++code) {
    double value = decodeE4M3(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(encodeE4M3(value), code) << value;
  }
  EXPECT_EQ(decodeE4M3(0x7E), 448.0);
  EXPECT_EQ(decodeE4M3(0x01), std::ldexp(1.0, -9));
}

TEST(E8M0, ScaleExponentsFloorAndCeil) {
  EXPECT_EQ(mxScaleExponent(448.0f, ScaleRounding::Floor), 0);
  EXPECT_EQ(mxScaleExponent(448.0f, ScaleRounding::Ceil), 0);
  EXPECT_EQ(mxScaleExponent(449.0f, ScaleRounding::Floor), 0); // saturates
  EXPECT_EQ(mxScaleExponent(449.0f, ScaleRounding::Ceil), 1);
  EXPECT_EQ(mxScaleExponent(1.0f, ScaleRounding::Floor), -8);
  EXPECT_EQ(mxScaleExponent(1.0f, ScaleRounding::Ceil), -8);
  EXPECT_EQ(mxScaleExponent(0.0f, ScaleRounding::Floor), -127);
  EXPECT_EQ(mxScaleExponent(1e-45f, ScaleRounding::Ceil), -127); // clamped
  EXPECT_EQ(mxScaleExponent(3e38f, ScaleRounding::Floor), 119);
  EXPECT_EQ(encodeE8M0(0), 127);
  EXPECT_EQ(encodeE8M0(-200), 0);
  EXPECT_EQ(decodeE8M0(120), std::ldexp(1.0, -7));
  EXPECT_TRUE(std::isnan(decodeE8M0(0xFF)));
}

TEST(MXFP8, QuantizesBlocksOf32) {
  // Row 0: one all-equal block of 3.0 and a partial block of 2 elements.
  // Row 1: a block whose largest value floor rounding saturates.
  std::vector<float> m(2 * 34, 3.0f);
  m[32] = 1.0f;
  m[33] = -0.5f;
  for (int c = 0; c < 34; ++c)
    m[34 + c] = c == 5 ? 500.0f : 1.0f;
  Quantized floor = quantizeMXFP8(m, 2, 34, ScaleRounding::Floor);
  ASSERT_EQ(floor.e8m0.size(), 4u);
  EXPECT_EQ(floor.e8m0[0], 127 - 7); // 3.0: 2^(1 - 8)
  EXPECT_EQ(floor.data[0], 0x7C);    // 3.0 * 2^7 = 384 = 1.5 * 2^8
  EXPECT_EQ(floor.e8m0[1], 127 - 8); // amax 1.0
  EXPECT_EQ(floor.data[33], 0xF0);   // -0.5 * 2^8 = -2^7: sign, exponent 14
  EXPECT_EQ(floor.e8m0[2], 127);     // 500: 2^(8 - 8)
  EXPECT_EQ(floor.data[34 + 5], 0x7E);
  Quantized ceil = quantizeMXFP8(m, 2, 34, ScaleRounding::Ceil);
  EXPECT_EQ(ceil.e8m0[2], 128);       // 500 / 2 = 250 fits
  EXPECT_EQ(ceil.data[34 + 5], 0x78); // 250 rounds to 256 = 2^8
  m[3] = std::nanf("");
  EXPECT_EQ(quantizeMXFP8(m, 2, 34, ScaleRounding::Floor).e8m0[0], 0xFF);
}

TEST(FP8Block128, ScalesLikeDeepSeek) {
  std::vector<float> m(2 * 130, 0.0f);
  m[0] = 448.0f * 2.0f; // amax 896: scale 2
  m[1] = -3.0f;
  Quantized q = quantizeFP8Block128(m, 2, 130, 1);
  ASSERT_EQ(q.f32Scales.size(), 4u);
  EXPECT_EQ(q.f32Scales[0], 2.0f);
  EXPECT_EQ(q.data[0], 0x7E);
  EXPECT_EQ(q.data[1], 0xBC);                // -1.5
  EXPECT_EQ(q.f32Scales[1], 1e-4f / 448.0f); // all-zero block: amax floor
  EXPECT_EQ(q.data[128], 0x00);
  Quantized w = quantizeFP8Block128(m, 2, 130, 128);
  ASSERT_EQ(w.f32Scales.size(), 2u); // one row of 128 x 128 blocks
  EXPECT_EQ(w.f32Scales[0], 2.0f);
}
