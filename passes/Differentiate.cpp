//===- Differentiate.cpp - an MoE layer's backward from its L1 forward ----===//
//
// Reverse mode over the L1 ops, one adjoint rule an op. For a function @f of
// L1 ops it builds @f_train, the forward that also returns what the
// backward reads, and @f_backward, which takes @f's arguments, the output's
// gradient and those saved values, and returns the gradient of every
// argument that has one. The rules (docs/architecture.md, "Training"):
//
//   combine      the rows' gradient is the output's gradient gathered into
//                the expert-major layout (a dispatch of it), each row's
//                routing weight (or the shared experts' gate) kept aside:
//                the next rule applies it, so no per-choice copy of the
//                output is ever saved
//   gated down   the down matmul's dgrad, then the activation's backward
//                with the row's weight: the gate/up output's gradient, the
//                weight's gradient <g, activation> and the weighted
//                activation the weight gradient reads (activation_grad)
//   matmul       dgrad (rows x weights, their other major order) and wgrad
//                (a sum over each expert's rows), the bias's gradient a sum
//   dispatch     each token's gradient is the sum of its choices' rows
//   route        the logits' gradient (route_grad), then a dgrad and a
//                wgrad with the router weight
//   quantize     straight-through: a quantized operand's gradient is its
//                bf16 input's. A dgrad of weights the layer quantizes in
//                FP8 block-128 runs in FP8 (the gradient's rows and the
//                transposed weights quantized along N); other products
//                multiply by the values the forward multiplied (the codes
//                dequantized)
//
// The token's gradient sums every path (router, shared experts and gate in
// f32, then the experts' rows) and is rounded to bf16 once.
//
// What the forward saves, and what the backward recomputes, is decided here
// and written in the IR: @f_train's `moe.saved` names its extra results. A
// gated matmul's activation becomes a step of its own in @f_train so that
// its input (the gate/up output) is saved; the activation itself is
// recomputed from it. A quantized layer saves its quantized rows as codes
// and scales, and quantizes its weights and input again rather than save
// them; the transposed FP8 weights a dgrad reads are the training
// forward's, quantized beside its own codes (one pass on sm_90a).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_DIFFERENTIATE
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// A value's gradient in the backward function. `value` is the gradient
/// itself, or, with `rows` and `weights` (or `gate`), the gradient of the
/// rows before each is weighted by its routing weight (the sigmoid of its
/// gate): the rule of the op that produced the rows applies the weight and
/// gives the weight's gradient to `weightsOf` (the forward's value).
struct Adjoint {
  Value value;
  Value rows, weights, gate;
  Value weightsOf;
  /// With `rows`: the gradient of the tokens the rows were gathered from,
  /// where the layout's experts start and its alignment.
  Value tokens, offsets;
  uint64_t align = 1;
  /// An expert-parallel rank's rows: each one's weight [R, 1], which came
  /// with it (in place of `rows` and `weights`).
  Value rowWeights;
};

/// The backward's exchanges of an expert-parallel dispatch: the output's
/// gradient sent to the experts' ranks (where the forward's tokens went),
/// then the rows' gradients brought home.
struct EpExchange {
  /// Where each choice's row gradient lands at home, and each received
  /// row's source (the gradient's send and receive).
  Value rows, origin;
  /// The combine's weights (forward) and their rows' gradients [R, 1].
  Value weightsOf, rowWeightGrad;
};

class Differentiator {
public:
  Differentiator(func::FuncOp train, func::FuncOp backward,
                 bool recomputeGateUp, bool bf16Grads)
      : recomputeGateUp(recomputeGateUp), bf16Grads(bf16Grads), train(train),
        backward(backward),
        b(ImplicitLocOpBuilder::atBlockBegin(backward.getLoc(),
                                             &backward.getBody().front())) {}

  /// Builds the backward's body from `train`'s ops, given the output's
  /// gradient (the backward's argument `outGrad`).
  LogicalResult build(Value out, Value outGrad);

  /// The forward values the backward reads, in argument order.
  SmallVector<Value> saved;
  /// The forward arguments whose gradients the backward returns, in order.
  SmallVector<unsigned> gradOf;

private:
  LogicalResult rule(Operation *op);
  LogicalResult combineRule(CombineOp op);
  LogicalResult matmulRule(GroupedMatmulOp op);
  LogicalResult gatedDownRule(GroupedMatmulOp op, ActivationOp activation,
                              const Adjoint &adjoint);
  LogicalResult dispatchRule(DispatchOp op);
  LogicalResult routeRule(RouteOp op);
  /// combine's rule where `dispatch` is expert parallel: the output's
  /// gradient goes to the experts' ranks with each choice's weight.
  Adjoint epRowGrads(CombineOp op, DispatchOp dispatch, Value grad);

