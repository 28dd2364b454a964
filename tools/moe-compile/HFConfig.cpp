//===- HFConfig.cpp - MoE layers from HuggingFace config.json -------------===//
//
// Each supported model_type maps its config fields onto #moe.config the way
// the model's modeling code in HF transformers uses them. Sizes are checked by
// the attribute verifiers, so a bad config gets the same diagnostics as bad
// IR.
//
//===----------------------------------------------------------------------===//

#include "tools/moe-compile/HFConfig.h"

#include "dialects/moe/MoeOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::moe;
namespace json = llvm::json;

namespace {
/// Typed access to one config object; every failure names the field.
class FieldReader {
public:
  FieldReader(const json::Object &object, StringRef modelType, Location loc)
      : object(object), modelType(modelType), loc(loc) {}

  InFlightDiagnostic error() {
    return emitError(loc) << "config.json (model_type '" << modelType << "'): ";
  }

  /// A required integer field; null counts as missing.
  FailureOr<int64_t> integer(StringRef key) {
    const json::Value *value = object.get(key);
    if (!value || value->kind() == json::Value::Null) {
      error() << "missing field '" << key << "'";
      return failure();
    }
    return asInteger(key, *value);
  }

  /// A required integer field that recent transformers versions may save
  /// under another name (`alias`).
  FailureOr<int64_t> integer(StringRef key, StringRef alias) {
    const json::Value *value = object.get(key);
    if ((!value || value->kind() == json::Value::Null) && object.get(alias))
      return integer(alias);
    return integer(key);
  }

  FailureOr<int64_t> integerOr(StringRef key, int64_t fallback) {
    const json::Value *value = object.get(key);
    if (!value || value->kind() == json::Value::Null)
      return fallback;
    return asInteger(key, *value);
  }

  FailureOr<double> realOr(StringRef key, double fallback) {
    const json::Value *value = object.get(key);
    if (!value || value->kind() == json::Value::Null)
      return fallback;
    if (std::optional<double> real = value->getAsNumber())
      return *real;
    error() << "field '" << key << "' must be a number";
    return failure();
  }

  FailureOr<bool> booleanOr(StringRef key, bool fallback) {
    const json::Value *value = object.get(key);
    if (!value || value->kind() == json::Value::Null)
      return fallback;
    if (std::optional<bool> flag = value->getAsBoolean())
      return *flag;
    error() << "field '" << key << "' must be true or false";
    return failure();
  }

  FailureOr<std::string> stringOr(StringRef key, StringRef fallback) {
    const json::Value *value = object.get(key);
    if (!value || value->kind() == json::Value::Null)
      return fallback.str();
    if (std::optional<StringRef> text = value->getAsString())
      return text->str();
    error() << "field '" << key << "' must be a string";
    return failure();
  }

private:
  FailureOr<int64_t> asInteger(StringRef key, const json::Value &value) {
    if (std::optional<int64_t> integer = value.getAsInteger())
      return *integer;
    error() << "field '" << key << "' must be an integer";
    return failure();
  }

  const json::Object &object;
  StringRef modelType;
  Location loc;
};

/// What the importer reads off a config before building attributes.
struct LayerFields {
  int64_t experts = 0, topK = 0, hidden = 0, intermediate = 0;
  int64_t sharedIntermediate = 0;
  bool sharedGate = false;
  RouterKind router = RouterKind::SoftmaxTopK;
  bool renormalize = false;
  int64_t nGroup = 1, topkGroup = 1;
  double scaling = 1.0;
  bool routerBias = false, expertBiases = false;
  ActivationKind activation = ActivationKind::SwiGLU;
  double swigluLimit = 7.0;
};
} // namespace

/// Unwraps a FailureOr into `out`, or returns failure from the caller.
#define READ(out, expr)                                                        \
  do {                                                                         \
    auto result = (expr);                                                      \
    if (failed(result))                                                        \
      return failure();                                                        \
    out = *result;                                                             \
  } while (false)

