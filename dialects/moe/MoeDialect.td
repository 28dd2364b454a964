//===- MoeDialect.td - the moe dialect ---------------------*- tablegen -*-===//
//
// A Mixture-of-Experts layer, from the whole layer (L0) down to the steps a
// kernel implements (L1).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_TD
#define MOE_DIALECT_TD

include "mlir/IR/OpBase.td"

def Moe_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::mlir::moe";
  let summary = "Mixture-of-Experts layers: routing, token movement, experts";
  let description = [{
    Values are tensors whose leading token dimension is dynamic. Element types
    are builtin: `bf16` activations, `f8E4M3FN` quantized data, `f8E8M0FNU`
    (MXFP8) or `f32` (FP8 block-128) scales.
  }];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

class Moe_Op<string mnemonic, list<Trait> traits = []>
    : Op<Moe_Dialect, mnemonic, traits>;

#endif // MOE_DIALECT_TD
