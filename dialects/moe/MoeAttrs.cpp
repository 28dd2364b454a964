//===- MoeAttrs.cpp - layer configuration attributes ----------------------===//
//
// Parsing helpers and the verifiers that reject configurations no model has:
// each says which value is wrong and why.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/support/Sm90a.h"
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
  int64_t integer = 0;
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

//===----------------------------------------------------------------------===//
// Launch plan
//===----------------------------------------------------------------------===//

FailureOr<TokenLinear> mlir::moe::parseTokenLinear(AsmParser &parser) {
  // `a`, `a * T` or `a + b * T`.
  TokenLinear value;
  int64_t first = 0;
  if (parser.parseInteger(first))
    return failure();
  if (succeeded(parser.parseOptionalStar())) {
    if (parser.parseKeyword("T"))
      return failure();
    value.perToken = first;
    return value;
  }
  value.fixed = first;
  if (failed(parser.parseOptionalPlus()))
    return value;
  if (parser.parseInteger(value.perToken) || parser.parseStar() ||
      parser.parseKeyword("T"))
    return failure();
  return value;
}

void mlir::moe::printTokenLinear(AsmPrinter &printer,
                                 const TokenLinear &value) {
  if (value.perToken == 0) {
    printer << value.fixed;
    return;
  }
  if (value.fixed != 0)
    printer << value.fixed << " + ";
  printer << value.perToken << " * T";
}

FailureOr<SmallVector<KernelArg>>
mlir::moe::parseKernelArgs(AsmParser &parser) {
  SmallVector<KernelArg> args;
  auto parseOne = [&]() -> ParseResult {
    StringRef keyword;
    SMLoc at = parser.getCurrentLocation();
    if (parser.parseKeyword(&keyword))
      return failure();
    std::optional<KernelArgKind> kind = symbolizeKernelArgKind(keyword);
    if (!kind)
      return parser.emitError(at) << "expected buffer, tensor_map or tokens";
    KernelArg arg{*kind, 0};
    if (*kind != KernelArgKind::Tokens && parser.parseInteger(arg.index))
      return failure();
    args.push_back(arg);
    return success();
  };
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, parseOne))
    return failure();
  return args;
}

FailureOr<SmallVector<int64_t>> mlir::moe::parseCountList(AsmParser &parser) {
  SmallVector<int64_t> counts;
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
        return parser.parseInteger(counts.emplace_back());
      }))
    return failure();
  return counts;
}

void mlir::moe::printCountList(AsmPrinter &printer, ArrayRef<int64_t> counts) {
  printer << "[";
  llvm::interleaveComma(counts, printer);
  printer << "]";
}

void mlir::moe::printKernelArgs(AsmPrinter &printer, ArrayRef<KernelArg> args) {
  printer << "[";
  llvm::interleaveComma(args, printer, [&](const KernelArg &arg) {
    printer << stringifyKernelArgKind(arg.kind);
    if (arg.kind != KernelArgKind::Tokens)
      printer << " " << arg.index;
  });
  printer << "]";
}

LogicalResult
PlanBufferAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                       BufferKind kind, int64_t index, TokenLinear bytes,
                       TokenLinear offset) {
  if (index < 0)
    return emitError() << "buffer index must not be negative, but is " << index;
  if (kind != BufferKind::Argument && index != 0)
    return emitError() << "only an argument buffer has an index";
  if (bytes.fixed < 0 || bytes.perToken < 0)
    return emitError() << "buffer bytes must not be negative";
  if (kind == BufferKind::Argument && bytes != TokenLinear())
    return emitError() << "an argument buffer has the caller's size, not "
                          "bytes of its own";
  if (offset != TokenLinear() &&
      (kind != BufferKind::Workspace || offset.fixed < 0 ||
       offset.perToken < 0 || offset.fixed % 256 || offset.perToken % 256))
    return emitError() << "only a workspace slice has an offset, 256-byte "
                          "aligned and not negative";
  return success();
}