static LogicalResult readFields(FieldReader &reader, StringRef modelType,
                                LayerFields &f) {
  if (!llvm::is_contained({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                           "deepseek_v3", "kimi_k2", "gpt_oss", "llama4_text"},
                          modelType)) {
    reader.error() << "unsupported model type (supported: mixtral, "
                      "qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, "
                      "kimi_k2, gpt_oss, llama4, llama4_text)";
    return failure();
  }
  READ(f.hidden, reader.integer("hidden_size"));
  READ(f.topK, reader.integer("num_experts_per_tok"));

  if (modelType == "mixtral") {
    // MixtralSparseMoeBlock: softmax, top-k, weights divided by their sum.
    READ(f.experts, reader.integer("num_local_experts"));
    READ(f.intermediate, reader.integer("intermediate_size"));
    f.renormalize = true;
    return success();
  }
  if (modelType == "qwen2_moe" || modelType == "qwen3_moe") {
    READ(f.experts, reader.integer("num_experts", "num_local_experts"));
    READ(f.intermediate, reader.integer("moe_intermediate_size"));
    READ(f.renormalize, reader.booleanOr("norm_topk_prob", false));
    if (modelType == "qwen2_moe") {
      // Qwen2MoeSparseMoeBlock: one shared expert behind a sigmoid gate.
      READ(f.sharedIntermediate,
           reader.integer("shared_expert_intermediate_size"));
      f.sharedGate = f.sharedIntermediate > 0;
    }
    return success();
  }
  if (modelType == "deepseek_v2" || modelType == "deepseek_v3" ||
      modelType == "kimi_k2") {
    READ(f.experts, reader.integer("n_routed_experts", "num_local_experts"));
    READ(f.intermediate, reader.integer("moe_intermediate_size"));
    int64_t sharedExperts;
    READ(sharedExperts, reader.integerOr("n_shared_experts", 0));
    f.sharedIntermediate = sharedExperts * f.intermediate;
    READ(f.renormalize, reader.booleanOr("norm_topk_prob", false));
    READ(f.scaling, reader.realOr("routed_scaling_factor", 1.0));
    std::string scoring, method;
    bool v2 = modelType == "deepseek_v2";
    READ(scoring, reader.stringOr("scoring_func", v2 ? "softmax" : "sigmoid"));
    READ(method, reader.stringOr("topk_method", v2 ? "greedy" : "noaux_tc"));
    if (scoring == "softmax" && method == "greedy") {
      // DeepSeek-V2-Lite: plain softmax top-k, scaled.
      f.router = RouterKind::SoftmaxTopK;
      return success();
    }
    if (scoring == "sigmoid" && method == "noaux_tc") {
      f.router = RouterKind::SigmoidGroupedTopK;
      f.routerBias = true; // e_score_correction_bias
      READ(f.nGroup, reader.integerOr("n_group", 1));
      READ(f.topkGroup, reader.integerOr("topk_group", 1));
      return success();
    }
    reader.error() << "routing with scoring_func '" << scoring
                   << "' and topk_method '" << method
                   << "' is not supported (supported: softmax with greedy, "
                      "sigmoid with noaux_tc)";
    return failure();
  }
  if (modelType == "gpt_oss") {
    // GptOssTopKRouter: biased logits, top-k, softmax over the k; experts
    // with biases and the clamped SwiGLU.
    READ(f.experts, reader.integer("num_local_experts"));
    READ(f.intermediate, reader.integer("intermediate_size"));
    f.router = RouterKind::TopKSoftmax;
    f.routerBias = f.expertBiases = true;
    f.activation = ActivationKind::ClampedSwiGLU;
    READ(f.swigluLimit, reader.realOr("swiglu_limit", 7.0));
    return success();
  }
  // llama4_text, Llama4TextMoe: sigmoid of the top logit scales the expert
  // input; one shared expert as wide as the routed ones.
  READ(f.experts, reader.integer("num_local_experts"));
  READ(f.intermediate, reader.integer("intermediate_size"));
  f.router = RouterKind::SigmoidScaleInput;
  f.sharedIntermediate = f.intermediate;
  return success();
}

