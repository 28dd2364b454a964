//===- MoeOps.cpp - moe dialect operations --------------------------------===//
//
// Every verifier rule names the operand, the dimension and what it means, so
// a user can tell which weight or config value is wrong.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"

#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <map>

using namespace mlir;
using namespace mlir::moe;

#define GET_OP_CLASSES
#include "dialects/moe/MoeOps.cpp.inc"

namespace {
/// A dimension a verifier expects. Token and row counts may be dynamic and
/// zero; every other size must be static and positive, because kernels are
/// specialized on it.
struct Dim {
  int64_t size; // ShapedType::kDynamic: any size.
  StringRef meaning;
  bool isCount;
};
} // namespace

static constexpr int64_t kAny = ShapedType::kDynamic;

static Dim size(int64_t size, StringRef meaning) {
  return {size, meaning, false};
}
static Dim count(int64_t size, StringRef meaning) {
  return {size, meaning, true};
}

static std::string formatShape(ArrayRef<int64_t> shape) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleave(
      shape, os,
      [&](int64_t d) {
        if (ShapedType::isDynamic(d))
          os << "?";
        else
          os << d;
      },
      ", ");
  return text + "]";
}

/// Checks `value`'s shape against `dims`.
static LogicalResult checkShape(Operation *op, StringRef name, Value value,
                                ArrayRef<Dim> dims) {
  auto type = cast<RankedTensorType>(value.getType());
  if (type.getRank() != static_cast<int64_t>(dims.size())) {
    auto diag = op->emitOpError()
                << name << " must have rank " << dims.size() << " (";
    llvm::interleave(
        dims, diag, [&](const Dim &d) { diag << d.meaning; }, " x ");
    return diag << "), but has type " << type;
  }
  for (auto [i, dim] : llvm::enumerate(dims)) {
    int64_t actual = type.getDimSize(i);
    if (ShapedType::isDynamic(actual)) {
      if (!dim.isCount)
        return op->emitOpError() << name << " dimension " << i << " ("
                                 << dim.meaning << ") must be static";
      continue;
    }
    if (!dim.isCount && actual < 1)
      return op->emitOpError() << name << " dimension " << i << " ("
                               << dim.meaning << ") must be positive";
    if (!ShapedType::isDynamic(dim.size) && actual != dim.size)
      return op->emitOpError()
             << name << " dimension " << i << " (" << dim.meaning
             << ") must be " << dim.size << ", but is " << actual;
  }
  return success();
}

/// Checks a value a row: [rows], or [rows, 1] (a backward's routing
/// weights as an expert-parallel receive lays them out).
static LogicalResult checkColumn(Operation *op, StringRef name, Value value,
                                 int64_t rows) {
  if (cast<RankedTensorType>(value.getType()).getRank() == 2)
    return checkShape(op, name, value,
                      {count(rows, "rows"), size(1, "one value")});
  return checkShape(op, name, value, {count(rows, "rows")});
}

static ArrayRef<int64_t> shapeOf(Value value) {
  return cast<RankedTensorType>(value.getType()).getShape();
}
static Type elementTypeOf(Value value) {
  return cast<RankedTensorType>(value.getType()).getElementType();
}

QuantAttr GroupedMatmulOp::getScheme() {
  if (!getLhsScale())
    return {};
  Type scaleType = elementTypeOf(getLhsScale());
  return QuantAttr::get(getContext(),
                        isa<Float8E8M0FNUType>(scaleType)
                            ? QuantKind::MXFP8
                            : QuantKind::FP8Block128,
                        ScaleRounding::Floor);
}

int64_t GroupedMatmulOp::getN() {
  auto rhs = cast<RankedTensorType>(getRhs().getType());
  return rhs.getDimSize(rhs.getRank() - (getTransposeRhs() ? 1 : 2));
}

int64_t GroupedMatmulOp::getK() {
  auto rhs = cast<RankedTensorType>(getRhs().getType());
  return rhs.getDimSize(rhs.getRank() - (getTransposeRhs() ? 2 : 1));
}

MatmulConfigAttr GroupedMatmulOp::getConfigFor(int64_t tokens) {
  if (ArrayAttr configs = getConfigsAttr())
    for (auto config : configs.getAsRange<MatmulConfigAttr>())
      if (config.getTokens() == tokens)
        return config;
  return {};
}

/// Checks that `scales` fit `data` under `quant`; FP8 block-128 weights may
/// use one scale per 128 x 128 block when `allowSquareBlocks`.
static LogicalResult checkScales(Operation *op, StringRef name, Value scales,
                                 ArrayRef<int64_t> dataShape, QuantAttr quant,
                                 bool allowSquareBlocks) {
  auto type = cast<RankedTensorType>(scales.getType());
  Type expectedElement = quant.getScaleType();
  StringRef scheme = stringifyQuantKind(quant.getKind());
  if (type.getElementType() != expectedElement)
    return op->emitOpError()
           << name << " must hold " << expectedElement << " scales for "
           << scheme << ", but holds " << type.getElementType();
  SmallVector<SmallVector<int64_t>> candidates = {
      getScaleShape(quant, dataShape, /*squareBlocks=*/false)};
  if (allowSquareBlocks && quant.getKind() == QuantKind::FP8Block128 &&
      dataShape.size() >= 2)
    candidates.push_back(getScaleShape(quant, dataShape, true));
  for (const auto &shape : candidates)
    if (succeeded(verifyCompatibleShape(type.getShape(), shape)))
      return success();
  auto diag = op->emitOpError()
              << name << " must have shape " << formatShape(candidates[0]);
  if (candidates.size() > 1)
    diag << " or " << formatShape(candidates[1]) << " (128 x 128 blocks)";
  return diag << " for " << scheme << " blocks of " << quant.getBlockSize()
              << " along the last dimension of " << formatShape(dataShape)
              << ", but has " << formatShape(type.getShape());
}

static LogicalResult requireTogether(Operation *op, Value a, StringRef aName,
                                     Value b, StringRef bName) {
  if (static_cast<bool>(a) != static_cast<bool>(b))
    return op->emitOpError()
           << aName << " and " << bName << " must be given together";
  return success();
}

