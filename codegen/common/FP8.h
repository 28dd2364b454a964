//===- FP8.h - FP8 encodings in the CPU backend -----------------*- C++ -*-===//
//
// The E4M3 and E8M0 arithmetic of docs/numerics.md as integer and f32 IR, so
// the reference backend quantizes bit for bit like test/reference/Quantize.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_COMMON_FP8_H
#define MOE_CODEGEN_COMMON_FP8_H

#include "codegen/common/Emitter.h"
#include "dialects/moe/MoeDialect.h"

namespace mlir::moe::common {

/// The E4M3 code (i8) of an f32: round to nearest even, magnitudes above 448
/// saturate, NaN gives 0x7F with its sign.
Value encodeE4M3(Emitter &e, Value value);
/// The f32 value of an E4M3 code (i8).
Value decodeE4M3(Emitter &e, Value code);
/// The f32 value 2^(code - 127) of an E8M0 code (i8); NaN for 0xFF.
Value decodeE8M0(Emitter &e, Value code);
/// The MXFP8 scale exponent (i32) of a block whose largest magnitude is the
/// finite, non-negative f32 `amax`, clamped to [-127, 127].
Value mxScaleExponent(Emitter &e, Value amax, ScaleRounding rounding);
/// 2^exponent as f32, for an i32 exponent in [-126, 127].
Value exp2(Emitter &e, Value exponent);

} // namespace mlir::moe::common

#endif // MOE_CODEGEN_COMMON_FP8_H
