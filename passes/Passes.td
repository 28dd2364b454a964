//===- Passes.td - moe-compiler passes ---------------------*- tablegen -*-===//

#ifndef MOE_PASSES_TD
#define MOE_PASSES_TD

include "mlir/Pass/PassBase.td"

def Decompose : Pass<"moe-decompose"> {
  let summary = "Rewrite whole MoE layers (L0) into their steps (L1)";
  let description = [{
    Each `moe.layer` becomes `moe.route`, `moe.dispatch`, two
    `moe.grouped_matmul`s (gate/up with the activation, then down) and
    `moe.combine`, plus dense matmuls for the shared experts and their gate.
    With a `quant` config, activations and bf16 weights are quantized right
    before the matmuls that read them (moe-fuse-quantization moves that work
    into the producing kernels). A Llama-4 router scales the dispatched
    tokens instead of the combined outputs.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

#endif // MOE_PASSES_TD