LogicalResult
TensorMapAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      int64_t buffer, int64_t elementBytes, TokenLinear rows,
                      int64_t cols, int64_t boxRows, int64_t boxCols,
                      int64_t rowStride, ArrayRef<int64_t> outer) {
  if (buffer < 0)
    return emitError() << "tensor_map buffer must be a plan buffer index";
  if (elementBytes != 1 && elementBytes != 2 && elementBytes != 4)
    return emitError() << "tensor_map element_bytes must be 1, 2 or 4, but is "
                       << elementBytes;
  // cuTensorMapEncodeTiled: row strides of 16-byte multiples, boxes of at
  // most 256 in each dimension, 128-byte rows for 128-byte swizzling.
  if ((cols * elementBytes) % 16 != 0)
    return emitError() << "tensor_map rows of " << cols << " x " << elementBytes
                       << " bytes are not a multiple of 16 bytes";
  if (boxRows < 1 || boxRows > 256 || boxCols * elementBytes != 128)
    return emitError() << "tensor_map box must be 1 to 256 rows of 128 bytes";
  if (rowStride < 0 || (rowStride * elementBytes) % 16 != 0)
    return emitError() << "tensor_map row_stride must be a multiple of 16 "
                          "bytes";
  // At most five dimensions; each outer one a (size, stride, box) triple.
  if (outer.size() % 3 != 0 || outer.size() > 9)
    return emitError() << "tensor_map outer must hold at most three (size, "
                          "stride, box) triples";
  for (size_t i = 0; i < outer.size(); i += 3)
    if (outer[i] < 1 || (outer[i + 1] * elementBytes) % 16 != 0 ||
        outer[i + 1] < 1 || outer[i + 2] < 1 || outer[i + 2] > 256)
      return emitError() << "tensor_map outer dimension " << i / 3
                         << " needs a positive size, a stride of 16-byte "
                            "multiples and a box of 1 to 256";
  return success();
}

LogicalResult KernelLaunchAttr::verify(
    function_ref<InFlightDiagnostic()> emitError, FlatSymbolRefAttr kernel,
    TokenLinear work, int64_t perBlock, int64_t extraBlocks, int64_t gridY,
    int64_t block, int64_t sharedBytes, ArrayRef<KernelArg> args,
    bool persistent, int64_t cluster, bool cooperative) {
  if (!kernel)
    return emitError() << "launch needs a kernel";
  // A cooperative grid must fit the device at once: one block per
  // multiprocessor.
  if (cooperative && (!persistent || cluster != 1))
    return emitError() << "cooperative launch of " << kernel
                       << " must be persistent and without clusters";
  // Portable cluster sizes are 1 to 8 blocks.
  if (cluster < 1 || cluster > 8)
    return emitError() << "launch of " << kernel << " has clusters of "
                       << cluster << " blocks; 1 to 8 run";
  if (perBlock < 1 || extraBlocks < 0 || gridY < 1 || gridY > 65535)
    return emitError() << "launch of " << kernel
                       << " has an invalid grid (per_block >= 1, "
                          "extra_blocks >= 0, 1 <= grid_y <= 65535)";
  if (block < 1 || block > 1024)
    return emitError() << "launch of " << kernel << " has " << block
                       << " threads per block; 1 to 1024 run";
  if (sharedBytes < 0 || sharedBytes > sm90a::kSharedPerBlock)
    return emitError() << "launch of " << kernel << " asks for " << sharedBytes
                       << " bytes of shared memory; sm_90a has "
                       << sm90a::kSharedPerBlock / 1024 << " KiB";
  return success();
}

LogicalResult
LaunchPlanAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                       ArrayAttr buffers, ArrayAttr tensorMaps,
                       ArrayAttr launches, int64_t maxTokens,
                       int64_t counters) {
  if (counters < 0)
    return emitError() << "launch_plan counters must not be negative";
  if (maxTokens < 0)
    return emitError() << "launch_plan max_tokens must be positive, or 0 for "
                          "any token count";
  for (Attribute a : buffers)
    if (!isa<PlanBufferAttr>(a))
      return emitError() << "launch_plan buffers must be #moe.buffer";
  for (Attribute a : tensorMaps) {
    auto map = dyn_cast<TensorMapAttr>(a);
    if (!map)
      return emitError() << "launch_plan tensor_maps must be #moe.tensor_map";
    if (map.getBuffer() >= int64_t(buffers.size()))
      return emitError() << "tensor_map reads buffer " << map.getBuffer()
                         << " of " << buffers.size();
  }
  for (Attribute a : launches) {
    auto launch = dyn_cast<KernelLaunchAttr>(a);
    if (!launch)
      return emitError() << "launch_plan launches must be #moe.launch";
    for (const KernelArg &arg : launch.getArgs()) {
      int64_t limit = arg.kind == KernelArgKind::Buffer      ? buffers.size()
                      : arg.kind == KernelArgKind::TensorMap ? tensorMaps.size()
                                                             : 1;
      if (arg.index < 0 || arg.index >= limit)
        return emitError() << "launch of " << launch.getKernel() << " names "
                           << stringifyKernelArgKind(arg.kind) << " "
                           << arg.index << ", which the plan lacks";
    }
  }
  return success();
}

