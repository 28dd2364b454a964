//===- MoeAttrs.cpp - layer configuration attributes ----------------------===//
//
// Parsing helpers and the verifiers that reject configurations no model has:
// each says which value is wrong and why.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeDialect.h"

#include "llvm/ADT/TypeSwitch.h"
#include <cmath>

using namespace mlir;
using namespace mlir::moe;

#include "dialects/moe/MoeEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "dialects/moe/MoeAttrs.cpp.inc"

FailureOr<APFloat> mlir::moe::parseReal(AsmParser &parser) {
  // Integers are accepted too: `limit = 7` is as clear as `limit = 7.0`.
  int64_t integer;
  OptionalParseResult parsedInteger = parser.parseOptionalInteger(integer);
  if (parsedInteger.has_value()) {
    if (failed(*parsedInteger))
      return failure();
    return APFloat(static_cast<double>(integer));
  }
  double value;
  if (parser.parseFloat(value))
    return failure();
  return APFloat(value);
}

void mlir::moe::printReal(AsmPrinter &printer, const APFloat &value) {
  // Shortest text that reads back as the same double.
  SmallString<32> text;
  value.toString(text, /*FormatPrecision=*/0, /*FormatMaxPadding=*/3,
                 /*TruncateZero=*/false);
  if (!StringRef(text).contains_insensitive('e') &&
      !StringRef(text).contains('.'))
    text += ".0";
  printer << text;
}

FailureOr<bool> mlir::moe::parseBool(AsmParser &parser) {
  if (succeeded(parser.parseOptionalKeyword("true")))
    return true;
  if (succeeded(parser.parseOptionalKeyword("false")))
    return false;
  return parser.emitError(parser.getCurrentLocation(),
                          "expected 'true' or 'false'");
}

static bool isPositiveReal(const APFloat &value) {
  return value.isFiniteNonZero() && !value.isNegative();
}

void MoeDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/moe/MoeAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// RouterAttr
//===----------------------------------------------------------------------===//

LogicalResult RouterAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 RouterKind kind, bool renormalize,
                                 int64_t nGroup, int64_t topkGroup,
                                 APFloat scaling) {
  bool grouped = kind == RouterKind::SigmoidGroupedTopK;
  if (nGroup < 1)
    return emitError() << "router n_group must be at least 1, but is "
                       << nGroup;
  if (topkGroup < 1 || topkGroup > nGroup)
    return emitError() << "router topk_group must be between 1 and n_group ("
                       << nGroup << "), but is " << topkGroup;
  if (!grouped && (nGroup != 1 || topkGroup != 1))
    return emitError() << "router kind '" << stringifyRouterKind(kind)
                       << "' does not group experts: n_group and topk_group "
                          "apply only to sigmoid_grouped_topk";
  if (renormalize && (kind == RouterKind::TopKSoftmax ||
                      kind == RouterKind::SigmoidScaleInput))
    return emitError() << "router kind '" << stringifyRouterKind(kind)
                       << "' cannot renormalize: its weights are not a share "
                          "of a sum over the chosen experts";
  if (!isPositiveReal(scaling))
    return emitError() << "router scaling must be a positive finite number, "
                          "but is "
                       << scaling.convertToDouble();
  return success();
}

LogicalResult
RouterAttr::verifyFor(function_ref<InFlightDiagnostic()> emitError,
                      int64_t experts, int64_t topK) const {
  int64_t nGroup = getNGroup();
  if (experts % nGroup != 0)
    return emitError() << "router n_group (" << nGroup
                       << ") must divide the number of experts (" << experts
                       << ")";
  int64_t perGroup = experts / nGroup;
  if (nGroup > 1 && perGroup < 2)
    return emitError() << "router groups must hold at least 2 experts (a "
                          "group scores by its top two), but "
                       << experts << " experts in " << nGroup << " groups hold "
                       << perGroup;
  if (getTopkGroup() * perGroup < topK)
    return emitError() << "top_k (" << topK << ") exceeds the "
                       << getTopkGroup() * perGroup
                       << " experts in the topk_group (" << getTopkGroup()
                       << ") groups a token may use";
  return success();
}

//===----------------------------------------------------------------------===//
// ActivationAttr
//===----------------------------------------------------------------------===//

LogicalResult
ActivationAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                       ActivationKind kind, APFloat alpha, APFloat limit) {
  if (kind == ActivationKind::SwiGLU &&
      (alpha != APFloat(1.702) || limit != APFloat(7.0)))
    return emitError() << "alpha and limit apply only to clamped_swiglu";
  if (!isPositiveReal(alpha))
    return emitError() << "activation alpha must be a positive finite "
                          "number, but is "
                       << alpha.convertToDouble();
  if (!isPositiveReal(limit))
    return emitError() << "activation limit must be a positive finite "
                          "number, but is "
                       << limit.convertToDouble();
  return success();
}

//===----------------------------------------------------------------------===//
// QuantAttr
//===----------------------------------------------------------------------===//

LogicalResult QuantAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                QuantKind kind, ScaleRounding rounding) {
  if (kind == QuantKind::FP8Block128 && rounding != ScaleRounding::Floor)
    return emitError() << "scale rounding applies only to mxfp8: fp8_block128 "
                          "scales are exact f32 ratios";
  return success();
}

int64_t QuantAttr::getBlockSize() const {
  return getKind() == QuantKind::MXFP8 ? 32 : 128;
}

Type QuantAttr::getScaleType() const {
  Builder b(getContext());
  if (getKind() == QuantKind::MXFP8)
    return b.getType<Float8E8M0FNUType>();
  return b.getF32Type();
}

SmallVector<int64_t> mlir::moe::getScaleShape(QuantAttr quant,
                                              ArrayRef<int64_t> dataShape,
                                              bool squareBlocks) {
  int64_t block = quant.getBlockSize();
  auto blocks = [&](int64_t size) {
    return ShapedType::isDynamic(size) ? size : llvm::divideCeil(size, block);
  };
  SmallVector<int64_t> shape(dataShape);
  if (shape.empty())
    return shape;
  shape.back() = blocks(shape.back());
  if (squareBlocks && quant.getKind() == QuantKind::FP8Block128 &&
      shape.size() >= 2)
    shape[shape.size() - 2] = blocks(shape[shape.size() - 2]);
  return shape;
}

//===----------------------------------------------------------------------===//
// ConfigAttr
//===----------------------------------------------------------------------===//

LogicalResult ConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 int64_t experts, int64_t topK, int64_t hidden,
                                 int64_t intermediate, RouterAttr router,
                                 ActivationAttr activation,
                                 int64_t sharedIntermediate, bool sharedGate,
                                 QuantAttr quant, int64_t epSize) {
  for (auto [name, value] : {std::pair<StringRef, int64_t>{"experts", experts},
                             {"top_k", topK},
                             {"hidden", hidden},
                             {"intermediate", intermediate},
                             {"ep_size", epSize}})
    if (value < 1)
      return emitError() << "layer " << name << " must be positive, but is "
                         << value;
  if (topK > experts)
    return emitError() << "top_k (" << topK
                       << ") must not exceed the number of experts (" << experts
                       << ")";
  if (sharedIntermediate < 0)
    return emitError() << "shared_intermediate must not be negative, but is "
                       << sharedIntermediate;
  if (sharedGate && sharedIntermediate == 0)
    return emitError() << "shared_gate needs shared experts "
                          "(shared_intermediate > 0)";
  if (experts % epSize != 0)
    return emitError() << "ep_size (" << epSize
                       << ") must divide the number of experts (" << experts
                       << ")";
  return router.verifyFor(emitError, experts, topK);
}