  /// A forward value in the backward: an argument, a saved value, or one
  /// quantized from an argument (quantized again).
  Value get(Value forward);
  /// The matmul operand `operand` as the backward multiplies by it: itself,
  /// or for moe.quantize's codes the values they stand for.
  Value operandRead(Value operand);
  /// The weight gradient of `op`'s rhs (or, with `lhs` its activation's
  /// rows, of the down matmul's): in E4M3 for an fp8_block128 layer, as
  /// DeepSeek-V3's recipe takes it, reading the forward's saved codes of
  /// the rows rather than the values they stand for.
  Value weightGrad(GroupedMatmulOp op, Type type, Value grad, Value lhs,
                   Value counts, Value offsets);
  /// `grad` times the weights `rhs` of `op` read along N (a dgrad's
  /// product), in `op`'s scheme where it multiplied quantized weights the
  /// layer quantizes; null otherwise.
  Value quantizedDgrad(GroupedMatmulOp op, Value grad, Type outType,
                       Value counts, Value offsets);
  /// The gate/up output `forward` computed again in the backward from what
  /// its matmul reads.
  Value recomputed(Value forward);
  /// Adds `grad` to the gradient of the forward value `v`, which must not
  /// have one yet unless it is an argument (whose parts are summed).
  /// `v`'s adjoint (an op's result, which has none yet).
  LogicalResult addAdjoint(Operation *op, Value v, const Adjoint &adjoint);
  LogicalResult addGrad(Operation *op, Value v, Value grad);
  /// `v`'s gradient from `lhs` x `rhs`, summed with its other parts in f32.
  void addDgrad(Value v, Value lhs, Value rhs, ValueRange groups);
  /// Sets the gradient of the forward argument `v` (a weight), which one
  /// op may read only: two gradients would have to be summed.
  LogicalResult setArgGrad(Operation *op, Value v, Value grad);
  /// Tokens' gradient laid out as the dispatch that gave `rows` laid out
  /// its tokens: where it put them, not where a new dispatch would.
  Value scattered(Value grad, Value rows, Location loc);
  /// The groups of a grouped matmul in the backward, empty when dense.
  SmallVector<Value> groups(GroupedMatmulOp op);

  /// The gradient of a weight (or bias) of type `weight`: f32, or bf16
  /// with `bf16Grads` where the weight is bf16.
  RankedTensorType gradTypeOf(Type weight) {
    auto type = cast<RankedTensorType>(weight);
    bool bf16 = bf16Grads && type.getElementType().isBF16();
    return type.clone(bf16 ? Type(b.getBF16Type()) : Type(b.getF32Type()));
  }

  bool recomputeGateUp, bf16Grads;
  func::FuncOp train, backward;
  ImplicitLocOpBuilder b;
  DenseMap<Value, Value> recomputedValues, dequantizedValues;
  /// Expert-parallel dispatches' exchanges in the backward, and the
  /// forward's layout values they give again (counts, offsets).
  DenseMap<Operation *, EpExchange> epExchanges;
  DenseMap<Value, Value> epValues;
  DenseMap<Value, Value> savedArgs;
  DenseMap<Value, Adjoint> adjoints;
  /// Weights whose gradient a later rule gives (combine's, deferred).
  DenseSet<Value> pendingWeights;
  /// Gradients of the forward's arguments: a matmul's gradient whole, and
  /// for the tokens their parts (dgrads chained in f32, then the experts'
  /// rows summed back).
  DenseMap<Value, Value> argGrads;
  DenseMap<Value, Value> tokenAcc;
  /// The tokens' gradient from the rows: rows' gradient, rows, weights.
  DenseMap<Value, std::tuple<Value, Value, Value>> tokenRows;
};
} // namespace

LogicalResult Differentiator::setArgGrad(Operation *op, Value v, Value grad) {
  if (!argGrads.try_emplace(v, grad).second)
    return op->emitOpError()
           << "reads a weight another step reads too, "
              "whose gradients moe-differentiate does not sum";
  return success();
}

Value Differentiator::recomputed(Value forward) {
  Value &again = recomputedValues[forward];
  if (!again) {
    auto matmul = forward.getDefiningOp<GroupedMatmulOp>();
    IRMapping map;
    for (Value operand : matmul->getOperands())
      map.map(operand, get(operand));
    again = b.clone(*matmul, map)->getResult(0);
  }
  return again;
}

Value Differentiator::get(Value forward) {
  if (Value again = epValues.lookup(forward))
    return again;
  if (auto arg = dyn_cast<BlockArgument>(forward))
    if (arg.getOwner()->getParentOp() == train)
      return backward.getArgument(arg.getArgNumber());
  // Weights (and the layer's input) quantized: quantizing again costs less
  // than keeping a copy from the forward to the backward.
  if (auto quantize = forward.getDefiningOp<QuantizeOp>();
      quantize && isa<BlockArgument>(quantize.getInput())) {
    Value &again = recomputedValues[quantize.getData()];
    if (!again) {
      IRMapping map;
      map.map(quantize.getInput(), get(quantize.getInput()));
      Operation *clone = b.clone(*quantize, map);
      again = clone->getResult(0);
      recomputedValues[quantize.getScales()] = clone->getResult(1);
    }
    return recomputedValues[forward];
  }
  auto [it, added] = savedArgs.try_emplace(forward, Value());
  if (added) {
    saved.push_back(forward);
    it->second = backward.getBody().front().addArgument(forward.getType(),
                                                        forward.getLoc());
  }
  return it->second;
}

static Value unquantized(Value operand) {
  if (auto quantize = operand.getDefiningOp<QuantizeOp>())
    return quantize.getInput();
  return operand;
}

Value Differentiator::operandRead(Value operand) {
  auto quantize = operand.getDefiningOp<QuantizeOp>();
  if (!quantize)
    return get(operand);
  Value &read = dequantizedValues[operand];
  if (!read)
    read = DequantizeOp::create(b, quantize.getLoc(),
                                quantize.getInput().getType(),
                                get(quantize.getData()),
                                get(quantize.getScales()), quantize.getScheme())
               .getOutput();
  return read;
}