/// A pair of weights (w13 and w2, or the shared experts'): both bf16, or
/// both FP8 with the config's scheme and scales given by `keyword`.
static LogicalResult checkWeightPair(Operation *op, StringRef name13, Value w13,
                                     Value scale13, StringRef name2, Value w2,
                                     Value scale2, QuantAttr quant,
                                     StringRef keyword) {
  Type weightType = elementTypeOf(w13);
  if (weightType != elementTypeOf(w2))
    return op->emitOpError() << name13 << " and " << name2
                             << " must have the same element type, but are "
                             << weightType << " and " << elementTypeOf(w2);
  std::string scaleName13 = (name13 + "_scale").str();
  std::string scaleName2 = (name2 + "_scale").str();
  if (failed(requireTogether(op, scale13, scaleName13, scale2, scaleName2)))
    return failure();
  if (isa<Float8E4M3FNType>(weightType)) {
    if (!quant)
      return op->emitOpError() << "f8E4M3FN " << name13 << " and " << name2
                               << " need a quant scheme in the config";
    if (!scale13)
      return op->emitOpError()
             << "f8E4M3FN " << name13 << " and " << name2 << " need " << keyword
             << "(" << scaleName13 << ", " << scaleName2 << ")";
    return failure(
        failed(
            checkScales(op, scaleName13, scale13, shapeOf(w13), quant, true)) ||
        failed(checkScales(op, scaleName2, scale2, shapeOf(w2), quant, true)));
  }
  if (scale13)
    return op->emitOpError() << scaleName13 << " and " << scaleName2
                             << " are given, but " << name13 << " and " << name2
                             << " are " << weightType << ", not f8E4M3FN";
  return success();
}

//===----------------------------------------------------------------------===//
// LayerOp
//===----------------------------------------------------------------------===//

