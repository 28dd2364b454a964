//===- FP8.cpp - FP8 encodings in the CPU backend -------------------------===//

#include "codegen/common/FP8.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::common;

namespace {
/// i32 helpers; the FP8 formats are easiest to state on f32 bits.
struct Bits {
  Emitter &e;
  Value c(int64_t v) { return e.i32(v); }
  Value of(Value f32) {
    return arith::BitcastOp::create(e.b, e.loc, e.b.getI32Type(), f32);
  }
  Value toF32(Value i32) {
    return arith::BitcastOp::create(e.b, e.loc, e.b.getF32Type(), i32);
  }
  Value andi(Value x, int64_t m) { return e.andi(x, c(m)); }
  Value shr(Value x, int64_t s) {
    return arith::ShRUIOp::create(e.b, e.loc, x, c(s));
  }
  Value shl(Value x, int64_t s) {
    return arith::ShLIOp::create(e.b, e.loc, x, c(s));
  }
  Value sub(Value x, Value y) {
    return arith::SubIOp::create(e.b, e.loc, x, y);
  }
  Value eq(Value x, int64_t v) {
    return e.icmp(arith::CmpIPredicate::eq, x, c(v));
  }
  Value fromI8(Value code) {
    return arith::ExtUIOp::create(e.b, e.loc, e.b.getI32Type(), code);
  }
  Value toI8(Value x) {
    return arith::TruncIOp::create(e.b, e.loc, e.b.getI8Type(), x);
  }
};
} // namespace

Value mlir::moe::common::encodeE4M3(Emitter &e, Value value) {
  Bits bits{e};
  Value raw = bits.of(value);
  Value sign = bits.andi(bits.shr(raw, 24), 0x80);
  Value magnitude = bits.toF32(bits.andi(raw, 0x7FFFFFFF));
  Value isNan = arith::CmpFOp::create(e.b, e.loc, arith::CmpFPredicate::UNO,
                                      magnitude, magnitude);
  if (e.nativeE4M3)
    return e.select(isNan, bits.toI8(e.ori(sign, bits.c(0x7F))),
                    e.nativeE4M3(e, value));
  Value clamped = e.minf(magnitude, e.f32(448.0));
  // Normal: round the 23-bit mantissa to 3 bits, ties to even, on the bits;
  // a carry moves into the exponent, and E4M3's bias is 120 below f32's.
  Value m = bits.of(clamped);
  Value rounded = bits.shr(
      e.iadd(e.iadd(m, bits.c(0x7FFFF)), bits.andi(bits.shr(m, 20), 1)), 20);
  Value normal = bits.sub(rounded, bits.c(120 << 3));
  // Subnormal (below 2^-6): adding 2^14, whose f32 ulp is 2^-9, rounds to
  // E4M3's subnormal step with the FPU's ties-to-even.
  Value snapped = e.sub(e.add(clamped, e.f32(16384.0)), e.f32(16384.0));
  Value subnormal = arith::FPToUIOp::create(e.b, e.loc, e.b.getI32Type(),
                                            e.mul(snapped, e.f32(512.0)));
  Value isNormal = arith::CmpFOp::create(e.b, e.loc, arith::CmpFPredicate::OGE,
                                         clamped, e.f32(0.015625));
  Value code = e.select(isNormal, normal, subnormal);
  code = e.select(isNan, bits.c(0x7F), code);
  return bits.toI8(e.ori(code, sign));
}

Value mlir::moe::common::decodeE4M3(Emitter &e, Value code) {
  Bits bits{e};
  Value u = bits.fromI8(code);
  Value exponent = bits.andi(bits.shr(u, 3), 0xF);
  Value mantissa = bits.andi(u, 0x7);
  Value normal = bits.toF32(e.ori(bits.shl(e.iadd(exponent, bits.c(120)), 23),
                                  bits.shl(mantissa, 20)));
  Value subnormal =
      e.mul(arith::UIToFPOp::create(e.b, e.loc, e.b.getF32Type(), mantissa),
            e.f32(1.0 / 512.0));
  Value magnitude = e.select(bits.eq(exponent, 0), subnormal, normal);
  magnitude =
      e.select(bits.eq(bits.andi(u, 0x7F), 0x7F), e.f32(NAN), magnitude);
  Value negative =
      e.icmp(arith::CmpIPredicate::ne, bits.andi(u, 0x80), bits.c(0));
  return e.select(negative, arith::NegFOp::create(e.b, e.loc, magnitude),
                  magnitude);
}

Value mlir::moe::common::exp2(Emitter &e, Value exponent) {
  Bits bits{e};
  return bits.toF32(bits.shl(e.iadd(exponent, bits.c(127)), 23));
}

Value mlir::moe::common::decodeE8M0(Emitter &e, Value code) {
  Bits bits{e};
  Value u = bits.fromI8(code);
  // Code 0 is 2^-127, an f32 subnormal: bit 22.
  Value value = e.select(bits.eq(u, 0), bits.toF32(bits.c(1 << 22)),
                         bits.toF32(bits.shl(u, 23)));
  return e.select(bits.eq(u, 0xFF), e.f32(NAN), value);
}

Value mlir::moe::common::mxScaleExponent(Emitter &e, Value amax,
                                         ScaleRounding rounding) {
  Bits bits{e};
  Value raw = bits.of(amax);
  // floor(log2(amax)) - 8; a subnormal or zero amax lands below -127.
  Value exponent = bits.sub(bits.shr(raw, 23), bits.c(127 + 8));
  if (rounding == ScaleRounding::Ceil) {
    // amax > 448 * 2^exponent exactly when its significand exceeds 1.75.
    Value above = e.icmp(arith::CmpIPredicate::ugt, bits.andi(raw, 0x7FFFFF),
                         bits.c(0x600000));
    exponent = e.iadd(
        exponent, arith::ExtUIOp::create(e.b, e.loc, e.b.getI32Type(), above));
  }
  Value low = e.icmp(arith::CmpIPredicate::slt, exponent, bits.c(-127));
  exponent = e.select(low, bits.c(-127), exponent);
  Value high = e.icmp(arith::CmpIPredicate::sgt, exponent, bits.c(127));
  return e.select(high, bits.c(127), exponent);
}