template <typename AttrT> static SmallVector<AttrT> listOf(ArrayAttr array) {
  return llvm::map_to_vector(array, [](Attribute a) { return cast<AttrT>(a); });
}

SmallVector<PlanBufferAttr> LaunchPlanAttr::getBufferList() const {
  return listOf<PlanBufferAttr>(getBuffers());
}
SmallVector<TensorMapAttr> LaunchPlanAttr::getTensorMapList() const {
  return listOf<TensorMapAttr>(getTensorMaps());
}
SmallVector<KernelLaunchAttr> LaunchPlanAttr::getLaunchList() const {
  return listOf<KernelLaunchAttr>(getLaunches());
}

/// `bytes` with each term rounded up to 256, so that slices laid end to end
/// each start 256-byte aligned for any token count.
static TokenLinear alignedSlice(TokenLinear bytes) {
  auto alignUp = [](int64_t x) { return (x + 255) / 256 * 256; };
  return {alignUp(bytes.fixed), alignUp(bytes.perToken)};
}

TokenLinear PlanBufferAttr::getSliceBytes() const {
  return alignedSlice(getBytes());
}

TokenLinear LaunchPlanAttr::getWorkspaceBytes() const {
  TokenLinear end;
  for (PlanBufferAttr buffer : getBufferList()) {
    if (buffer.getKind() != BufferKind::Workspace)
      continue;
    TokenLinear slice = buffer.getSliceBytes(), at = buffer.getOffset();
    end.fixed = std::max(end.fixed, at.fixed + slice.fixed);
    end.perToken = std::max(end.perToken, at.perToken + slice.perToken);
  }
  return {getHeaderBytes() + end.fixed, end.perToken};
}

LogicalResult StageAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                AttentionStageKind kind, int64_t group,
                                int64_t tile) {
  if (group < 0)
    return emitError() << "stage group must not be negative";
  // A stage works on this iteration's key tile or an earlier one's.
  if (tile > 0)
    return emitError() << "stage tile offset must be 0 or negative";
  return success();
}

LogicalResult MatmulConfigAttr::verify(
    function_ref<InFlightDiagnostic()> emitError, int64_t tokens, int64_t tileM,
    int64_t tileN, int64_t tileK, int64_t stages, int64_t warpgroups,
    int64_t clusterM, int64_t clusterN, MatmulMulticast multicast,
    MatmulRaster raster, int64_t group, int64_t splitK, bool swapAB,
    bool persistent, MatmulEpilogue epilogue) {
  if (tokens < 0)
    return emitError() << "matmul_config tokens must not be negative";
  std::pair<StringRef, int64_t> positive[] = {
      {"tile_m", tileM},          {"tile_n", tileN},
      {"tile_k", tileK},          {"stages", stages},
      {"warpgroups", warpgroups}, {"cluster_m", clusterM},
      {"cluster_n", clusterN},    {"group", group},
      {"split_k", splitK}};
  for (auto [name, value] : positive)
    if (value < 1)
      return emitError() << "matmul_config " << name
                         << " must be at least 1, not " << value;
  if (multicast != MatmulMulticast::None && clusterM * clusterN == 1)
    return emitError() << "matmul_config multicast needs a cluster of more "
                          "than one block";
  return success();
}

//===----------------------------------------------------------------------===//
// Interface
//===----------------------------------------------------------------------===//