Value Differentiator::weightGrad(GroupedMatmulOp op, Type type, Value grad,
                                 Value lhs, Value counts, Value offsets) {
  Location loc = op.getLoc();
  QuantAttr scheme = op.getScheme();
  bool fp8 = scheme && scheme.getKind() == QuantKind::FP8Block128 &&
             cast<RankedTensorType>(grad.getType()).getElementType().isBF16();
  if (!fp8) {
    Value rows = lhs ? lhs : operandRead(op.getLhs());
    return GroupedMatmulWgradOp::create(b, loc, type, grad, rows, counts,
                                        offsets, Value(), QuantAttr());
  }
  Value scale;
  if (!lhs) {
    // The rows' codes along K, 1 x 128, as the forward saved them.
    auto quantize = op.getLhs().getDefiningOp<QuantizeOp>();
    auto scales = quantize
                      ? cast<RankedTensorType>(quantize.getScales().getType())
                      : RankedTensorType();
    if (quantize && !quantize.getTranspose() &&
        quantize.getScheme() == scheme && scales.getRank() == 2 &&
        scales.getDimSize(1) ==
            static_cast<int64_t>(llvm::divideCeil(
                cast<RankedTensorType>(quantize.getData().getType())
                    .getDimSize(1),
                128))) {
      lhs = get(quantize.getData());
      scale = get(quantize.getScales());
    } else {
      lhs = operandRead(op.getLhs());
    }
  }
  return GroupedMatmulWgradOp::create(b, loc, type, grad, lhs, counts, offsets,
                                      scale, scheme);
}

Value Differentiator::quantizedDgrad(GroupedMatmulOp op, Value grad,
                                     Type outType, Value counts,
                                     Value offsets) {
  // MXFP8's codes are converted to bf16 in sm_90a's main loop, which gains
  // no FLOPs over bf16: its dgrads multiply the dequantized weights in bf16
  // rather than pay for quantizing the gradient and the weights again.
  auto weights = op.getRhs().getDefiningOp<QuantizeOp>();
  if (!weights || !isa<BlockArgument>(weights.getInput()) ||
      !op.getLhsScale() ||
      weights.getScheme().getKind() != QuantKind::FP8Block128)
    return Value();
  auto gradType = cast<RankedTensorType>(grad.getType());
  if (!gradType.getElementType().isBF16())
    return Value();
  // DeepSeek-V3's recipe quantizes along each matmul's contraction, here
  // N: the gradient's rows in 1 x 128 tiles as the forward's activations,
  // and the weights transposed to [.., K, N] in 128 x 128 blocks (the
  // forward's codes and scales, transposed).
  QuantAttr scheme = weights.getScheme();
  Location loc = op.getLoc();
  auto wType = cast<RankedTensorType>(weights.getInput().getType());
  SmallVector<int64_t> shape(wType.getShape());
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  auto scalesType = cast<RankedTensorType>(weights.getScales().getType());
  bool square = scalesType.getRank() >= 2 &&
                scalesType.getShape()[scalesType.getRank() - 2] !=
                    wType.getShape()[wType.getRank() - 2];
  Type f8 = b.getType<Float8E4M3FNType>();
  // The transposed weights' codes come from the training forward, beside
  // its own: sm_90a quantizes both in one pass over the weights
  // (moe-legalize), and the backward reads them saved.
  OpBuilder forward(weights);
  forward.setInsertionPointAfter(weights);
  Location named = weights.getLoc();
  if (auto step = dyn_cast<NameLoc>(named))
    named = NameLoc::get(
        forward.getStringAttr(step.getName().str() + "_transposed"),
        step.getChildLoc());
  Value transposed = TransposeOp::create(forward, named, wType.clone(shape),
                                         weights.getInput());
  auto w = QuantizeOp::create(
      forward, named, RankedTensorType::get(shape, f8),
      RankedTensorType::get(getScaleShape(scheme, shape, square),
                            scheme.getScaleType()),
      TypeRange(), transposed, scheme);
  auto g = QuantizeOp::create(
      b, loc, gradType.clone(f8),
      RankedTensorType::get(getScaleShape(scheme, gradType.getShape(), false),
                            scheme.getScaleType()),
      TypeRange(), grad, scheme);
  return GroupedMatmulOp::create(b, loc, outType, TypeRange(), g.getData(),
                                 get(w.getData()), counts, offsets,
                                 g.getScales(), get(w.getScales()), Value(),
                                 ActivationAttr(), QuantAttr(), ArrayAttr(),
                                 false, Value(), Value(), Value())
      .getOut();
}

/// The forward value whose gradient a matmul operand's is: the operand, or
/// the input of the moe.quantize that gave it (straight-through).
SmallVector<Value> Differentiator::groups(GroupedMatmulOp op) {
  if (!op.getTokensPerExpert())
    return {};
  return {get(op.getTokensPerExpert()), get(op.getExpertOffsets())};
}

LogicalResult Differentiator::addGrad(Operation *op, Value v, Value grad) {
  if (isa<BlockArgument>(v))
    return setArgGrad(op, v, grad);
  return addAdjoint(op, v, Adjoint{grad});
}

LogicalResult Differentiator::addAdjoint(Operation *op, Value v,
                                         const Adjoint &adjoint) {
  if (!adjoints.try_emplace(v, adjoint).second)
    return op->emitOpError()
           << "has a result used twice, which moe-differentiate does not sum";
  return success();
}

void Differentiator::addDgrad(Value v, Value lhs, Value rhs,
                              ValueRange groupValues) {
  auto lhsType = cast<RankedTensorType>(lhs.getType());
  int64_t k = cast<RankedTensorType>(rhs.getType()).getShape().back();
  auto type = RankedTensorType::get({lhsType.getDimSize(0), k}, b.getF32Type());
  Value acc = tokenAcc.lookup(v);
  Value counts = groupValues.empty() ? Value() : groupValues[0];
  Value offsets = groupValues.empty() ? Value() : groupValues[1];
  tokenAcc[v] = GroupedMatmulDgradOp::create(b, b.getLoc(), type, Type(), lhs,
                                             rhs, counts, offsets, acc, Value())
                    .getOut();
}

Value Differentiator::scattered(Value grad, Value rows, Location loc) {
  auto dispatch = rows.getDefiningOp<DispatchOp>();
  auto type = cast<RankedTensorType>(dispatch.getDispatched().getType());
  Value rowsArg = get(rows);
  Value offsets = get(dispatch.getExpertOffsets());
  return ScatterOp::create(b, loc, type, Type(), grad, rowsArg, offsets,
                           Value(), Value(), dispatch.getAlign())
      .getOut();
}

