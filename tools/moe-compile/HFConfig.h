//===- HFConfig.h - MoE layers from HuggingFace config.json ----*- C++ -*-===//

#ifndef MOE_TOOLS_MOE_COMPILE_HFCONFIG_H
#define MOE_TOOLS_MOE_COMPILE_HFCONFIG_H

#include "dialects/moe/MoeDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::moe {
/// Builds a module holding one function, `name` (default:
/// `<model_type>_moe`,
/// or the model type itself when it ends in `_moe`), whose body is the MoE
/// layer that the HuggingFace `config.json` text describes, read the way the
/// model's own code reads it. Returns null after emitting a diagnostic at
/// `path` that names the missing or unsupported field. `quant`, when given,
/// replaces what the config's quantization_config says (a null attribute
/// for none). A quantized layer takes its weights quantized, with their
/// scales, unless `bf16Weights` (training: the weights a trainer updates),
/// when it takes them in bf16 and quantizes them each call. With `epSize` > 1
/// the layer is expert parallel: it takes experts / epSize experts' weights.
OwningOpRef<ModuleOp>
importHFConfig(MLIRContext &context, StringRef path, StringRef json,
               StringRef name, std::optional<QuantAttr> quant = std::nullopt,
               int64_t epSize = 1, bool routerLogits = false,
               bool bf16Weights = false);
} // namespace mlir::moe

#endif // MOE_TOOLS_MOE_COMPILE_HFCONFIG_H
