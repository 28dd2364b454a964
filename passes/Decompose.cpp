//===- Decompose.cpp - moe.layer into its steps ---------------------------===//
//
// L0 -> L1: route, dispatch, the two expert matmuls, combine, and the shared
// experts as dense matmuls. An expert-parallel layer's dispatch carries its
// ep_size, for moe-expert-parallel to split. Numerics are those of the ops;
// this pass only chooses the steps and the intermediate types.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

namespace mlir::moe {
#define GEN_PASS_DEF_DECOMPOSE
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// Builds the L1 ops of one layer in front of it.
class LayerDecomposer {
public:
  explicit LayerDecomposer(LayerOp layer)
      : layer(layer), config(layer.getConfig()), b(layer.getLoc(), layer) {}

  Value build();

private:
  /// `lhs` [rows, K] times `rhs`^T, per expert when `groups` are given. With a
  /// quant config, `lhs` and bf16 weights are quantized first. `role` names
  /// the step (its ops' location), which the kernels are named after.
  Value matmul(StringRef role, Value lhs, Value rhs, Value rhsScale, Value bias,
               ActivationAttr activation, ValueRange groups, bool quantized);

  /// Builds the next ops at the layer's location named `role`.
  void at(const Twine &role) {
    b.setLoc(NameLoc::get(b.getStringAttr(role), layer.getLoc()));
  }

  /// Quantizes `value` per the config; weights get 128 x 128 blocks under
  /// FP8 block-128, as DeepSeek-V3 stores them.
  std::pair<Value, Value> quantize(Value value, bool isWeight);

  RankedTensorType tensorType(ArrayRef<int64_t> shape, Type element) {
    return RankedTensorType::get(shape, element);
  }

  LayerOp layer;
  ConfigAttr config;
  ImplicitLocOpBuilder b;
};
} // namespace

std::pair<Value, Value> LayerDecomposer::quantize(Value value, bool isWeight) {
  QuantAttr quant = config.getQuant();
  ArrayRef<int64_t> shape = cast<RankedTensorType>(value.getType()).getShape();
  bool squareBlocks = isWeight && quant.getKind() == QuantKind::FP8Block128;
  auto op =
      QuantizeOp::create(b, tensorType(shape, b.getType<Float8E4M3FNType>()),
                         tensorType(getScaleShape(quant, shape, squareBlocks),
                                    quant.getScaleType()),
                         TypeRange(), value, quant);
  return {op.getData(), op.getScales()};
}

Value LayerDecomposer::matmul(StringRef role, Value lhs, Value rhs,
                              Value rhsScale, Value bias,
                              ActivationAttr activation, ValueRange groups,
                              bool quantized) {
  auto rhsType = cast<RankedTensorType>(rhs.getType());
  int64_t n = rhsType.getShape()[rhsType.getRank() - 2];
  int64_t rows = cast<RankedTensorType>(lhs.getType()).getDimSize(0);
  Value lhsScale;
  if (quantized && config.getQuant()) {
    at(role + "_input");
    std::tie(lhs, lhsScale) = quantize(lhs, /*isWeight=*/false);
    if (!rhsScale) {
      at(role + "_weights");
      std::tie(rhs, rhsScale) = quantize(rhs, /*isWeight=*/true);
    }
  }
  at(role);
  Value counts = groups.empty() ? Value() : groups[0];
  Value offsets = groups.empty() ? Value() : groups[1];
  return GroupedMatmulOp::create(
             b, tensorType({rows, activation ? n / 2 : n}, b.getBF16Type()),
             /*extras=*/TypeRange(), lhs, rhs, counts, offsets, lhsScale,
             rhsScale, bias, activation,
             /*out_quant=*/QuantAttr(), /*configs=*/ArrayAttr(),
             /*transpose_rhs=*/false, Value(), Value(), Value())
      .getOut();
}

Value LayerDecomposer::build() {
  Value hidden = layer.getHiddenStates();
  int64_t tokens = cast<RankedTensorType>(hidden.getType()).getDimSize(0);
  int64_t topK = config.getTopK(), localExperts = config.getLocalExperts();
  RouterAttr router = config.getRouter();
  Type i32 = b.getI32Type();

  at("route");
  Value logits = layer.getRouterLogits();
  auto route =
      RouteOp::create(b, tensorType({tokens, topK}, i32),
                      tensorType({tokens, topK}, b.getF32Type()),
                      logits ? logits.getType() : Type(), hidden,
                      layer.getRouterWeight(), layer.getRouterBias(), router);
  if (logits)
    logits.replaceAllUsesWith(route.getLogits());

  // Llama-4 weights the expert's input; every other router its output.
  bool scaleInput = router.getKind() == RouterKind::SigmoidScaleInput;
  Value routeWeights = route.getWeights();
  at("dispatch");
  auto dispatch = DispatchOp::create(
      b,
      tensorType({ShapedType::kDynamic, config.getHidden()}, b.getBF16Type()),
      tensorType({localExperts}, i32), tensorType({localExperts + 1}, i32),
      tensorType({tokens, topK}, i32), /*quantized=*/TypeRange(), hidden,
      route.getExpertIds(), scaleInput ? routeWeights : Value(), /*align=*/1,
      /*quant=*/QuantAttr(), config.getEpSize());
  Value groups[] = {dispatch.getTokensPerExpert(), dispatch.getExpertOffsets()};

  ActivationAttr activation = config.getActivation();
  Value gateUp = matmul("gate_up", dispatch.getDispatched(), layer.getW13(),
                        layer.getW13Scale(), layer.getW13Bias(), activation,
                        groups, /*quantized=*/true);
  Value expertOut = matmul("down", gateUp, layer.getW2(), layer.getW2Scale(),
                           layer.getW2Bias(), {}, groups, /*quantized=*/true);

  Value shared, sharedGate;
  if (layer.getSharedW13()) {
    Value sharedGateUp = matmul("shared_gate_up", hidden, layer.getSharedW13(),
                                layer.getSharedW13Scale(), {}, activation, {},
                                /*quantized=*/true);
    shared = matmul("shared_down", sharedGateUp, layer.getSharedW2(),
                    layer.getSharedW2Scale(), {}, {}, {}, /*quantized=*/true);
    // The gate is one output column: not worth quantizing.
    if (layer.getSharedGate())
      sharedGate = matmul("shared_gate", hidden, layer.getSharedGate(), {}, {},
                          {}, {}, /*quantized=*/false);
  }
  at("combine");
  return CombineOp::create(
      b, layer.getOut().getType(), expertOut, dispatch.getRows(),
      scaleInput ? Value() : routeWeights, shared, sharedGate);
}

namespace {
struct DecomposePass : public moe::impl::DecomposeBase<DecomposePass> {
  void runOnOperation() override {
    SmallVector<LayerOp> layers;
    getOperation()->walk([&](LayerOp layer) { layers.push_back(layer); });
    for (LayerOp layer : layers) {
      Value out = LayerDecomposer(layer).build();
      layer.getOut().replaceAllUsesWith(out);
      layer.erase();
    }
  }
};
} // namespace