LogicalResult Differentiator::combineRule(CombineOp op) {
  auto it = adjoints.find(op.getOut());
  if (it == adjoints.end())
    return success();
  Value grad = it->second.value;
  auto dispatch = op.getRows().getDefiningOp<DispatchOp>();
  if (!dispatch)
    return op.emitOpError() << "gathers rows that no moe.dispatch laid out";
  if (isa<BlockArgument>(op.getExpertOut()) ||
      (op.getShared() && isa<BlockArgument>(op.getShared())))
    return op.emitOpError() << "combines an argument of the layer, whose "
                               "gradient moe-differentiate does not give";
  Adjoint rows;
  if (dispatch.isExpertParallel()) {
    rows = epRowGrads(op, dispatch, grad);
  } else {
    rows.value = scattered(grad, op.getRows(), op.getLoc());
    rows.align = dispatch.getAlign();
  }
  if (op.getWeights() && !dispatch.isExpertParallel()) {
    rows.rows = get(op.getRows());
    rows.weights = get(op.getWeights());
    rows.weightsOf = op.getWeights();
    pendingWeights.insert(op.getWeights());
    rows.tokens = grad;
    rows.offsets =
        get(op.getRows().getDefiningOp<DispatchOp>().getExpertOffsets());
  }
  if (failed(addAdjoint(op, op.getExpertOut(), rows)))
    return failure();
  if (!op.getShared())
    return success();
  Adjoint shared{grad};
  if (op.getGate()) {
    shared.gate = get(op.getGate());
    shared.weightsOf = op.getGate();
    pendingWeights.insert(op.getGate());
  }
  return addAdjoint(op, op.getShared(), shared);
}

Adjoint Differentiator::epRowGrads(CombineOp op, DispatchOp dispatch,
                                   Value grad) {
  // The combine's adjoint is a dispatch of the output's gradient: the same
  // expert ids lay it out as the forward laid out the tokens, so the rows
  // the forward saved and these match row for row. The weights travel
  // with it, unapplied (the activation's backward applies them, as on one
  // rank).
  Location loc = op.getLoc();
  auto ranks =
      RankedTensorType::get({int64_t(dispatch.getEpSize())}, b.getI32Type());
  auto counts = cast<RankedTensorType>(dispatch.getTokensPerExpert().getType());
  Value weights = op.getWeights() ? get(op.getWeights()) : Value();
  auto send = EpDispatchSendOp::create(
      b, loc, ranks, dispatch.getRows().getType(), TypeRange(), grad,
      get(dispatch.getExpertIds()), weights,
      b.getI64IntegerAttr(counts.getDimSize(0)), QuantAttr());
  auto gradType = cast<RankedTensorType>(grad.getType());
  auto rowsType = RankedTensorType::get(
      {ShapedType::kDynamic, gradType.getDimSize(1)}, b.getBF16Type());
  SmallVector<Type> rowWeights;
  if (weights)
    rowWeights.push_back(
        RankedTensorType::get({ShapedType::kDynamic, 1}, b.getF32Type()));
  auto recv = EpDispatchRecvOp::create(
      b, loc, rowsType, counts, dispatch.getExpertOffsets().getType(),
      RankedTensorType::get({ShapedType::kDynamic, 2}, b.getI32Type()),
      rowWeights, send.getSent(), UnitAttr(),
      weights ? b.getUnitAttr() : UnitAttr(), QuantAttr());
  epValues[dispatch.getTokensPerExpert()] = recv.getTokensPerExpert();
  epValues[dispatch.getExpertOffsets()] = recv.getExpertOffsets();
  EpExchange &exchange = epExchanges[dispatch];
  exchange.rows = send.getRows();
  exchange.origin = recv.getOrigin();
  Adjoint rows{recv.getDispatched()};
  if (weights) {
    rows.rowWeights = recv.getQuantized()[0];
    rows.weightsOf = op.getWeights();
    exchange.weightsOf = op.getWeights();
    pendingWeights.insert(op.getWeights());
  }
  return rows;
}

