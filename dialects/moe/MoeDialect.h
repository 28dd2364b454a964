//===- MoeDialect.h - the moe dialect and its attributes --------*- C++ -*-===//

#ifndef MOE_DIALECTS_MOE_MOEDIALECT_H
#define MOE_DIALECTS_MOE_MOEDIALECT_H

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/OpImplementation.h"

#include "dialects/moe/MoeDialect.h.inc"
#include "dialects/moe/MoeEnums.h.inc"

namespace mlir::moe {
// Attribute parameter syntax shared by the generated parsers and printers.
FailureOr<APFloat> parseReal(AsmParser &parser);
void printReal(AsmPrinter &printer, const APFloat &value);
FailureOr<bool> parseBool(AsmParser &parser);

/// A size that depends on a call's token count T: fixed + perToken * T.
struct TokenLinear {
  int64_t fixed = 0, perToken = 0;
  bool operator==(const TokenLinear &o) const {
    return fixed == o.fixed && perToken == o.perToken;
  }
  bool operator!=(const TokenLinear &o) const { return !(*this == o); }
  TokenLinear operator*(int64_t factor) const {
    return {fixed * factor, perToken * factor};
  }
};
inline llvm::hash_code hash_value(const TokenLinear &l) {
  return llvm::hash_combine(l.fixed, l.perToken);
}
FailureOr<TokenLinear> parseTokenLinear(AsmParser &parser);
void printTokenLinear(AsmPrinter &printer, const TokenLinear &value);

/// One kernel parameter: a plan buffer's address, a TMA descriptor of the
/// plan (by value), or the token count.
struct KernelArg {
  KernelArgKind kind;
  int64_t index = 0;
  bool operator==(const KernelArg &o) const {
    return kind == o.kind && index == o.index;
  }
};
inline llvm::hash_code hash_value(const KernelArg &a) {
  return llvm::hash_combine(a.kind, a.index);
}
FailureOr<SmallVector<KernelArg>> parseKernelArgs(AsmParser &parser);
FailureOr<SmallVector<int64_t>> parseCountList(AsmParser &parser);
void printCountList(AsmPrinter &printer, ArrayRef<int64_t> counts);
void printKernelArgs(AsmPrinter &printer, ArrayRef<KernelArg> args);
} // namespace mlir::moe

#define GET_ATTRDEF_CLASSES
#include "dialects/moe/MoeAttrs.h.inc"

namespace mlir::moe {
/// On a layer function: its token buckets (dense i64 array, ascending), as
/// moe-bucketize chooses them.
constexpr const char kTokenBucketsAttrName[] = "moe.token_buckets";
/// On a layer function: one #moe.launch_plan per token bucket, beside the
/// moe.launch_plan for any count (moe-build-kernels).
constexpr const char kBucketPlansAttrName[] = "moe.bucket_plans";
/// On a layer function: the token buckets whose plan is one persistent
/// kernel (moe-fuse-layer).
constexpr const char kFusedBucketsAttrName[] = "moe.fused_buckets";

/// The scales `quant` gives data of `dataShape`: one per block along the last
/// dimension, or, with `squareBlocks` under FP8 block-128 (weights), one
/// per 128 x 128 block of the last two. Dynamic sizes stay dynamic.
SmallVector<int64_t> getScaleShape(QuantAttr quant, ArrayRef<int64_t> dataShape,
                                   bool squareBlocks);
} // namespace mlir::moe

#endif // MOE_DIALECTS_MOE_MOEDIALECT_H