/// The scheme `quantization_config` asks for: FP8 with 128 x 128 weight
/// blocks (DeepSeek-V3, Kimi-K2) is taken as stored; anything else is
/// reported and the layer takes bf16 weights.
static QuantAttr configuredQuant(MLIRContext &context, const json::Object &root,
                                 Location loc) {
  const json::Object *quant = root.getObject("quantization_config");
  if (!quant)
    return {};
  std::optional<StringRef> method = quant->getString("quant_method");
  const json::Array *blocks = quant->getArray("weight_block_size");
  bool block128 = blocks && blocks->size() == 2 &&
                  llvm::all_of(*blocks, [](const json::Value &v) {
                    return v.getAsInteger() == 128;
                  });
  if (method == "fp8" && block128)
    return QuantAttr::get(&context, QuantKind::FP8Block128,
                          ScaleRounding::Floor);
  emitWarning(loc) << "config.json: quantization_config (quant_method '"
                   << method.value_or("?")
                   << "') is not supported: the layer takes bf16 weights "
                      "(--quant chooses a scheme)";
  return {};
}

OwningOpRef<ModuleOp>
mlir::moe::importHFConfig(MLIRContext &context, StringRef path, StringRef text,
                          StringRef name,
                          std::optional<QuantAttr> quantOverride,
                          int64_t epSize, bool routerLogits, bool bf16Weights) {
  context.loadDialect<MoeDialect, func::FuncDialect>();
  Location loc = FileLineColLoc::get(&context, path, 1, 1);
  llvm::Expected<json::Value> parsed = json::parse(text);
  if (!parsed) {
    emitError(loc) << "config.json is not valid JSON: "
                   << llvm::toString(parsed.takeError());
    return nullptr;
  }
  const json::Object *object = parsed->getAsObject();
  if (!object) {
    emitError(loc) << "config.json must hold a JSON object";
    return nullptr;
  }
  std::optional<StringRef> modelType = object->getString("model_type");
  if (!modelType) {
    emitError(loc) << "config.json has no string field 'model_type'";
    return nullptr;
  }
  // Llama-4's multimodal config nests the language model's fields.
  if (*modelType == "llama4") {
    object = object->getObject("text_config");
    if (!object) {
      emitError(loc) << "config.json (model_type 'llama4'): missing object "
                        "'text_config'";
      return nullptr;
    }
    modelType = "llama4_text";
  }

  // A quantized layer takes its weights quantized (moe-quantize converts
  // bf16 ones once), shared experts included, as DeepSeek-V3 ships them; one
  // that trains takes the bf16 weights its gradients are for.
  QuantAttr quant =
      quantOverride.value_or(configuredQuant(context, *object, loc));
  bool fp8Weights = quant && !bf16Weights;

  FieldReader reader(*object, *modelType, loc);
  LayerFields f;
  if (failed(readFields(reader, *modelType, f)))
    return nullptr;

  auto emitErrorFn = [&] { return reader.error(); };
  RouterAttr router =
      RouterAttr::getChecked(emitErrorFn, &context, f.router, f.renormalize,
                             f.nGroup, f.topkGroup, APFloat(f.scaling));
  ActivationAttr activation =
      f.activation == ActivationKind::ClampedSwiGLU
          ? ActivationAttr::getChecked(emitErrorFn, &context, f.activation,
                                       APFloat(1.702), APFloat(f.swigluLimit))
          : ActivationAttr::get(&context, f.activation, APFloat(1.702),
                                APFloat(7.0));
  if (!router || !activation)
    return nullptr;
  ConfigAttr config = ConfigAttr::getChecked(
      emitErrorFn, &context, f.experts, f.topK, f.hidden, f.intermediate,
      router, activation, f.sharedIntermediate, f.sharedGate, quant, epSize);
  if (!config)
    return nullptr;

  // The function's arguments follow the layer's operands, in ABI order.
  OpBuilder b(&context);
  Type bf16 = b.getBF16Type();
  auto tensor = [&](ArrayRef<int64_t> shape, Type element) -> Type {
    return RankedTensorType::get(shape, element);
  };
  // Each rank of an expert-parallel layer takes its own experts' weights.
  int64_t e = config.getLocalExperts(), h = f.hidden, i = f.intermediate;
  int64_t is = f.sharedIntermediate;
  SmallVector<Type> argTypes = {tensor({ShapedType::kDynamic, h}, bf16),
                                tensor({f.experts, h}, bf16)};
  if (f.routerBias)
    argTypes.push_back(tensor({f.experts}, b.getF32Type()));
  Type weightType = fp8Weights ? b.getType<Float8E4M3FNType>() : bf16;
  // FP8 block-128 weights have one f32 scale per 128 x 128 block, as the
  // checkpoints store them; MXFP8 one E8M0 scale per row and 32 of K.
  auto scaleType = [&](ArrayRef<int64_t> shape) {
    return tensor(
        getScaleShape(quant, shape, quant.getKind() == QuantKind::FP8Block128),
        quant.getScaleType());
  };
  argTypes.push_back(tensor({e, 2 * i, h}, weightType));
  argTypes.push_back(tensor({e, h, i}, weightType));
  if (fp8Weights) {
    argTypes.push_back(scaleType({e, 2 * i, h}));
    argTypes.push_back(scaleType({e, h, i}));
  }
  if (f.expertBiases) {
    argTypes.push_back(tensor({e, 2 * i}, bf16));
    argTypes.push_back(tensor({e, h}, bf16));
  }
  if (is > 0) {
    argTypes.push_back(tensor({2 * is, h}, weightType));
    argTypes.push_back(tensor({h, is}, weightType));
    if (fp8Weights) {
      argTypes.push_back(scaleType({2 * is, h}));
      argTypes.push_back(scaleType({h, is}));
    }
  }
  if (f.sharedGate)
    argTypes.push_back(tensor({1, h}, bf16));
  Type outType = argTypes[0];
  SmallVector<Type> resultTypes = {outType};
  if (routerLogits)
    resultTypes.push_back(
        tensor({ShapedType::kDynamic, f.experts}, b.getF32Type()));

  std::string funcName = name.str();
  if (funcName.empty()) {
    funcName = modelType->ends_with("_moe") ? modelType->str()
                                            : (*modelType + "_moe").str();
    for (char &c : funcName)
      if (!llvm::isAlnum(c))
        c = '_';
  }
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto func = func::FuncOp::create(b, loc, funcName,
                                   b.getFunctionType(argTypes, resultTypes));
  Block *body = func.addEntryBlock();
  b.setInsertionPointToEnd(body);
  auto args = body->getArguments();
  unsigned next = 2;
  auto take = [&](bool present) -> Value {
    return present ? args[next++] : Value();
  };
  Value routerBias = take(f.routerBias);
  Value w13 = take(true), w2 = take(true);
  Value w13Scale = take(fp8Weights), w2Scale = take(fp8Weights);
  Value w13Bias = take(f.expertBiases), w2Bias = take(f.expertBiases);
  Value sharedW13 = take(is > 0), sharedW2 = take(is > 0);
  Value sharedW13Scale = take(is > 0 && fp8Weights);
  Value sharedW2Scale = take(is > 0 && fp8Weights);
  Value sharedGate = take(f.sharedGate);
  auto layer = LayerOp::create(b, loc, resultTypes, args[0], args[1],
                               routerBias, w13, w2, w13Scale, w2Scale, w13Bias,
                               w2Bias, sharedW13, sharedW2, sharedGate,
                               sharedW13Scale, sharedW2Scale, config);
  func::ReturnOp::create(b, loc, layer.getResults());
  if (failed(verify(*module)))
    return nullptr;
  return module;
}