LogicalResult Differentiator::gatedDownRule(GroupedMatmulOp op,
                                            ActivationOp activation,
                                            const Adjoint &adjoint) {
  Location loc = op.getLoc();
  SmallVector<Value> g = groups(op);
  Value counts = g.empty() ? Value() : g[0];
  Value offsets = g.empty() ? Value() : g[1];
  Value h = recomputeGateUp ? recomputed(activation.getInput())
                            : get(activation.getInput());
  auto outType = cast<RankedTensorType>(activation.getOut().getType());
  // g = dy W2 for each row, before its weight; with a bias, the weight's
  // gradient also takes each row's dot with it.
  bool weighted = adjoint.weights || adjoint.gate || adjoint.rowWeights;
  if (adjoint.rowWeights && op.getBias())
    return op.emitOpError()
           << "has a bias on an expert-parallel layer's experts, whose "
              "backward moe-differentiate does not build yet (the bias's "
              "gradient needs each row's weight applied to its gradient)";
  Value bias = weighted && op.getBias() ? get(op.getBias()) : Value();
  Value rowGrad =
      bias ? Value()
           : quantizedDgrad(op, adjoint.value, outType, counts, offsets);
  Value biasDot;
  if (!rowGrad) {
    auto dgrad = GroupedMatmulDgradOp::create(
        b, loc, outType,
        bias ? RankedTensorType::get({outType.getDimSize(0), 1}, b.getF32Type())
             : Type(),
        adjoint.value, operandRead(op.getRhs()), counts, offsets, Value(),
        bias);
    rowGrad = dgrad.getOut();
    biasDot = dgrad.getBiasDot();
  }
  Type weightGradType;
  if (adjoint.weights)
    weightGradType = adjoint.weights.getType();
  else if (adjoint.gate)
    weightGradType = RankedTensorType::get(
        cast<RankedTensorType>(adjoint.gate.getType()).getShape(),
        b.getF32Type());
  else if (adjoint.rowWeights)
    weightGradType = adjoint.rowWeights.getType();
  Value gate = adjoint.rowWeights ? adjoint.rowWeights : adjoint.gate;
  auto grads = ActivationGradOp::create(
      b, loc, h.getType(), outType, weightGradType, rowGrad, h, adjoint.rows,
      adjoint.weights, gate, biasDot, activation.getActivation(),
      adjoint.rowWeights ? b.getUnitAttr() : UnitAttr());
  if (adjoint.rowWeights) {
    // Their rows' gradients go home with the rows' (dispatchRule).
    auto exchange = llvm::find_if(epExchanges, [&](auto &entry) {
      return entry.second.weightsOf == adjoint.weightsOf;
    });
    exchange->second.rowWeightGrad = grads.getWeightGrad();
  } else if (adjoint.weightsOf) {
    pendingWeights.erase(adjoint.weightsOf);
    if (failed(addGrad(op, adjoint.weightsOf, grads.getWeightGrad())))
      return failure();
  }
  // dW2 = sum of dy^T (w a): the weight moves to the activation.
  Value rhs = unquantized(op.getRhs());
  auto rhsType = cast<RankedTensorType>(rhs.getType());
  Value rhsGrad = weightGrad(op, gradTypeOf(rhsType), adjoint.value,
                             grads.getWeighted(), counts, offsets);
  if (failed(setArgGrad(op, rhs, rhsGrad)))
    return failure();
  if (Value bias = op.getBias()) {
    // The bias's gradient: the sum of each row's gradient times its weight.
    if (adjoint.gate)
      return op.emitOpError() << "has a bias on gated shared experts, which "
                                 "moe-differentiate does not take";
    Value weighted = adjoint.value;
    if (adjoint.rows && !counts)
      return op.emitOpError() << "has a bias but no experts' groups for rows "
                                 "that a combine weighs, which "
                                 "moe-differentiate does not take";
    if (adjoint.rows)
      weighted =
          ScatterOp::create(b, loc, adjoint.value.getType(), Type(),
                            adjoint.tokens, adjoint.rows, adjoint.offsets,
                            adjoint.weights, Value(), adjoint.align)
              .getOut();
    auto biasType = cast<RankedTensorType>(bias.getType());
    Value biasGrad = GroupedMatmulWgradOp::create(
        b, loc, gradTypeOf(biasType), weighted, Value(), counts, offsets,
        Value(), QuantAttr());
    if (failed(setArgGrad(op, bias, biasGrad)))
      return failure();
  }
  return addGrad(op, activation.getInput(), grads.getInputGrad());
}

LogicalResult Differentiator::matmulRule(GroupedMatmulOp op) {
  if (op.getOutQuantAttr())
    return op.emitOpError() << "quantizes its output in its epilogue: "
                               "moe-differentiate runs before "
                               "moe-fuse-quantization";
  if (isa<BlockArgument>(op.getRhs()) && op.getRhsScale())
    return op.emitOpError()
           << "multiplies quantized weights the layer is given: a layer "
              "trains from bf16 (or f32) weights, which it quantizes itself";
  if (op.getActivationAttr())
    return op.emitOpError() << "applies its activation in its epilogue: "
                               "moe-differentiate splits it off first";
  auto it = adjoints.find(op.getOut());
  if (it == adjoints.end())
    return success();
  Adjoint adjoint = it->second;
  Value lhs = unquantized(op.getLhs()), rhs = unquantized(op.getRhs());
  if (auto activation = lhs.getDefiningOp<ActivationOp>()) {
    if (!activation.getOut().hasOneUse())
      return activation.emitOpError()
             << "feeds more than its down matmul, which moe-differentiate "
                "does not take";
    return gatedDownRule(op, activation, adjoint);
  }
  if (adjoint.rows || adjoint.gate || adjoint.rowWeights)
    return op.emitOpError() << "multiplies rows that are weighted later but "
                               "are not a gated activation's, which "
                               "moe-differentiate does not take";
  Location loc = op.getLoc();
  SmallVector<Value> g = groups(op);
  Value counts = g.empty() ? Value() : g[0];
  Value offsets = g.empty() ? Value() : g[1];
  Value grad = adjoint.value;
  auto f32 = [&](Type type) { return gradTypeOf(type); };
  Value rhsGrad =
      weightGrad(op, f32(rhs.getType()), grad, Value(), counts, offsets);
  if (failed(setArgGrad(op, rhs, rhsGrad)))
    return failure();
  if (Value bias = op.getBias()) {
    Value biasGrad =
        GroupedMatmulWgradOp::create(b, loc, f32(bias.getType()), grad, Value(),
                                     counts, offsets, Value(), QuantAttr());
    if (failed(setArgGrad(op, bias, biasGrad)))
      return failure();
  }
  if (isa<BlockArgument>(lhs)) {
    // The tokens: summed with their other gradients in f32.
    addDgrad(lhs, grad, operandRead(op.getRhs()), g);
    return success();
  }
  Value lhsGrad = quantizedDgrad(op, grad, lhs.getType(), counts, offsets);
  if (!lhsGrad)
    lhsGrad = GroupedMatmulDgradOp::create(b, loc, lhs.getType(), Type(), grad,
                                           operandRead(op.getRhs()), counts,
                                           offsets, Value(), Value())
                  .getOut();
  return addGrad(op, lhs, lhsGrad);
}