LogicalResult ArgumentAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   StringRef name, RankedTensorType type,
                                   bool output) {
  if (name.empty())
    return emitError() << "an argument needs a name";
  Type element = type.getElementType();
  if (!element.isBF16() && !element.isF16() && !element.isF32() &&
      !element.isInteger(32) &&
      !isa<Float8E4M3FNType, Float8E8M0FNUType>(element))
    return emitError() << "argument '" << name << "' has element type "
                       << element << ", which no C entry point passes";
  for (int64_t d = 1; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      return emitError() << "argument '" << name
                         << "' may be dynamic only in its first (token) "
                            "dimension";
  return success();
}

LogicalResult
ExpertParallelAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                           int64_t ranks, int64_t localExperts, int64_t experts,
                           int64_t topK, int64_t hidden, int64_t maxTokens,
                           int64_t stateBytes, TokenLinear sendBytes,
                           TokenLinear recvBytes) {
  if (ranks < 2)
    return emitError() << "an expert-parallel layer has at least 2 ranks, not "
                       << ranks;
  if (localExperts * ranks != experts)
    return emitError() << "ranks (" << ranks << ") times local_experts ("
                       << localExperts << ") must be the experts (" << experts
                       << ")";
  if (topK < 1 || hidden < 1 || maxTokens < 0 || stateBytes < 0)
    return emitError() << "top_k and hidden must be positive, max_tokens and "
                          "state_bytes not negative";
  return success();
}

ExpertParallelAttr ExpertParallelAttr::forLayer(ConfigAttr config) {
  if (!config || config.getEpSize() == 1)
    return {};
  return get(config.getContext(), config.getEpSize(), config.getLocalExperts(),
             config.getExperts(), config.getTopK(), config.getHidden(),
             /*maxTokens=*/0, /*stateBytes=*/0, TokenLinear(), TokenLinear());
}

LogicalResult SavedAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                StringRef name, RankedTensorType type,
                                TokenLinear rows) {
  if (name.empty())
    return emitError() << "a saved tensor needs a name";
  if (type.getRank() == 0 ||
      llvm::any_of(type.getShape().drop_front(), ShapedType::isDynamic))
    return emitError() << "saved tensor '" << name
                       << "' may be dynamic only in its leading dimension";
  if (rows.fixed < 0 || rows.perToken < 0)
    return emitError() << "saved tensor '" << name
                       << "' has a negative row count";
  if (!type.isDynamicDim(0) &&
      (rows.perToken != 0 || rows.fixed != type.getDimSize(0)))
    return emitError() << "saved tensor '" << name << "' has "
                       << type.getDimSize(0) << " rows, not those its rows "
                       << "give";
  return success();
}

TokenLinear SavedAttr::getSliceBytes() const {
  int64_t rowBytes = (getType().getElementTypeBitWidth() + 7) / 8;
  for (int64_t size : getType().getShape().drop_front())
    rowBytes *= size;
  // 16 bytes a token keeps every slice 16-byte aligned at any token count
  // without the 256 a token a workspace slice takes (a saved buffer lives
  // from the forward to the backward).
  TokenLinear bytes = getRows() * rowBytes;
  return {alignedSlice(bytes).fixed, (bytes.perToken + 15) / 16 * 16};
}

LogicalResult TrainingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   ArrayAttr saved, ArrayAttr gradients) {
  if (!llvm::all_of(saved, llvm::IsaPred<SavedAttr>))
    return emitError() << "training saved values must be #moe.saved values";
  if (gradients.empty() ||
      !llvm::all_of(gradients, llvm::IsaPred<ArgumentAttr>))
    return emitError() << "training gradients must be #moe.argument values";
  return success();
}

SmallVector<SavedAttr> TrainingAttr::getSavedList() const {
  return listOf<SavedAttr>(getSaved());
}

SmallVector<ArgumentAttr> TrainingAttr::getGradientList() const {
  return listOf<ArgumentAttr>(getGradients());
}

TokenLinear TrainingAttr::getSavedOffset(unsigned i) const {
  TokenLinear offset{kHeaderBytes, 0};
  for (Attribute attr : getSaved().getValue().take_front(i)) {
    auto saved = cast<SavedAttr>(attr);
    offset.fixed += saved.getSliceBytes().fixed;
    offset.perToken += saved.getSliceBytes().perToken;
  }
  return offset;
}