LogicalResult LayerOp::verify() {
  ConfigAttr config = getConfig();
  int64_t experts = config.getExperts(), local = config.getLocalExperts();
  int64_t hidden = config.getHidden(), inter = config.getIntermediate();
  int64_t sharedInter = config.getSharedIntermediate();
  Operation *op = getOperation();

  if (failed(checkShape(op, "hidden_states", getHiddenStates(),
                        {count(kAny, "tokens"), size(hidden, "hidden")})))
    return failure();
  int64_t tokens = shapeOf(getHiddenStates())[0];
  if (getRouterLogits() &&
      failed(checkShape(op, "router_logits", getRouterLogits(),
                        {count(tokens, "tokens"), size(experts, "experts")})))
    return failure();
  if (failed(checkShape(op, "result", getOut(),
                        {count(tokens, "tokens"), size(hidden, "hidden")})) ||
      failed(checkShape(op, "router_weight", getRouterWeight(),
                        {size(experts, "experts"), size(hidden, "hidden")})))
    return failure();
  if (getRouterBias() && failed(checkShape(op, "router_bias", getRouterBias(),
                                           {size(experts, "experts")})))
    return failure();

  if (failed(checkShape(op, "w13", getW13(),
                        {size(local, "local experts"),
                         size(2 * inter, "gate and up rows"),
                         size(hidden, "hidden")})) ||
      failed(checkShape(op, "w2", getW2(),
                        {size(local, "local experts"), size(hidden, "hidden"),
                         size(inter, "intermediate")})))
    return failure();

  if (failed(checkWeightPair(op, "w13", getW13(), getW13Scale(), "w2", getW2(),
                             getW2Scale(), config.getQuant(), "scales")))
    return failure();

  if (failed(requireTogether(op, getW13Bias(), "w13_bias", getW2Bias(),
                             "w2_bias")))
    return failure();
  if (getW13Bias() &&
      (failed(checkShape(op, "w13_bias", getW13Bias(),
                         {size(local, "local experts"),
                          size(2 * inter, "gate and up rows")})) ||
       failed(
           checkShape(op, "w2_bias", getW2Bias(),
                      {size(local, "local experts"), size(hidden, "hidden")}))))
    return failure();

  if (failed(requireTogether(op, getSharedW13(), "shared_w13", getSharedW2(),
                             "shared_w2")))
    return failure();
  if (sharedInter > 0 && !getSharedW13())
    return emitOpError() << "the config has shared experts "
                            "(shared_intermediate = "
                         << sharedInter
                         << "), but no shared(shared_w13, shared_w2) weights";
  if (sharedInter == 0 && getSharedW13())
    return emitOpError() << "shared expert weights are given, but the config "
                            "has no shared experts (shared_intermediate = 0)";
  if (getSharedW13() &&
      (failed(checkShape(op, "shared_w13", getSharedW13(),
                         {size(2 * sharedInter, "shared gate and up rows"),
                          size(hidden, "hidden")})) ||
       failed(checkShape(op, "shared_w2", getSharedW2(),
                         {size(hidden, "hidden"),
                          size(sharedInter, "shared intermediate")})) ||
       failed(checkWeightPair(op, "shared_w13", getSharedW13(),
                              getSharedW13Scale(), "shared_w2", getSharedW2(),
                              getSharedW2Scale(), config.getQuant(),
                              "shared_scales"))))
    return failure();
  if (!getSharedW13() && getSharedW13Scale())
    return emitOpError() << "shared_scales are given without shared expert "
                            "weights";
  if (config.getSharedGate() != static_cast<bool>(getSharedGate()))
    return emitOpError() << (config.getSharedGate()
                                 ? "the config has shared_gate = true, but no "
                                   "shared gate weight is given"
                                 : "a shared gate weight is given, but the "
                                   "config has shared_gate = false");
  if (getSharedGate() &&
      failed(checkShape(op, "shared_gate", getSharedGate(),
                        {size(1, "one gate"), size(hidden, "hidden")})))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// AttentionOp
//===----------------------------------------------------------------------===//

/// The shapes attention takes: query [B, Sq, Hq, D], key [B, Skv, Hkv, D],
/// value [B, Skv, Hkv, Dv], result [B, Sq, Hq, Dv], Hq a multiple of Hkv.
static LogicalResult verifyAttentionShapes(Operation *op, Value query,
                                           Value key, Value value, Value out) {
  if (failed(checkShape(op, "query", query,
                        {count(kAny, "batch"), count(kAny, "query positions"),
                         size(kAny, "query heads"), size(kAny, "head size")})))
    return failure();
  ArrayRef<int64_t> q = shapeOf(query);
  if (failed(
          checkShape(op, "key", key,
                     {count(q[0], "batch"), count(kAny, "key positions"),
                      size(kAny, "key/value heads"), size(q[3], "head size")})))
    return failure();
  ArrayRef<int64_t> k = shapeOf(key);
  if (failed(checkShape(op, "value", value,
                        {count(q[0], "batch"), count(k[1], "key positions"),
                         size(k[2], "key/value heads"),
                         size(kAny, "value head size")})) ||
      failed(checkShape(op, "result", out,
                        {count(q[0], "batch"), count(q[1], "query positions"),
                         size(q[2], "query heads"),
                         size(shapeOf(value)[3], "value head size")})))
    return failure();
  if (q[2] % k[2] != 0)
    return op->emitOpError()
           << "query heads (" << q[2]
           << ") must be a multiple of key/value heads (" << k[2] << ")";
  return success();
}

static LogicalResult verifyScale(Operation *op, std::optional<APFloat> scale) {
  if (scale && !(scale->convertToDouble() > 0.0 &&
                 std::isfinite(scale->convertToDouble())))
    return op->emitOpError() << "scale must be a positive finite number";
  return success();
}

LogicalResult AttentionOp::verify() {
  return failure(
      failed(verifyAttentionShapes(getOperation(), getQuery(), getKey(),
                                   getValue(), getOut())) ||
      failed(verifyScale(getOperation(), getScale())));
}

//===----------------------------------------------------------------------===//
// TiledAttentionOp
//===----------------------------------------------------------------------===//

TiledAttentionOp::Placement TiledAttentionOp::placement(AttentionStageKind kind,
                                                        int64_t group) {
  for (auto [slot, stages] : llvm::enumerate(getSchedule()))
    for (auto [position, attr] :
         llvm::enumerate(cast<ArrayAttr>(stages).getValue())) {
      auto stage = cast<StageAttr>(attr);
      if (stage.getKind() == kind && stage.getGroup() == group)
        return {int64_t(slot), int64_t(position), stage.getTile()};
    }
  return {-1, -1, 0};
}

LogicalResult TiledAttentionOp::verify() {
  Operation *op = getOperation();
  if (failed(verifyAttentionShapes(op, getQuery(), getKey(), getValue(),
                                   getOut())) ||
      failed(verifyScale(op, getScale())))
    return failure();
  ArrayAttr schedule = getSchedule();
  if (schedule.empty())
    return emitOpError() << "schedule must have at least one slot";
  int64_t groups = getGroups();
  // Each group runs each stage once per key tile.
  std::map<std::pair<int64_t, int64_t>, int> seen;
  for (auto [slot, stages] : llvm::enumerate(schedule)) {
    auto list = dyn_cast<ArrayAttr>(stages);
    if (!list)
      return emitOpError() << "schedule slot " << slot
                           << " must be an array of #moe.stage";
    for (Attribute attr : list) {
      auto stage = dyn_cast<StageAttr>(attr);
      if (!stage)
        return emitOpError() << "schedule slot " << slot << " holds " << attr
                             << ", not a #moe.stage";
      if (stage.getGroup() < 0 || stage.getGroup() >= groups)
        return emitOpError()
               << "schedule slot " << slot << " names row group "
               << stage.getGroup() << ", but there are " << groups;
      if (++seen[{stage.getGroup(), int64_t(stage.getKind())}] > 1)
        return emitOpError()
               << "schedule runs "
               << stringifyAttentionStageKind(stage.getKind())
               << " of row group " << stage.getGroup() << " more than once";
    }
  }
  // When a stage of key tile j runs, counted in slots from the iteration
  // of tile j, and where within its slot.
  int64_t slots = schedule.size();
  auto when = [&](AttentionStageKind kind, int64_t group) {
    Placement p = placement(kind, group);
    return std::make_pair(-p.tile * slots + p.slot, p.position);
  };
  using K = AttentionStageKind;
  for (int64_t g = 0; g < groups; ++g) {
    for (K kind : {K::QK, K::Mask, K::Max, K::Exp, K::Rescale, K::Sum, K::PV})
      if (placement(kind, g).slot < 0)
        return emitOpError()
               << "schedule has no " << stringifyAttentionStageKind(kind)
               << " stage for row group " << g;
    // What each stage reads: qk's S (a later slot: the matrix engine runs
    // asynchronously), the max, P and the scaled output.
    struct Edge {
      K from, to;
      bool laterSlot;
    } edges[] = {{K::QK, K::Mask, true},      {K::Mask, K::Max, false},
                 {K::Max, K::Exp, false},     {K::Exp, K::Sum, false},
                 {K::Max, K::Rescale, false}, {K::Exp, K::PV, true},
                 {K::Rescale, K::PV, true}};
    for (Edge edge : edges) {
      auto from = when(edge.from, g), to = when(edge.to, g);
      bool ok = edge.laterSlot ? to.first > from.first : from < to;
      if (!ok)
        return emitOpError()
               << "schedule runs " << stringifyAttentionStageKind(edge.to)
               << " of row group " << g << " before the "
               << stringifyAttentionStageKind(edge.from) << " it reads";
    }
    // The rescale of tile j scales the output that pv of tile j - 1 added to.
    if (when(K::PV, g).first - slots >= when(K::Rescale, g).first)
      return emitOpError() << "schedule rescales row group " << g
                           << "'s output before pv of the previous tile";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// RouteOp
//===----------------------------------------------------------------------===//

/// A router's operands and the choices it gives or takes: hidden_states
/// [T, H], router_weight [E, H], bias [E], `choicesName` [T, k] (i32) and
/// `weightsName` [T, k] (f32). Sets T, E and k.
static LogicalResult checkRouter(Operation *op, Value hidden, Value weight,
                                 Value bias, Value ids, Value weights,
                                 StringRef weightsName, int64_t &tokens,
                                 int64_t &experts, int64_t &topK) {
  if (failed(checkShape(op, "hidden_states", hidden,
                        {count(kAny, "tokens"), size(kAny, "hidden")})))
    return failure();
  tokens = shapeOf(hidden)[0];
  if (failed(checkShape(
          op, "router_weight", weight,
          {size(kAny, "experts"), size(shapeOf(hidden)[1], "hidden")})))
    return failure();
  experts = shapeOf(weight)[0];
  if ((bias &&
       failed(checkShape(op, "bias", bias, {size(experts, "experts")}))) ||
      failed(checkShape(op, "expert_ids", ids,
                        {count(tokens, "tokens"), size(kAny, "top-k")})))
    return failure();
  topK = shapeOf(ids)[1];
  return checkShape(op, weightsName, weights,
                    {count(tokens, "tokens"), size(topK, "top-k")});
}

LogicalResult RouteOp::verify() {
  Operation *op = getOperation();
  int64_t tokens, experts, topK;
  if (failed(checkRouter(op, getHiddenStates(), getRouterWeight(), getBias(),
                         getExpertIds(), getWeights(), "weights", tokens,
                         experts, topK)))
    return failure();
  if (getLogits() &&
      failed(checkShape(op, "logits", getLogits(),
                        {count(tokens, "tokens"), size(experts, "experts")})))
    return failure();
  if (topK > experts)
    return emitOpError() << "top-k (" << topK
                         << ") must not exceed the number of experts ("
                         << experts << ")";
  return getRouter().verifyFor([&] { return emitOpError(); }, experts, topK);
}

//===----------------------------------------------------------------------===//
// DispatchOp
//===----------------------------------------------------------------------===//

/// A result that is quantized on the way out (with `quant`): E4M3 codes
/// with scales as moe.quantize gives them; otherwise real, with no scales.
static LogicalResult verifyQuantizedResult(Operation *op, StringRef name,
                                           Value result, Value scales,
                                           QuantAttr quant) {
  Type element = elementTypeOf(result);
  if (!quant) {
    if (scales)
      return op->emitOpError()
             << "has " << name << " scales but no quant scheme";
    if (isa<Float8E4M3FNType>(element))
      return op->emitOpError() << name
                               << " is f8E4M3FN, which needs a "
                                  "quant scheme";
    return success();
  }
  if (!isa<Float8E4M3FNType>(element))
    return op->emitOpError() << "quantizes " << name << ", which must then "
                             << "be f8E4M3FN, but is " << element;
  if (!scales)
    return op->emitOpError()
           << "quantizes " << name << ", but has no result for its scales";
  return checkScales(op, (name + " scales").str(), scales, shapeOf(result),
                     quant, /*allowSquareBlocks=*/false);
}

namespace {
/// The shape the dispatches share: tokens, hidden size and top-k.
struct Choices {
  int64_t tokens, hidden, topK;
};
} // namespace

/// `hidden_states` [T, H], `expert_ids` [T, k] and, if any, `scale` [T, k].
static FailureOr<Choices> checkChoices(Operation *op, Value hiddenStates,
                                       Value expertIds, Value scale) {
  if (failed(checkShape(op, "hidden_states", hiddenStates,
                        {count(kAny, "tokens"), size(kAny, "hidden")})))
    return failure();
  int64_t tokens = shapeOf(hiddenStates)[0];
  if (failed(checkShape(op, "expert_ids", expertIds,
                        {count(tokens, "tokens"), size(kAny, "top-k")})))
    return failure();
  int64_t topK = shapeOf(expertIds)[1];
  if (scale &&
      failed(checkShape(op, "scale", scale,
                        {count(tokens, "tokens"), size(topK, "top-k")})))
    return failure();
  return Choices{tokens, shapeOf(hiddenStates)[1], topK};
}

LogicalResult DispatchOp::verify() {
  Operation *op = getOperation();
  if (getAlign() < 1)
    return emitOpError() << "align must be at least 1, but is " << getAlign();
  if (getEpSize() < 1)
    return emitOpError() << "ep_size must be at least 1, but is "
                         << getEpSize();
  FailureOr<Choices> choices =
      checkChoices(op, getHiddenStates(), getExpertIds(), getScale());
  if (failed(choices))
    return failure();
  auto [tokens, hidden, topK] = *choices;
  if (failed(checkShape(op, "dispatched", getDispatched(),
                        {count(kAny, "rows"), size(hidden, "hidden")})) ||
      failed(checkShape(op, "tokens_per_expert", getTokensPerExpert(),
                        {size(kAny, "experts")})))
    return failure();
  int64_t experts = shapeOf(getTokensPerExpert())[0];
  if (failed(checkShape(op, "expert_offsets", getExpertOffsets(),
                        {size(experts + 1, "experts + 1")})) ||
      failed(checkShape(op, "rows", getRows(),
                        {count(tokens, "tokens"), size(topK, "top-k")})))
    return failure();
  size_t extra = getQuantized().size();
  if (extra != 0 && extra != 1 && extra != 3)
    return emitOpError() << "has " << extra
                         << " quantized results: none, the dispatched rows' "
                            "scales, or those and the quantized tokens with "
                            "their scales";
  if (failed(verifyQuantizedResult(op, "dispatched", getDispatched(),
                                   getDispatchedScales(), getQuantAttr())))
    return failure();
  if (!getTokens())
    return success();
  if (!getQuantAttr() || getScale())
    return emitOpError() << "gives quantized tokens only when it quantizes "
                            "and does not scale its rows";
  if (failed(checkShape(op, "tokens", getTokens(),
                        {count(tokens, "tokens"), size(hidden, "hidden")})))
    return failure();
  return verifyQuantizedResult(op, "tokens", getTokens(), getTokenScales(),
                               getQuantAttr());
}

//===----------------------------------------------------------------------===//
// QuantizeOp / DequantizeOp
//===----------------------------------------------------------------------===//

/// Shared by quantize and dequantize: `data` and `real` have one shape and
/// `scales` fit it.
static LogicalResult verifyQuantPair(Operation *op, ArrayRef<int64_t> realShape,
                                     StringRef realName, Value data,
                                     Value scales, QuantAttr scheme) {
  ArrayRef<int64_t> shape = shapeOf(data);
  if (shape.empty())
    return op->emitOpError() << "quantized data must have rank 1 or more";
  if (failed(verifyCompatibleShape(realShape, shape)))
    return op->emitOpError()
           << realName << " shape " << formatShape(realShape)
           << " differs from the quantized data's " << formatShape(shape);
  if (ShapedType::isDynamic(shape.back()) || shape.back() < 1)
    return op->emitOpError() << "the quantized (last) dimension must be "
                                "static and positive";
  return checkScales(op, "scales", scales, shape, scheme, true);
}

LogicalResult QuantizeOp::verify() {
  SmallVector<int64_t> shape(shapeOf(getInput()));
  if (getTranspose()) {
    size_t rank = shape.size();
    if (rank < 2 || ShapedType::isDynamic(shape[rank - 1]) ||
        ShapedType::isDynamic(shape[rank - 2]))
      return emitOpError() << "transpose swaps the last two dimensions of the "
                              "input, which must be static (input shape "
                           << formatShape(shapeOf(getInput())) << ")";
    std::swap(shape[rank - 1], shape[rank - 2]);
  }
  if (failed(verifyQuantPair(getOperation(), shape,
                             getTranspose() ? "transposed input" : "input",
                             getData(), getScales(), getScheme())))
    return failure();
  if (getTransposed().empty())
    return success();
  size_t rank = shape.size();
  auto scales = cast<RankedTensorType>(getScales().getType());
  bool square = getScheme().getKind() == QuantKind::FP8Block128 &&
                scales.getRank() == int64_t(rank) && rank >= 2 &&
                scales.getDimSize(rank - 2) != ShapedType::kDynamic &&
                scales.getDimSize(rank - 2) != shape[rank - 2];
  if (getTranspose() || getTransposed().size() != 2 || !square ||
      ShapedType::isDynamic(shape[rank - 1]) ||
      ShapedType::isDynamic(shape[rank - 2]))
    return emitOpError() << "gives the transpose's codes and scales (two "
                            "results) only for 128 x 128 blocks of static "
                            "last dimensions, without transpose";
  std::swap(shape[rank - 1], shape[rank - 2]);
  return verifyQuantPair(getOperation(), shape, "transposed input",
                         getTransposed()[0], getTransposed()[1], getScheme());
}

LogicalResult TransposeOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "must keep the element type: "
                         << in.getElementType() << " becomes "
                         << out.getElementType();
  int64_t rank = in.getRank();
  if (rank < 2 || out.getRank() != rank)
    return emitOpError() << "takes and gives the same rank of at least 2, "
                            "not "
                         << rank << " and " << out.getRank();
  if (in.isDynamicDim(rank - 1) || in.isDynamicDim(rank - 2))
    return emitOpError() << "swaps static dimensions only";
  SmallVector<int64_t> swapped(in.getShape());
  std::swap(swapped[rank - 1], swapped[rank - 2]);
  if (ArrayRef<int64_t>(swapped) != out.getShape())
    return emitOpError() << "must give " << in.clone(swapped) << ", not "
                         << out;
  return success();
}

LogicalResult PadOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "must keep the element type: "
                         << in.getElementType() << " becomes "
                         << out.getElementType();
  if (in.getRank() != out.getRank() || in.getRank() < 1)
    return emitOpError() << "must keep the rank (at least 1): " << in.getRank()
                         << " becomes " << out.getRank();
  int64_t last = in.getRank() - 1;
  auto size = [](int64_t s) {
    return ShapedType::isDynamic(s) ? std::string("?") : std::to_string(s);
  };
  for (int64_t d = 0; d < last; ++d)
    if (in.getDimSize(d) != out.getDimSize(d))
      return emitOpError() << "may change only the last dimension, but "
                              "dimension "
                           << d << " is " << size(in.getDimSize(d)) << " and "
                           << size(out.getDimSize(d));
  if (in.isDynamicDim(last) || out.isDynamicDim(last) ||
      out.getDimSize(last) < in.getDimSize(last))
    return emitOpError() << "must extend a static last dimension: "
                         << size(in.getDimSize(last)) << " becomes "
                         << size(out.getDimSize(last));
  return success();
}

LogicalResult DequantizeOp::verify() {
  return verifyQuantPair(getOperation(), shapeOf(getOutput()), "output",
                         getData(), getScales(), getScheme());
}

//===----------------------------------------------------------------------===//
// GroupedMatmulOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedMatmulOp::verify() {
  Operation *op = getOperation();
  bool grouped = static_cast<bool>(getTokensPerExpert());
  if (failed(requireTogether(op, getTokensPerExpert(), "tokens_per_expert",
                             getExpertOffsets(), "expert_offsets")) ||
      failed(requireTogether(op, getLhsScale(), "lhs_scale", getRhsScale(),
                             "rhs_scale")) ||
      failed(checkShape(op, "lhs", getLhs(),
                        {count(kAny, "rows"), size(kAny, "K")})))
    return failure();
  int64_t rows = shapeOf(getLhs())[0], k = shapeOf(getLhs())[1];

  // [.., N, K], or [.., K, N] read transposed.
  bool transposed = getTransposeRhs();
  SmallVector<Dim> nk = {size(kAny, "N"), size(k, "K")};
  if (transposed)
    std::swap(nk[0], nk[1]);
  if (transposed && (getLhsScale() || getBias() || getOutQuant() ||
                     !elementTypeOf(getLhs()).isBF16()))
    return emitOpError() << "transpose_rhs takes bf16 operands without a "
                            "bias or quantized result";
  bool activationGrad = isActivationGrad();
  if (transposed && getActivation() && !activationGrad)
    return emitOpError() << "transpose_rhs takes an activation only as its "
                            "backward (activation_input)";
  if (activationGrad && !getActivation())
    return emitOpError() << "activation_input (an activation's backward "
                            "epilogue) needs an activation";
  if (activationGrad && !transposed && !getLhsScale())
    return emitOpError() << "activation_input (an activation's backward "
                            "epilogue) takes bf16 weights read along N "
                            "(transpose_rhs) or quantized ones transposed";
  if (activationGrad && (getBias() || getOutQuant()))
    return emitOpError() << "activation_input (an activation's backward "
                            "epilogue) takes no bias or quantized result";
  if ((getRowWeights() || getInPlace()) && !activationGrad)
    return emitOpError() << (getInPlace() ? "in_place" : "row_weights")
                         << " needs activation_input";
  size_t extras = (getOutQuant() ? 1 : 0) + (getRowWeights() ? 1 : 0);
  if (getExtras().size() != extras)
    return emitOpError() << "has " << getExtras().size()
                         << " results beside `out`, but " << extras
                         << " are expected: the scales with out_quant, the "
                            "row_dots with row_weights";
  if (getRowTerm() && !getRowDots())
    return emitOpError() << "row_term needs row_weights";
  int64_t experts = 0;
  if (grouped) {
    if (failed(checkShape(op, "rhs", getRhs(),
                          {size(kAny, "experts"), nk[0], nk[1]})))
      return failure();
    experts = shapeOf(getRhs())[0];
    if (failed(checkShape(op, "tokens_per_expert", getTokensPerExpert(),
                          {size(experts, "experts")})) ||
        failed(checkShape(op, "expert_offsets", getExpertOffsets(),
                          {size(experts + 1, "experts + 1")})))
      return failure();
  } else if (failed(checkShape(op, "rhs", getRhs(), {nk[0], nk[1]}))) {
    return failure();
  }
  int64_t n = getN();

  Type lhsType = elementTypeOf(getLhs()), rhsType = elementTypeOf(getRhs());
  if (lhsType != rhsType)
    return emitOpError() << "lhs and rhs must have the same element type, but "
                            "are "
                         << lhsType << " and " << rhsType;
  if (isa<Float8E4M3FNType>(lhsType) != static_cast<bool>(getLhsScale()))
    return emitOpError() << (getLhsScale()
                                 ? "scales are given for bf16 operands"
                                 : "f8E4M3FN operands need scales(lhs_scale, "
                                   "rhs_scale)");
  if (getLhsScale()) {
    Type scaleType = elementTypeOf(getLhsScale());
    if (scaleType != elementTypeOf(getRhsScale()))
      return emitOpError() << "lhs_scale and rhs_scale must use one scheme, "
                              "but hold "
                           << scaleType << " and "
                           << elementTypeOf(getRhsScale());
    QuantAttr scheme = getScheme();
    if (failed(checkScales(op, "lhs_scale", getLhsScale(), shapeOf(getLhs()),
                           scheme, false)) ||
        failed(checkScales(op, "rhs_scale", getRhsScale(), shapeOf(getRhs()),
                           scheme, true)))
      return failure();
  }

  if (getBias()) {
    SmallVector<Dim> dims;
    if (grouped)
      dims.push_back(size(experts, "experts"));
    dims.push_back(size(n, "N"));
    if (failed(checkShape(op, "bias", getBias(), dims)))
      return failure();
  }
  int64_t outN = n;
  if (activationGrad) {
    // The backward of an activation of N gate and N up columns.
    outN = 2 * n;
    if (failed(checkShape(op, "activation_input", getActivationInput(),
                          {count(rows, "rows"), size(outN, "2 N")})) ||
        (getRowWeights() &&
         failed(checkColumn(op, "row_weights", getRowWeights(), rows))) ||
        (getRowDots() &&
         failed(checkShape(op, "row_dots", getRowDots(),
                           {count(rows, "rows"),
                            size(int64_t(llvm::divideCeil(n, kRowDotColumns)),
                                 "N / 64, rounded up")}))) ||
        (getRowTerm() &&
         failed(checkShape(op, "row_term", getRowTerm(),
                           {count(rows, "rows"), size(1, "one term")}))))
      return failure();
    if (!elementTypeOf(getOut()).isBF16())
      return emitOpError() << "an activation's backward gives bf16, not "
                           << elementTypeOf(getOut());
    if (getInPlace())
      for (Operation *user : getActivationInput().getUsers())
        if (user != op &&
            (user->getBlock() != op->getBlock() || !user->isBeforeInBlock(op)))
          return emitOpError()
                 << "is in_place, but activation_input is read after it";
  } else if (getActivation()) {
    if (n % 2 != 0)
      return emitOpError() << "a gated activation needs an even N (gate "
                              "columns, then up columns), but N is "
                           << n;
    outN = n / 2;
  }
  if (failed(checkShape(op, "result", getOut(),
                        {count(rows, "rows"), size(outN, "N")})))
    return failure();
  if (ArrayAttr configs = getConfigsAttr()) {
    llvm::SmallDenseSet<int64_t> seen;
    for (auto config : configs.getAsRange<MatmulConfigAttr>())
      if (!seen.insert(config.getTokens()).second)
        return emitOpError() << "has two kernel configurations for calls of "
                             << config.getTokens() << " tokens";
  }
  return verifyQuantizedResult(op, "out", getOut(), getOutScale(),
                               getOutQuantAttr());
}