LogicalResult Differentiator::dispatchRule(DispatchOp op) {
  auto it = adjoints.find(op.getDispatched());
  if (it == adjoints.end())
    return success();
  if (op.getQuantAttr())
    return op.emitOpError() << "quantizes the rows it scatters: "
                               "moe-differentiate runs before "
                               "moe-fuse-quantization";
  if (!isa<BlockArgument>(op.getHiddenStates()))
    return op.emitOpError() << "dispatches a value that is not the layer's "
                               "input";
  Value rowGrad = it->second.value;
  Value rows;
  if (op.isExpertParallel()) {
    // The dispatch's adjoint is a combine: each row's gradient (and its
    // weight's) goes back to its token's rank, laid out as the output's
    // gradient was sent, so the sum below is one rank's.
    auto exchange = epExchanges.find(op);
    if (exchange == epExchanges.end())
      return op.emitOpError() << "has ep_size = " << op.getEpSize()
                              << " but no moe.combine of its rows, whose "
                                 "backward would send the gradients";
    EpExchange &ep = exchange->second;
    auto gradType = cast<RankedTensorType>(rowGrad.getType());
    auto ranks =
        RankedTensorType::get({int64_t(op.getEpSize())}, b.getI32Type());
    auto back = EpCombineSendOp::create(b, op.getLoc(), ranks, rowGrad,
                                        ep.origin, ep.rowWeightGrad);
    Type valuesType = ep.rowWeightGrad ? ep.weightsOf.getType() : Type();
    auto home = EpCombineRecvOp::create(
        b, op.getLoc(),
        RankedTensorType::get({ShapedType::kDynamic, gradType.getDimSize(1)},
                              gradType.getElementType()),
        valuesType, back.getSent(), ep.rows);
    if (ep.rowWeightGrad) {
      pendingWeights.erase(ep.weightsOf);
      if (failed(addGrad(op, ep.weightsOf, home.getValues())))
        return failure();
    }
    rowGrad = home.getGathered();
    rows = ep.rows;
  } else {
    rows = get(op.getRows());
  }
  // Each token's gradient sums its choices' rows (each times the weight
  // that scaled it in), after its other parts.
  Value scale = op.getScale() ? get(op.getScale()) : Value();
  tokenRows[op.getHiddenStates()] = {rowGrad, rows, scale};
  if (!scale)
    return success();
  // A weight that scaled the token in (Llama-4) takes the dot of its row's
  // gradient and the token.
  Value weightGrad =
      GatherDotOp::create(b, op.getLoc(), scale.getType(), rowGrad,
                          get(op.getHiddenStates()), rows);
  return addGrad(op, op.getScale(), weightGrad);
}

LogicalResult Differentiator::routeRule(RouteOp op) {
  auto it = adjoints.find(op.getWeights());
  if (it == adjoints.end())
    return success();
  if (!isa<BlockArgument>(op.getHiddenStates()))
    return op.emitOpError() << "routes a value that is not the layer's input";
  Location loc = op.getLoc();
  Value bias = op.getBias() ? get(op.getBias()) : Value();
  Value hidden = get(op.getHiddenStates());
  auto hiddenType = cast<RankedTensorType>(hidden.getType());
  auto weightType = cast<RankedTensorType>(op.getRouterWeight().getType());
  auto logitType = RankedTensorType::get(
      {hiddenType.getDimSize(0), weightType.getDimSize(0)}, b.getF32Type());
  // The forward's logits, saved (routeLogits gave the route them): the
  // backward need not multiply the router again.
  Value logits = op.getLogits() ? get(op.getLogits()) : Value();
  Value logitGrad = RouteGradOp::create(
      b, loc, logitType, hidden, get(op.getRouterWeight()), bias, logits,
      get(op.getExpertIds()), it->second.value, op.getRouter());
  Value weightGrad = GroupedMatmulWgradOp::create(
      b, loc, gradTypeOf(weightType), logitGrad, hidden, Value(), Value(),
      Value(), QuantAttr());
  if (failed(setArgGrad(op, op.getRouterWeight(), weightGrad)))
    return failure();
  // A bias that moves the logits takes their gradient; one that only ranks
  // the experts (sigmoid_grouped_topk) takes none.
  if (op.getBias() &&
      op.getRouter().getKind() != RouterKind::SigmoidGroupedTopK) {
    Value biasGrad = GroupedMatmulWgradOp::create(
        b, loc,
        bf16Grads ? Type(gradTypeOf(op.getBias().getType()))
                  : op.getBias().getType(),
        logitGrad, Value(), Value(), Value(), Value(), QuantAttr());
    if (failed(setArgGrad(op, op.getBias(), biasGrad)))
      return failure();
  }
  addDgrad(op.getHiddenStates(), logitGrad, get(op.getRouterWeight()), {});
  return success();
}

LogicalResult Differentiator::rule(Operation *op) {
  b.setLoc(op->getLoc());
  return TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](CombineOp o) { return combineRule(o); })
      .Case([&](GroupedMatmulOp o) { return matmulRule(o); })
      .Case([&](ActivationOp o) {
        // Its gradient came with the down matmul's (gatedDownRule).
        if (adjoints.count(o.getOut()) && !adjoints.count(o.getInput()))
          return LogicalResult(o.emitOpError()
                               << "feeds something other than a matmul, "
                                  "which moe-differentiate does not take");
        return success();
      })
      .Case([&](QuantizeOp) {
        // Straight-through: the matmul reading its codes gave their
        // gradient to its input.
        return success();
      })
      .Case([&](DispatchOp o) { return dispatchRule(o); })
      .Case([&](RouteOp o) { return routeRule(o); })
      .Default([&](Operation *other) -> LogicalResult {
        return other->emitOpError()
               << "has no adjoint rule in moe-differentiate (it builds the "
                  "backward of MoE layers on one rank)";
      });
}

