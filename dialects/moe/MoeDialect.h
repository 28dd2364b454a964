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
} // namespace mlir::moe

#define GET_ATTRDEF_CLASSES
#include "dialects/moe/MoeAttrs.h.inc"

namespace mlir::moe {
/// The scales `quant` gives data of `dataShape`: one per block along the last
/// dimension, or, with `squareBlocks` under FP8 block-128 (weights), one
/// per 128 x 128 block of the last two. Dynamic sizes stay dynamic.
SmallVector<int64_t> getScaleShape(QuantAttr quant, ArrayRef<int64_t> dataShape,
                                   bool squareBlocks);
} // namespace mlir::moe

#endif // MOE_DIALECTS_MOE_MOEDIALECT_H