TokenLinear TrainingAttr::getSavedBytes() const {
  return getSavedOffset(getSaved().size());
}

LogicalResult InterfaceAttr::verify(
    function_ref<InFlightDiagnostic()> emitError, StringRef name, Target target,
    ArrayAttr args, ConfigAttr config, TokenLinear workspace,
    ArrayRef<int64_t> tokenBuckets, ExpertParallelAttr expertParallel,
    TrainingAttr training, DictionaryAttr symbols) {
  if (name.empty() || llvm::isDigit(name[0]) ||
      !llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; }))
    return emitError() << "interface name '" << name
                       << "' is not a C identifier";
  if (args.empty() || !llvm::all_of(args, llvm::IsaPred<ArgumentAttr>))
    return emitError() << "interface args must be #moe.argument values";
  bool outputs = false;
  for (Attribute arg : args) {
    bool output = cast<ArgumentAttr>(arg).getOutput();
    if (outputs && !output)
      return emitError() << "interface outputs must come after its inputs";
    outputs |= output;
  }
  if (!outputs)
    return emitError() << "an interface has at least one output";
  for (auto [i, size] : llvm::enumerate(tokenBuckets))
    if (size < 1 || (i > 0 && size <= tokenBuckets[i - 1]))
      return emitError() << "token buckets must be ascending counts of at "
                            "least 1";
  if (!tokenBuckets.empty() && target != Target::SM90a)
    return emitError() << "only a GPU layer replays token buckets";
  if (workspace.fixed < 0 || workspace.perToken < 0)
    return emitError() << "workspace bytes must not be negative";
  // The symbols follow from the rest: a library exports exactly these.
  if (symbols != exportedSymbols(symbols.getContext(), name, target,
                                 tokenBuckets, expertParallel, bool(training)))
    return emitError() << "interface symbols must be those of its name, "
                          "target, buckets, ranks and training";
  return success();
}

SmallVector<ArgumentAttr> InterfaceAttr::getArgList() const {
  return listOf<ArgumentAttr>(getArgs());
}

StringRef InterfaceAttr::getSymbol(StringRef role) const {
  auto symbol = getSymbols().getAs<StringAttr>(role);
  return symbol ? symbol.getValue() : StringRef();
}

InterfaceAttr
InterfaceAttr::withLaunch(TokenLinear workspace, ArrayRef<int64_t> tokenBuckets,
                          ExpertParallelAttr expertParallel) const {
  return get(getContext(), getName(), getTarget(), getArgs(), getConfig(),
             workspace, tokenBuckets, expertParallel, getTraining());
}

InterfaceAttr InterfaceAttr::withTraining(TrainingAttr training) const {
  return get(getContext(), getName(), getTarget(), getArgs(), getConfig(),
             getWorkspace(), getTokenBuckets(), getExpertParallel(), training);
}

DictionaryAttr InterfaceAttr::exportedSymbols(MLIRContext *context,
                                              StringRef name, Target target,
                                              ArrayRef<int64_t> tokenBuckets,
                                              ExpertParallelAttr expertParallel,
                                              bool training) {
  bool gpu = target == Target::SM90a;
  SmallVector<NamedAttribute> symbols;
  auto add = [&](StringRef role, const Twine &symbol) {
    symbols.emplace_back(StringAttr::get(context, role),
                         StringAttr::get(context, symbol));
  };
  // moe_<name>_<role> for the layer's own entry points; the library-wide
  // ones keep one name in every library.
  auto own = [&](StringRef role) { add(role, "moe_" + name + "_" + role); };
  own("forward");
  add("layer_info", "moe_layer_info");
  if (gpu || expertParallel || training)
    add("last_error", "moe_last_error");
  if (gpu)
    own("workspace_size");
  if (gpu && !tokenBuckets.empty()) {
    own("set_graphs");
    own("warmup");
  }
  if (training) {
    own("forward_train");
    own("saved_size");
    own("backward");
  }
  if (expertParallel) {
    own("ep_init");
    own("ep_finalize");
    own("ep_leave");
    if (gpu)
      own("ep_status");
  }
  return DictionaryAttr::get(context, symbols);
}