LogicalResult Differentiator::build(Value out, Value outGrad) {
  adjoints[out] = Adjoint{outGrad};
  Block &body = train.getBody().front();
  // Reverse order: an op's rule runs once every op reading its results
  // has run, and a weight whose gradient a later rule gives (combine's)
  // waits for that rule.
  DenseSet<Operation *> done = {body.getTerminator()};
  SmallVector<Operation *> waiting;
  for (Operation &op : llvm::reverse(body.without_terminator()))
    waiting.push_back(&op);
  while (!waiting.empty()) {
    SmallVector<Operation *> later;
    for (Operation *op : waiting) {
      bool ready = llvm::all_of(
          op->getUsers(), [&](Operation *user) { return done.contains(user); });
      if (!ready || llvm::any_of(op->getResults(), [&](Value v) {
            return pendingWeights.contains(v);
          })) {
        later.push_back(op);
        continue;
      }
      if (failed(rule(op)))
        return failure();
      done.insert(op);
    }
    if (later.size() == waiting.size())
      return later.front()->emitOpError()
             << "gives a weight whose gradient no rule computes";
    waiting = std::move(later);
  }
  // The tokens' gradient: every dgrad part in f32, then the experts' rows
  // summed back into their tokens, rounded to bf16 once.
  b.setLoc(train.getLoc());
  SmallVector<Value> results;
  SmallVector<Type> types;
  for (BlockArgument arg : body.getArguments()) {
    Value grad = argGrads.lookup(arg);
    auto rows = tokenRows.find(arg);
    if (rows != tokenRows.end())
      grad = CombineOp::create(
          b, train.getLoc(), arg.getType(), std::get<0>(rows->second),
          std::get<1>(rows->second), std::get<2>(rows->second),
          tokenAcc.lookup(arg), Value());
    else if (Value acc = tokenAcc.lookup(arg))
      grad = acc;
    if (!grad)
      continue;
    results.push_back(grad);
    types.push_back(grad.getType());
    gradOf.push_back(arg.getArgNumber());
  }
  func::ReturnOp::create(b, train.getLoc(), results);
  SmallVector<Type> inputs(backward.getBody().front().getArgumentTypes());
  backward.setFunctionType(b.getFunctionType(inputs, types));
  return success();
}

/// Gives each route of `func` its logits result, which the backward reads
/// (T x E f32, a small part of what the training forward saves) rather
/// than multiply the router again.
static void routeLogits(func::FuncOp func) {
  SmallVector<RouteOp> routes;
  func.walk([&](RouteOp op) {
    if (!op.getLogits())
      routes.push_back(op);
  });
  for (RouteOp op : routes) {
    OpBuilder b(op);
    auto ids = cast<RankedTensorType>(op.getExpertIds().getType());
    auto weight = cast<RankedTensorType>(op.getRouterWeight().getType());
    auto logitType = RankedTensorType::get(
        {ids.getDimSize(0), weight.getDimSize(0)}, b.getF32Type());
    auto route = RouteOp::create(b, op.getLoc(), op.getExpertIds().getType(),
                                 op.getWeights().getType(), logitType,
                                 op.getHiddenStates(), op.getRouterWeight(),
                                 op.getBias(), op.getRouter());
    op.getExpertIds().replaceAllUsesWith(route.getExpertIds());
    op.getWeights().replaceAllUsesWith(route.getWeights());
    op.erase();
  }
}

/// Splits each gated matmul of `func` into the matmul and its activation.
static void splitActivations(func::FuncOp func) {
  SmallVector<GroupedMatmulOp> gated;
  func.walk([&](GroupedMatmulOp op) {
    if (op.getActivationAttr())
      gated.push_back(op);
  });
  for (GroupedMatmulOp op : gated) {
    OpBuilder b(op);
    auto outType = cast<RankedTensorType>(op.getOut().getType());
    auto hType = RankedTensorType::get({outType.getDimSize(0), op.getN()},
                                       outType.getElementType());
    auto matmul = GroupedMatmulOp::create(
        b, op.getLoc(), hType, TypeRange(), op.getLhs(), op.getRhs(),
        op.getTokensPerExpert(), op.getExpertOffsets(), op.getLhsScale(),
        op.getRhsScale(), op.getBias(), ActivationAttr(), QuantAttr(),
        ArrayAttr(), false, Value(), Value(), Value());
    auto activation =
        ActivationOp::create(b, op.getLoc(), outType, Type(), matmul.getOut(),
                             Value(), op.getActivationAttr(), QuantAttr());
    op.getOut().replaceAllUsesWith(activation.getOut());
    op.erase();
  }
}

/// A name for a saved value: its step (the location moe-decompose names it
/// by) and its result's name.
static std::string savedName(Value v) {
  std::string name;
  Operation *op = v.getDefiningOp();
  if (auto step = dyn_cast<NameLoc>(op->getLoc()))
    name = step.getName().str() + ".";
  if (auto asmOp = dyn_cast<OpAsmOpInterface>(op))
    asmOp.getAsmResultNames([&](Value result, StringRef text) {
      if (result == v)
        name += text.str();
    });
  if (name.empty() || name.back() == '.')
    name += op->getName().stripDialect().str() + "." +
            std::to_string(cast<OpResult>(v).getResultNumber());
  return name;
}