//===----------------------------------------------------------------------===//
// CombineOp
//===----------------------------------------------------------------------===//

LogicalResult CombineOp::verify() {
  Operation *op = getOperation();
  if (failed(checkShape(op, "expert_out", getExpertOut(),
                        {count(kAny, "rows"), size(kAny, "hidden")})) ||
      failed(checkShape(op, "rows", getRows(),
                        {count(kAny, "tokens"), size(kAny, "top-k")})))
    return failure();
  int64_t hidden = shapeOf(getExpertOut())[1];
  int64_t tokens = shapeOf(getRows())[0], topK = shapeOf(getRows())[1];
  if (getWeights() &&
      (failed(checkShape(op, "weights", getWeights(),
                         {count(tokens, "tokens"), size(topK, "top-k")}))))
    return failure();
  if (getGate() && !getShared())
    return emitOpError() << "a gate needs the shared experts' output";
  if (getShared() &&
      (failed(checkShape(op, "shared", getShared(),
                         {count(tokens, "tokens"), size(hidden, "hidden")}))))
    return failure();
  if (getGate() &&
      (failed(checkShape(op, "gate", getGate(),
                         {count(tokens, "tokens"), size(1, "one gate")}))))
    return failure();
  if (failed(checkShape(op, "result", getOut(),
                        {count(tokens, "tokens"), size(hidden, "hidden")})))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Training ops
//===----------------------------------------------------------------------===//

/// `value` [?, n] of `rows` rows.
static LogicalResult checkRows(Operation *op, StringRef name, Value value,
                               int64_t rows, int64_t n, StringRef meaning) {
  return checkShape(op, name, value, {count(rows, "rows"), size(n, meaning)});
}

LogicalResult ActivationOp::verify() {
  Operation *op = getOperation();
  if (failed(checkShape(op, "input", getInput(),
                        {count(kAny, "rows"), size(kAny, "N")})))
    return failure();
  int64_t n = shapeOf(getInput())[1];
  if (n % 2 != 0)
    return emitOpError() << "a gated activation needs an even N (gate "
                            "columns, then up columns), but N is "
                         << n;
  if (getRowWeights() && failed(checkColumn(op, "row_weights", getRowWeights(),
                                            shapeOf(getInput())[0])))
    return failure();
  if (getQuant() && getRowWeights())
    return emitOpError() << "quantizes a weighted activation, which only a "
                            "backward's bf16 weight gradient reads";
  if (failed(checkRows(op, "result", getOut(), shapeOf(getInput())[0], n / 2,
                       "N / 2")))
    return failure();
  return verifyQuantizedResult(op, "out", getOut(), getScales(),
                               getQuantAttr());
}

LogicalResult ActivationGradOp::verify() {
  Operation *op = getOperation();
  if (failed(requireTogether(op, getRows(), "rows", getWeights(), "weights")) ||
      failed(checkShape(op, "input", getInput(),
                        {count(kAny, "rows"), size(kAny, "N")})))
    return failure();
  int64_t rows = shapeOf(getInput())[0], n = shapeOf(getInput())[1];
  if (n % 2 != 0)
    return emitOpError() << "a gated activation needs an even N (gate "
                            "columns, then up columns), but N is "
                         << n;
  if (getRows() && getGate())
    return emitOpError() << "takes a row's weight from rows(rows, weights) or "
                            "from a gate, not both";
  if (getLinearGate() &&
      (!getGate() ||
       !cast<RankedTensorType>(getGate().getType()).getElementType().isF32()))
    return emitOpError() << "has linear_gate but no f32 gate: the rows' "
                            "weights themselves";
  if (getBiasTerm() &&
      failed(checkRows(op, "bias_term", getBiasTerm(), rows, 1, "one")))
    return failure();
  if (failed(checkRows(op, "out_grad", getOutGrad(), rows, n / 2, "N / 2")) ||
      failed(checkRows(op, "input_grad", getInputGrad(), rows, n, "N")) ||
      failed(checkRows(op, "weighted", getWeighted(), rows, n / 2, "N / 2")))
    return failure();
  Value weights = getRows() ? getWeights() : getGate();
  if (!weights) {
    if (getWeightGrad())
      return emitOpError() << "has no weights to give a gradient of";
    return success();
  }
  if (!getWeightGrad())
    return emitOpError() << "gives its weights' gradient as a third result";
  if (getRows()) {
    if (failed(checkShape(op, "rows", getRows(),
                          {count(kAny, "tokens"), size(kAny, "top-k")})))
      return failure();
    ArrayRef<int64_t> choices = shapeOf(getRows());
    if (failed(checkShape(
            op, "weights", getWeights(),
            {count(choices[0], "tokens"), size(choices[1], "top-k")})))
      return failure();
  } else if (failed(checkRows(op, "gate", getGate(), rows, 1, "one gate"))) {
    return failure();
  }
  ArrayRef<int64_t> shape = shapeOf(weights);
  return checkShape(op, "weight_grad", getWeightGrad(),
                    {count(shape[0], getRows() ? "tokens" : "rows"),
                     size(shape[1], getRows() ? "top-k" : "one gate")});
}

/// `tokens_per_expert` [E] and `expert_offsets` [E + 1] for `experts`.
static LogicalResult checkGroups(Operation *op, Value counts, Value offsets,
                                 int64_t experts) {
  return failure(failed(checkShape(op, "tokens_per_expert", counts,
                                   {size(experts, "experts")})) ||
                 failed(checkShape(op, "expert_offsets", offsets,
                                   {size(experts + 1, "experts + 1")})));
}

/// A matmul gradient's groups (both or neither) and `out_grad` [R, N].
static LogicalResult checkGradRows(Operation *op, Value counts, Value offsets,
                                   Value outGrad, int64_t &rows, int64_t &n) {
  if (failed(requireTogether(op, counts, "tokens_per_expert", offsets,
                             "expert_offsets")) ||
      failed(checkShape(op, "out_grad", outGrad,
                        {count(kAny, "rows"), size(kAny, "N")})))
    return failure();
  rows = shapeOf(outGrad)[0], n = shapeOf(outGrad)[1];
  return success();
}

LogicalResult GroupedMatmulDgradOp::verify() {
  Operation *op = getOperation();
  bool grouped = static_cast<bool>(getTokensPerExpert());
  int64_t rows, n;
  if (failed(checkGradRows(op, getTokensPerExpert(), getExpertOffsets(),
                           getOutGrad(), rows, n)))
    return failure();
  SmallVector<Dim> dims;
  if (grouped)
    dims.push_back(size(kAny, "experts"));
  dims.append({size(n, "N"), size(kAny, "K")});
  if (failed(checkShape(op, "rhs", getRhs(), dims)))
    return failure();
  if (grouped && failed(checkGroups(op, getTokensPerExpert(),
                                    getExpertOffsets(), shapeOf(getRhs())[0])))
    return failure();
  if (!isa<BFloat16Type, Float32Type>(elementTypeOf(getRhs())))
    return emitOpError() << "rhs must be bf16 or f32 (quantized training "
                            "takes its own ops), but holds "
                         << elementTypeOf(getRhs());
  int64_t k = shapeOf(getRhs()).back();
  if (getAcc() && failed(checkRows(op, "acc", getAcc(), rows, k, "K")))
    return failure();
  if (static_cast<bool>(getBias()) != static_cast<bool>(getBiasDot()))
    return emitOpError() << "gives the rows' dot with a bias as its second "
                            "result exactly when it takes one";
  if (getBias()) {
    SmallVector<Dim> biasDims;
    if (grouped)
      biasDims.push_back(size(shapeOf(getRhs())[0], "experts"));
    biasDims.push_back(size(n, "N"));
    if (failed(checkShape(op, "bias", getBias(), biasDims)) ||
        failed(checkRows(op, "bias_dot", getBiasDot(), rows, 1, "one")))
      return failure();
  }
  return checkRows(op, "result", getOut(), rows, k, "K");
}

LogicalResult GroupedMatmulWgradOp::verify() {
  Operation *op = getOperation();
  bool grouped = static_cast<bool>(getTokensPerExpert());
  int64_t rows, n;
  if (failed(checkGradRows(op, getTokensPerExpert(), getExpertOffsets(),
                           getOutGrad(), rows, n)))
    return failure();
  SmallVector<Dim> result;
  if (grouped) {
    auto counts = cast<RankedTensorType>(getTokensPerExpert().getType());
    if (counts.getRank() != 1 || counts.isDynamicDim(0))
      return emitOpError() << "tokens_per_expert must be [experts], not "
                           << counts;
    int64_t experts = counts.getDimSize(0);
    if (failed(
            checkGroups(op, getTokensPerExpert(), getExpertOffsets(), experts)))
      return failure();
    result.push_back(size(experts, "experts"));
  }
  result.push_back(size(n, "N"));
  if (Value lhs = getLhs()) {
    auto type = cast<RankedTensorType>(lhs.getType());
    if (type.getRank() == 1) {
      if (failed(checkShape(op, "lhs", lhs, {count(rows, "rows")})))
        return failure();
    } else {
      if (failed(checkShape(op, "lhs", lhs,
                            {count(rows, "rows"), size(kAny, "K")})))
        return failure();
      result.push_back(size(type.getDimSize(1), "K"));
    }
  }
  if (failed(checkQuantizedWgrad(rows)))
    return failure();
  return checkShape(op, "result", getOut(), result);
}

LogicalResult GroupedMatmulWgradOp::checkQuantizedWgrad(int64_t rows) {
  Value lhs = getLhs();
  bool codes =
      lhs && isa<Float8E4M3FNType>(
                 cast<RankedTensorType>(lhs.getType()).getElementType());
  if (!getQuant()) {
    if (getLhsScale())
      return emitOpError() << "has lhs_scale but no quant: only a quantized "
                              "weight gradient reads lhs as codes";
    if (codes)
      return emitOpError() << "multiplies E4M3 codes without quant and "
                              "lhs_scale, which say what they stand for";
    return success();
  }
  if (getQuantAttr().getKind() != QuantKind::FP8Block128)
    return emitOpError() << "has quant = " << getQuantAttr()
                         << ": a quantized weight gradient takes "
                            "fp8_block128 (1 x 32 MX blocks along the rows "
                            "are not built)";
  if (!lhs || cast<RankedTensorType>(lhs.getType()).getRank() != 2)
    return emitOpError() << "has quant but no matrix lhs: only a product of "
                            "two matrices is taken in E4M3";
  if (codes != static_cast<bool>(getLhsScale()))
    return emitOpError() << (codes ? "has E4M3 codes as lhs but no lhs_scale"
                                   : "has lhs_scale but lhs is not E4M3 codes");
  if (!codes)
    return success();
  int64_t k = cast<RankedTensorType>(lhs.getType()).getDimSize(1);
  return checkShape(getOperation(), "lhs_scale", getLhsScale(),
                    {count(rows, "rows"),
                     size(llvm::divideCeil(k, 128), "the 128-column blocks "
                                                    "of K")});
}

LogicalResult RouteGradOp::verify() {
  Operation *op = getOperation();
  int64_t tokens, experts, topK;
  if (failed(checkRouter(op, getHiddenStates(), getRouterWeight(), getBias(),
                         getExpertIds(), getWeightGrad(), "weight_grad", tokens,
                         experts, topK)))
    return failure();
  if (topK > experts)
    return emitOpError() << "top-k (" << topK
                         << ") must not exceed the number of experts ("
                         << experts << ")";
  if (getLogits() &&
      failed(checkShape(op, "logits", getLogits(),
                        {count(tokens, "tokens"), size(experts, "experts")})))
    return failure();
  return checkShape(op, "result", getLogitGrad(),
                    {count(tokens, "tokens"), size(experts, "experts")});
}

LogicalResult ScatterOp::verify() {
  Operation *op = getOperation();
  if (getAlign() < 1)
    return emitOpError() << "align must be at least 1, but is " << getAlign();
  if (failed(checkShape(op, "source", getSource(),
                        {count(kAny, "tokens"), size(kAny, "hidden")})))
    return failure();
  int64_t tokens = shapeOf(getSource())[0], hidden = shapeOf(getSource())[1];
  if (failed(checkShape(op, "rows", getRows(),
                        {count(tokens, "tokens"), size(kAny, "top-k")})))
    return failure();
  for (auto [name, value] : {std::pair<StringRef, Value>{"scale", getScale()},
                             {"weights", getWeights()}})
    if (value && failed(checkShape(op, name, value,
                                   {count(tokens, "tokens"),
                                    size(shapeOf(getRows())[1], "top-k")})))
      return failure();
  if (getScale() && getWeights())
    return emitOpError() << "takes scale or weights, not both";
  if (static_cast<bool>(getWeights()) != static_cast<bool>(getRowWeights()))
    return emitOpError() << "weights and the row_weights result go together";
  if (failed(checkShape(op, "expert_offsets", getExpertOffsets(),
                        {size(kAny, "experts + 1")})))
    return failure();
  if (shapeOf(getExpertOffsets())[0] < 2)
    return emitOpError() << "has expert_offsets of "
                         << shapeOf(getExpertOffsets())[0]
                         << " entries: one an expert and one more";
  if (failed(checkShape(op, "out", getOut(),
                        {count(kAny, "rows"), size(hidden, "hidden")})))
    return failure();
  if (getRowWeights() &&
      failed(checkShape(op, "row_weights", getRowWeights(),
                        {count(shapeOf(getOut())[0], "rows")})))
    return failure();
  return success();
}

LogicalResult GatherDotOp::verify() {
  Operation *op = getOperation();
  if (!getRows()) {
    if (getTokens())
      return emitOpError() << "dots rows with tokens, which needs `rows` to "
                              "say which token each choice's row is";
    if (failed(checkShape(op, "row_values", getRowValues(),
                          {count(kAny, "rows"), size(kAny, "partials")})))
      return failure();
    return checkShape(
        op, "result", getOut(),
        {count(shapeOf(getRowValues())[0], "rows"), size(1, "one sum")});
  }
  if (failed(checkShape(op, "rows", getRows(),
                        {count(kAny, "tokens"), size(kAny, "top-k")})))
    return failure();
  int64_t tokens = shapeOf(getRows())[0];
  int64_t hidden = kAny;
  if (getTokens()) {
    if (failed(checkShape(op, "tokens", getTokens(),
                          {count(tokens, "tokens"), size(kAny, "hidden")})))
      return failure();
    hidden = shapeOf(getTokens())[1];
  }
  if (failed(checkShape(op, "row_values", getRowValues(),
                        {count(kAny, "rows"),
                         size(hidden, getTokens() ? "hidden" : "partials")})))
    return failure();
  return checkShape(
      op, "result", getOut(),
      {count(tokens, "tokens"), size(shapeOf(getRows())[1], "top-k")});
}

//===----------------------------------------------------------------------===//
// Expert-parallel ops
//===----------------------------------------------------------------------===//

/// `sent` [ep_size] with ep_size >= 1; returns ep_size.
static FailureOr<int64_t> checkSent(Operation *op, Value sent) {
  if (failed(checkShape(op, "sent", sent, {size(kAny, "ranks")})))
    return failure();
  return shapeOf(sent)[0];
}

LogicalResult EpDispatchSendOp::verify() {
  Operation *op = getOperation();
  if (getLocalExperts() < 1)
    return emitOpError() << "local_experts must be at least 1, but is "
                         << getLocalExperts();
  FailureOr<Choices> choices =
      checkChoices(op, getHiddenStates(), getExpertIds(), getScale());
  if (failed(choices))
    return failure();
  auto [tokens, hidden, topK] = *choices;
  if (failed(checkSent(op, getSent())) ||
      failed(checkShape(op, "rows", getRows(),
                        {count(tokens, "tokens"), size(topK, "top-k")})))
    return failure();
  bool travelsQuantized = getQuantAttr() && !getScale();
  size_t expected = travelsQuantized ? 2 : 0;
  if (getQuantized().size() != expected)
    return emitOpError() << "has " << getQuantized().size()
                         << " quantized results, but tokens that travel "
                         << (travelsQuantized ? "quantized need 2 (codes and "
                                                "scales)"
                                              : "in bf16 need none");
  if (!travelsQuantized)
    return success();
  Value codes = getQuantized()[0];
  if (failed(checkShape(op, "tokens", codes,
                        {count(tokens, "tokens"), size(hidden, "hidden")})))
    return failure();
  return verifyQuantizedResult(op, "tokens", codes, getQuantized()[1],
                               getQuantAttr());
}

LogicalResult EpDispatchRecvOp::verify() {
  Operation *op = getOperation();
  if (failed(checkSent(op, getSent())) ||
      failed(checkShape(op, "dispatched", getDispatched(),
                        {count(kAny, "rows"), size(kAny, "hidden")})) ||
      failed(checkShape(op, "tokens_per_expert", getTokensPerExpert(),
                        {size(kAny, "local experts")})))
    return failure();
  int64_t experts = shapeOf(getTokensPerExpert())[0];
  int64_t rows = shapeOf(getDispatched())[0];
  if (failed(checkShape(op, "expert_offsets", getExpertOffsets(),
                        {size(experts + 1, "local experts + 1")})) ||
      failed(checkShape(op, "origin", getOrigin(),
                        {count(rows, "rows"), size(2, "rank and row")})))
    return failure();
  if (getQuantized().size() > 1)
    return emitOpError() << "has " << getQuantized().size()
                         << " quantized results: none, or the dispatched "
                            "rows' scales";
  if (getWeights()) {
    if (getScaled() || getQuantAttr())
      return emitOpError() << "gives its rows' weights, so its rows are "
                              "neither scaled nor quantized";
    if (getQuantized().size() != 1)
      return emitOpError() << "gives its rows' weights as a fifth result";
    auto send = getSent().getDefiningOp<EpDispatchSendOp>();
    if (send && !send.getScale())
      return emitOpError() << "gives its rows' weights, which its send did "
                              "not carry (it has no scale)";
    return checkShape(op, "weights", getQuantized()[0],
                      {count(rows, "rows"), size(1, "one weight")});
  }
  Value scales = getQuantized().empty() ? Value() : getQuantized()[0];
  return verifyQuantizedResult(op, "dispatched", getDispatched(), scales,
                               getQuantAttr());
}

LogicalResult EpCombineSendOp::verify() {
  Operation *op = getOperation();
  if (failed(checkSent(op, getSent())) ||
      failed(checkShape(op, "expert_out", getExpertOut(),
                        {count(kAny, "rows"), size(kAny, "hidden")})))
    return failure();
  int64_t rows = shapeOf(getExpertOut())[0];
  if (getValues() &&
      failed(checkShape(op, "values", getValues(),
                        {count(rows, "rows"), size(1, "one value")})))
    return failure();
  return checkShape(op, "origin", getOrigin(),
                    {count(rows, "rows"), size(2, "rank and row")});
}

LogicalResult EpCombineRecvOp::verify() {
  Operation *op = getOperation();
  if (failed(checkSent(op, getSent())) ||
      failed(checkShape(op, "rows", getRows(),
                        {count(kAny, "tokens"), size(kAny, "top-k")})))
    return failure();
  ArrayRef<int64_t> rows = shapeOf(getRows());
  int64_t expected = ShapedType::isDynamic(rows[0]) ? kAny : rows[0] * rows[1];
  if (getValues()) {
    auto send = getSent().getDefiningOp<EpCombineSendOp>();
    if (send && !send.getValues())
      return emitOpError() << "gives values its send did not carry";
    if (failed(checkShape(op, "values", getValues(),
                          {count(rows[0], "tokens"), size(rows[1], "top-k")})))
      return failure();
  }
  return checkShape(op, "gathered", getGathered(),
                    {count(expected, "tokens x top-k"), size(kAny, "hidden")});
}
