//===- MoeDialect.cpp - the moe dialect -----------------------------------===//

#include "dialects/moe/MoeOps.h"

using namespace mlir;
using namespace mlir::moe;

#include "dialects/moe/MoeDialect.cpp.inc"

void MoeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/moe/MoeOps.cpp.inc"
      >();
  registerAttributes();
}