/// The rows of `v`'s leading dimension for a call of T tokens: fixed for
/// a static size; a dispatched layout's bound, T x top-k rows plus each
/// expert's alignment padding; else the rows of the operand it follows
/// (a step's first operand with a dynamic leading dimension).
static FailureOr<TokenLinear> rowsOf(Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  if (!type.isDynamicDim(0))
    return TokenLinear{type.getDimSize(0), 0};
  Operation *op = v.getDefiningOp();
  if (!op)
    return TokenLinear{0, 1};
  if (auto dispatch = dyn_cast<DispatchOp>(op);
      dispatch && v != dispatch.getRows()) {
    auto ids = cast<RankedTensorType>(dispatch.getExpertIds().getType());
    auto counts =
        cast<RankedTensorType>(dispatch.getTokensPerExpert().getType());
    FailureOr<TokenLinear> tokens = rowsOf(dispatch.getHiddenStates());
    if (failed(tokens))
      return failure();
    // An expert-parallel rank's: every rank's tokens may choose its
    // experts (a training step takes the same count on every rank).
    TokenLinear rows =
        *tokens * (ids.getDimSize(1) * int64_t(dispatch.getEpSize()));
    rows.fixed += counts.getDimSize(0) * (int64_t(dispatch.getAlign()) - 1);
    return rows;
  }
  for (Value operand : op->getOperands())
    if (auto t = dyn_cast<RankedTensorType>(operand.getType());
        t && t.getRank() > 0 && t.isDynamicDim(0))
      return rowsOf(operand);
  return op->emitOpError() << "gives a saved value whose rows follow from "
                              "no operand";
}

/// The training part of `func`'s interface: what @f_train saves and the
/// gradients @f_backward returns, named after their arguments.
static FailureOr<TrainingAttr> trainingInterface(InterfaceAttr interface,
                                                 ArrayRef<Value> saved,
                                                 ArrayRef<StringRef> savedNames,
                                                 ArrayRef<unsigned> gradOf,
                                                 TypeRange gradTypes) {
  MLIRContext *context = interface.getContext();
  SmallVector<Attribute> savedAttrs, gradients;
  for (auto [v, name] : llvm::zip(saved, savedNames)) {
    FailureOr<TokenLinear> rows = rowsOf(v);
    if (failed(rows))
      return failure();
    savedAttrs.push_back(SavedAttr::get(
        context, name, cast<RankedTensorType>(v.getType()), *rows));
  }
  SmallVector<ArgumentAttr> args = interface.getArgList();
  for (auto [arg, type] : llvm::zip(gradOf, gradTypes))
    gradients.push_back(ArgumentAttr::get(context, args[arg].getName(),
                                          cast<RankedTensorType>(type),
                                          /*output=*/true));
  return TrainingAttr::get(context, ArrayAttr::get(context, savedAttrs),
                           ArrayAttr::get(context, gradients));
}

namespace {
struct DifferentiatePass
    : public moe::impl::DifferentiateBase<DifferentiatePass> {
  using DifferentiateBase::DifferentiateBase;

  void runOnOperation() override {
    SmallVector<func::FuncOp> layers;
    getOperation().walk([&](func::FuncOp func) {
      if (!func.getBody().empty() &&
          !func.getBody().front().getOps<CombineOp>().empty())
        layers.push_back(func);
    });
    for (func::FuncOp func : layers)
      if (failed(differentiate(func)))
        return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp func) {
    FunctionType type = func.getFunctionType();
    if (type.getNumResults() != 1)
      return func.emitOpError() << "returns " << type.getNumResults()
                                << " values; moe-differentiate takes a "
                                   "layer's one output";
    OpBuilder b(func);
    b.setInsertionPointAfter(func);
    auto train = cast<func::FuncOp>(b.clone(*func));
    train.setName((func.getName() + "_train").str());
    splitActivations(train);
    routeLogits(train);
    // The backward sums over each expert's rows: their order must be the
    // same on every call.
    train.walk([](DispatchOp op) { op.setOrdered(true); });
    auto backward = func::FuncOp::create(b, func.getLoc(),
                                         (func.getName() + "_backward").str(),
                                         b.getFunctionType({}, {}));
    Block *entry = backward.addEntryBlock();
    for (Type input : type.getInputs())
      entry->addArgument(input, func.getLoc());
    Value outGrad = entry->addArgument(type.getResult(0), func.getLoc());

    Differentiator d(train, backward, recompute, bf16Grads);
    auto ret = cast<func::ReturnOp>(train.getBody().front().getTerminator());
    if (failed(d.build(ret.getOperand(0), outGrad))) {
      train.erase();
      backward.erase();
      return failure();
    }
    // The forward returns what the backward reads, named in `moe.saved`.
    SmallVector<Value> results(ret.getOperands());
    SmallVector<Attribute> names;
    for (Value v : d.saved) {
      results.push_back(v);
      names.push_back(b.getStringAttr(savedName(v)));
    }
    ret->setOperands(results);
    train.setFunctionType(
        b.getFunctionType(type.getInputs(), ValueRange(results).getTypes()));
    train->setAttr("moe.saved", b.getArrayAttr(names));
    backward->setAttr("moe.gradients",
                      b.getDenseI64ArrayAttr(SmallVector<int64_t>(
                          d.gradOf.begin(), d.gradOf.end())));
    // A layer compiled into a library exports both (#moe.training).
    if (auto interface =
            func->getAttrOfType<InterfaceAttr>(InterfaceAttr::getAttrName())) {
      SmallVector<StringRef> savedNames = llvm::map_to_vector(
          names, [](Attribute a) { return cast<StringAttr>(a).getValue(); });
      FailureOr<TrainingAttr> training =
          trainingInterface(interface, d.saved, savedNames, d.gradOf,
                            backward.getFunctionType().getResults());
      if (failed(training))
        return failure();
      func->setAttr(InterfaceAttr::getAttrName(),
                    interface.withTraining(*training));
    }
    for (Operation *op : {train.getOperation(), backward.getOperation()}) {
      op->removeAttr("moe.interface");
      if (func->hasAttr("llvm.emit_c_interface"))
        op->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    }
    return success();
  }
};
} // namespace
