//===- ConfigureMatmuls.cpp - each grouped matmul's kernel configuration --===//
//
// How a grouped matmul's kernel is cut and scheduled is data on the op
// (#moe.matmul_config), chosen here once per plan (any token count, then
// each bucket) from the shapes and the GPU, so a test or a user can read
// and pin it and the kernel builder only emits what it says.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONFIGUREMATMULS
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
// The sm_90a kernels' tiles and shared-memory layout (the wide tile: 128
// rows x 256 weight rows, two consumer warpgroups; the decode tile: 64-row
// weight fragments), as the target description gives them.
using sm90a::MatmulLayout;
constexpr int64_t kTileM = MatmulLayout::kTileM, kTileN = MatmulLayout::kTileN;
constexpr int64_t kSliceBytes = MatmulLayout::kSliceBytes;
constexpr int64_t kWarpGroups = MatmulLayout::kWarpGroups, kGroup = 8;
constexpr int64_t kSwapFragmentRows = MatmulLayout::kSwapFragmentRows;
// Split-K: at most kMaxSplits ranges, each at least kMinSplitTiles stages
// (on H100 a split's fixed cost, ring fill, partials and the last block's
// sum, outweighed what shorter ranges saved; bench/RESULTS.md).
constexpr int64_t kMaxSplits = 8, kMinSplitTiles = 32;
// A prefill-sized call, for the plan that serves any token count.
constexpr int64_t kAnyTokens = 4096;
// Persistent kernels: up to this many K stages, or weights of at most this
// many elements an expert.
constexpr int64_t kPersistentKTiles = 32, kPersistentWeightElements = 32 << 20;
// Decode tiles (swap_ab) serve buckets of at most kSwapTokens tokens: the
// weights are wgmma's 64-row fragments, an expert's rows (at most a
// token each) its N. Two blocks share a multiprocessor, and a split
// streams at least kSwapMinSplitTiles stages. Up to kSwapMaxTokens they
// serve a bucket where an expert has at most kSwapMeanRows rows on average
// and its weight tiles take at most kSwapRereads row tiles each: the row
// tiles of a weight tile run together and read it through L2, which
// streams about twice HBM's bytes, and more rows an expert are the wide
// tile's (H200: Qwen3-30B-A3B FP8 at 128 and 512 tokens, 170.8 and 232.8
// us of matmuls against the wide tile's 241.5 and 251.0; DeepSeek-V3's
// shard at 512, 128 rows an expert, 1,203 against 680 in FP8 and 1,372
// against 1,010 in bf16). A dense matmul whose wide tiles leave the GPU
// idle takes up to kSwapRereadsIdle row tiles (the shared expert at 128
// tokens, 36.4 against 98.7 us; bench/RESULTS.md).
constexpr int64_t kSwapTokens = 64, kSwapMaxTokens = 512,
                  kSwapMinSplitTiles = 4, kSwapMeanRows = 32, kSwapRereads = 2,
                  kSwapRereadsIdle = 8;

/// Where `value`'s rows are made, followed back through the row-wise steps
/// (quantize, pad, a matmul), which keep their input's: a moe.dispatch, a
/// moe.scatter (the backward's), an expert-parallel receive, or null (the
/// tokens themselves). A dispatch's second and third quantized results are
/// the tokens quantized (a shared expert's rows), not dispatched rows.
Operation *rowSource(Value value) {
  Operation *def = value.getDefiningOp();
  if (auto dispatch = dyn_cast_or_null<DispatchOp>(def)) {
    auto quantized = dispatch.getQuantized();
    for (size_t i = 1; i < quantized.size(); ++i)
      if (value == quantized[i])
        return rowSource(dispatch.getHiddenStates());
  }
  if (!def || isa<DispatchOp, ScatterOp, EpDispatchRecvOp>(def))
    return def;
  for (Value operand : def->getOperands()) {
    auto t = dyn_cast<RankedTensorType>(operand.getType());
    if (t && t.getRank() > 0 && t.isDynamicDim(0))
      return rowSource(operand);
  }
  return nullptr;
}

/// The rows `value` has at a call of T tokens, as fixed + per_token * T.
TokenLinear rowsOf(Value value) {
  auto type = cast<RankedTensorType>(value.getType());
  if (!type.isDynamicDim(0))
    return {type.getDimSize(0), 0};
  Operation *source = rowSource(value);
  if (auto scatter = dyn_cast_or_null<ScatterOp>(source)) {
    TokenLinear tokens = rowsOf(scatter.getSource());
    int64_t topK =
        cast<RankedTensorType>(scatter.getRows().getType()).getDimSize(1);
    int64_t experts =
        cast<RankedTensorType>(scatter.getExpertOffsets().getType())
            .getDimSize(0) -
        1;
    int64_t align = static_cast<int64_t>(scatter.getAlign());
    return {tokens.fixed * topK + experts * (align - 1),
            tokens.perToken * topK};
  }
  auto dispatch = dyn_cast_or_null<DispatchOp>(source);
  if (!dispatch)
    return {0, 1};
  TokenLinear tokens = rowsOf(dispatch.getHiddenStates());
  int64_t topK =
      cast<RankedTensorType>(dispatch.getExpertIds().getType()).getDimSize(1);
  int64_t experts =
      cast<RankedTensorType>(dispatch.getTokensPerExpert().getType())
          .getDimSize(0);
  int64_t align = static_cast<int64_t>(dispatch.getAlign());
  return {tokens.fixed * topK + experts * (align - 1), tokens.perToken * topK};
}

/// What the cost model reads off a grouped matmul.
struct MatmulShape {
  explicit MatmulShape(GroupedMatmulOp op) {
    auto rhs = cast<RankedTensorType>(op.getRhs().getType());
    grouped = static_cast<bool>(op.getTokensPerExpert());
    experts = grouped ? rhs.getDimSize(0) : 1;
    n = op.getN();
    k = op.getK();
    if (QuantAttr scheme = op.getScheme()) {
      elementBytes = 1;
      scaleK = scheme.getBlockSize();
      mx = scheme.getKind() == QuantKind::MXFP8;
      // Per-row weight scales are staged per column in shared memory.
      auto scales = cast<RankedTensorType>(op.getRhsScale().getType());
      columnScales = scales.getDimSize(scales.getRank() - 2) == n;
    }
    activationGrad = op.isActivationGrad();
    gated = static_cast<bool>(op.getActivationAttr()) && !activationGrad;
    outQuant = static_cast<bool>(op.getOutQuantAttr());
    outBlock = outQuant ? op.getOutQuantAttr().getBlockSize() : 0;
    outN = gated ? n / 2 : n;
    outF32 =
        cast<RankedTensorType>(op.getOut().getType()).getElementType().isF32();
    rows = rowsOf(op.getLhs());
    if (auto recv =
            dyn_cast_or_null<EpDispatchRecvOp>(rowSource(op.getLhs()))) {
      received = cast<RankedTensorType>(recv.getSent().getType()).getDimSize(0);
      if (auto send = recv.getSent().getDefiningOp<EpDispatchSendOp>())
        topK = cast<RankedTensorType>(send.getRows().getType()).getDimSize(1);
    }
  }
  int64_t tileK() const { return kSliceBytes / elementBytes; }
  /// The wide tile's: MXFP8 takes 64 codes a stage, which the consumers
  /// convert to bf16 and multiply with no per-block promotion.
  int64_t wideTileK() const {
    return mx ? MatmulLayout::kConvertedTileK : tileK();
  }
  /// The kernel's shared-memory layout for a tile of this shape, without
  /// stages.
  MatmulLayout layout(int64_t tileM, int64_t tileN, int64_t tileK) const {
    MatmulLayout l;
    l.tileM = tileM, l.tileN = tileN, l.tileK = tileK;
    l.elementBytes = elementBytes, l.scaleK = scaleK;
    l.columnScales = columnScales;
    l.epiloguePlanes = activationGrad ? 2 : 1;
    l.converted = MatmulLayout::converts(mx, tileK);
    return l;
  }
  int64_t kTiles() const { return llvm::divideCeil(k, tileK()); }
  int64_t colTiles() const {
    return llvm::divideCeil(outN, gated ? kTileN / 2 : kTileN);
  }

  bool grouped = false, gated = false, outQuant = false, columnScales = false;
  bool mx = false;
  /// An f32 result (a backward's dgrad): stored from the registers. An
  /// activation's backward as the epilogue stages h in shared memory.
  bool outF32 = false, activationGrad = false;
  // Rows from every rank (this many): a bucket (this rank's tokens) does
  // not bound them.
  int64_t received = 0, topK = 1;
  int64_t experts = 1, n = 0, k = 0, outN = 0, elementBytes = 2, scaleK = 0;
  int64_t outBlock = 0;
  TokenLinear rows;
};

/// Fields a user pinned; unset ones are the cost model's.
struct Pins {
  std::optional<int64_t> tileM, tileN, tileK, stages, warpGroups, clusterM,
      clusterN, group, splitK;
  std::optional<MatmulMulticast> multicast;
  std::optional<MatmulRaster> raster;
  std::optional<bool> swapAB, persistent;
  std::optional<MatmulEpilogue> epilogue;
};

/// The decode tile for a bucket: the call's rows (decodeRows), the tile's
/// rows (wgmma's N) and weight rows.
struct DecodeTile {
  int64_t rows, tileM, tileN;
};

LogicalResult parseCount(StringRef key, StringRef text, int64_t &value,
                         std::string &error) {
  if (text.getAsInteger(10, value) || value < 1) {
    error = ("matmul-config " + key + " must be a count of at least 1, not '" +
             text + "'")
                .str();
    return failure();
  }
  return success();
}

/// `MxN` or `MxNxK` (at most `limit` counts).
LogicalResult parseDims(StringRef key, StringRef text, size_t limit,
                        SmallVectorImpl<int64_t> &dims, std::string &error) {
  SmallVector<StringRef> parts;
  text.split(parts, 'x');
  if (parts.size() < 2 || parts.size() > limit) {
    error = ("matmul-config " + key + " takes " +
             (limit == 2 ? "MxN" : "MxN or MxNxK") + ", not '" + text + "'")
                .str();
    return failure();
  }
  for (StringRef part : parts)
    if (failed(parseCount(key, part, dims.emplace_back(), error)))
      return failure();
  return success();
}

template <typename EnumT>
LogicalResult parseEnum(StringRef key, StringRef text,
                        std::optional<EnumT> (*symbolize)(StringRef),
                        std::optional<EnumT> &value, std::string &error) {
  value = symbolize(text);
  if (!value)
    error = ("matmul-config " + key + " has no value '" + text + "'").str();
  return success(value.has_value());
}

LogicalResult parseBool(StringRef key, StringRef text,
                        std::optional<bool> &value, std::string &error) {
  if (text == "true" || text == "1")
    value = true;
  else if (text == "false" || text == "0")
    value = false;
  else
    error = ("matmul-config " + key + " is true or false, not '" + text + "'")
                .str();
  return success(value.has_value());
}

LogicalResult parsePins(StringRef spec, Pins &pins, std::string &error) {
  SmallVector<StringRef> fields;
  spec.split(fields, ',', -1, /*KeepEmpty=*/false);
  for (StringRef field : fields) {
    auto [key, value] = field.trim().split('=');
    key = key.trim(), value = value.trim();
    SmallVector<int64_t> dims;
    int64_t count = 0;
    auto one = [&](std::optional<int64_t> &slot) {
      if (failed(parseCount(key, value, count, error)))
        return failure();
      slot = count;
      return success();
    };
    LogicalResult parsed = failure();
    if (key == "tile") {
      parsed = parseDims(key, value, 3, dims, error);
      if (succeeded(parsed)) {
        pins.tileM = dims[0], pins.tileN = dims[1];
        if (dims.size() == 3)
          pins.tileK = dims[2];
      }
    } else if (key == "cluster") {
      parsed = parseDims(key, value, 2, dims, error);
      if (succeeded(parsed))
        pins.clusterM = dims[0], pins.clusterN = dims[1];
    } else if (key == "stages") {
      parsed = one(pins.stages);
    } else if (key == "warpgroups") {
      parsed = one(pins.warpGroups);
    } else if (key == "group") {
      parsed = one(pins.group);
    } else if (key == "split-k") {
      parsed = one(pins.splitK);
    } else if (key == "multicast") {
      parsed = parseEnum<MatmulMulticast>(key, value, symbolizeMatmulMulticast,
                                          pins.multicast, error);
    } else if (key == "raster") {
      parsed = parseEnum<MatmulRaster>(key, value, symbolizeMatmulRaster,
                                       pins.raster, error);
    } else if (key == "epilogue") {
      parsed = parseEnum<MatmulEpilogue>(key, value, symbolizeMatmulEpilogue,
                                         pins.epilogue, error);
    } else if (key == "swap-ab") {
      parsed = parseBool(key, value, pins.swapAB, error);
    } else if (key == "persistent") {
      parsed = parseBool(key, value, pins.persistent, error);
    } else {
      error = ("matmul-config has no field '" + key +
               "' (tile, stages, warpgroups, cluster, multicast, raster, "
               "group, split-k, swap-ab, persistent, epilogue)")
                  .str();
    }
    if (failed(parsed))
      return failure();
  }
  return success();
}

struct ConfigureMatmulsPass
    : public moe::impl::ConfigureMatmulsBase<ConfigureMatmulsPass> {
  using ConfigureMatmulsBase::ConfigureMatmulsBase;

  LogicalResult initialize(MLIRContext *context) override {
    std::string error;
    if (failed(parsePins(matmulConfig, pins, error)))
      return emitError(UnknownLoc::get(context)) << error;
    return success();
  }

  void runOnOperation() override {
    getOperation()->walk([&](func::FuncOp func) {
      SmallVector<int64_t> plans = {0};
      if (auto buckets =
              func->getAttrOfType<DenseI64ArrayAttr>(kTokenBucketsAttrName))
        llvm::append_range(plans, buckets.asArrayRef());
      func.walk([&](GroupedMatmulOp op) {
        MatmulShape shape(op);
        SmallVector<Attribute> configs;
        bool splitLeftOut = false;
        for (int64_t tokens : plans) {
          // Pins can contradict each other (multicast without a cluster).
          MatmulConfigAttr config = choose(op, shape, tokens);
          if (!config)
            return signalPassFailure();
          // The decode tile takes received rows whole (chooseDecodeTile).
          splitLeftOut |= shape.received && config.getSwapAb() &&
                          pins.splitK.value_or(1) > 1;
          configs.push_back(config);
        }
        if (splitLeftOut)
          op.emitRemark() << "matmul-config split-k=" << *pins.splitK
                          << " is not applied to the rows other ranks send in "
                             "buckets of at most "
                          << kSwapTokens
                          << " tokens: their partials would be sized for every "
                             "rank's capacity";
        op.setConfigsAttr(ArrayAttr::get(op.getContext(), configs));
      });
    });
  }

  MatmulConfigAttr choose(GroupedMatmulOp op, const MatmulShape &shape,
                          int64_t tokens) const;
  MatmulConfigAttr chooseFor(GroupedMatmulOp op, const MatmulShape &shape,
                             int64_t tokens, int64_t stamp) const;
  MatmulConfigAttr chooseDecodeTile(GroupedMatmulOp op,
                                    const MatmulShape &shape,
                                    const DecodeTile &tile,
                                    int64_t stamp) const;
  /// The decode tile's rows and shape for calls of `tokens`.
  DecodeTile decodeTile(const MatmulShape &shape, int64_t tokens) const;
  /// Whether a bucket of `tokens` takes the decode `tile`.
  bool decodeServes(const MatmulShape &shape, int64_t tokens,
                    const DecodeTile &tile) const;

  Pins pins;
};
} // namespace

/// Rows of a call of `tokens` tokens: a token chooses an expert once (from
/// each rank, when every rank brings as many).
static int64_t decodeRows(const MatmulShape &shape, int64_t tokens) {
  int64_t ranks = std::max<int64_t>(shape.received, 1);
  return std::max<int64_t>(shape.received ? tokens * ranks * shape.topK
                                          : shape.rows.fixed +
                                                shape.rows.perToken * tokens,
                           1);
}

DecodeTile ConfigureMatmulsPass::decodeTile(const MatmulShape &shape,
                                            int64_t tokens) const {
  // An expert's rows in one tile.
  int64_t ranks = std::max<int64_t>(shape.received, 1);
  int64_t rowCount = decodeRows(shape, tokens);
  int64_t expertRows =
      shape.grouped ? std::min(tokens * ranks, rowCount) : rowCount;
  DecodeTile tile;
  tile.rows = rowCount;
  tile.tileM = std::clamp<int64_t>(llvm::PowerOf2Ceil(expertRows), 8, 64);
  // 64-row fragments: two (ungated), or gate and up fragments for at
  // least 64 outputs and a whole output quantization block.
  int64_t outputs = shape.gated ? std::max<int64_t>(64, shape.outBlock) : 128;
  tile.tileN = pins.tileN.value_or(shape.gated ? 2 * outputs : outputs);
  int64_t fragments = tile.tileN / kSwapFragmentRows;
  // Accumulators, FP8 partials, scale products and a stage's scales within
  // the decode tile's registers a thread (the kernel's rule).
  bool fp8 = shape.scaleK > 0;
  int64_t sub = fp8 ? shape.tileK() / shape.scaleK : 1;
  while (tile.tileM > 8 &&
         sm90a::decodeRegisters(fragments, tile.tileM, fp8, sub) >
             sm90a::kDecodeRegisters)
    tile.tileM /= 2;
  tile.tileM = pins.tileM.value_or(tile.tileM);
  return tile;
}

bool ConfigureMatmulsPass::decodeServes(const MatmulShape &shape,
                                        int64_t tokens,
                                        const DecodeTile &tile) const {
  if (tokens <= 0 || tokens > kSwapMaxTokens)
    return false;
  if (tokens <= kSwapTokens)
    return true;
  // Row tiles a weight tile takes: an expert's mean rows (grouped) over
  // tileM.
  int64_t rowCount = tile.rows;
  int64_t rows =
      shape.grouped
          ? llvm::divideCeil(rowCount, std::min(shape.experts, rowCount))
          : rowCount;
  int64_t rereads = llvm::divideCeil(rows, tile.tileM);
  // Whether the wide tiles of a dense matmul fill the multiprocessors.
  int64_t wideTiles = llvm::divideCeil(rowCount, kTileM) * shape.colTiles();
  bool idle = !shape.grouped && wideTiles < multiprocessors;
  if (idle)
    return rereads <= kSwapRereadsIdle;
  return rows <= kSwapMeanRows && rereads <= kSwapRereads;
}

MatmulConfigAttr ConfigureMatmulsPass::chooseDecodeTile(
    GroupedMatmulOp op, const MatmulShape &shape, const DecodeTile &tile,
    int64_t stamp) const {
  auto [rowCount, tileM, tileN] = tile;
  int64_t tileK = pins.tileK.value_or(shape.tileK());
  int64_t kTiles = llvm::divideCeil(shape.k, tileK);
  // Two blocks a multiprocessor.
  MatmulLayout layout = shape.layout(tileM, tileN, tileK);
  layout.swapAb = true;
  int64_t stages = pins.stages.value_or(std::min<int64_t>(
      layout.stagesWithin(
          std::min<int64_t>(sm90a::kSharedTwoBlocks, sharedBytes), 2),
      std::max<int64_t>(kTiles, 2)));
  // Split K until the busy tiles (one per expert with rows, or per tile of
  // rows) fill the multiprocessors, where they leave more than three
  // quarters idle: a split costs its ring's fill, the partials and the
  // last block's sum, and a block streams 55 GB/s or more (H100, one
  // token: Qwen3-30B-A3B's 96 and 128 busy tiles 53.3 us a forward
  // unsplit, 56.7 split; its FP8 48 and 128 tiles 35.1 unsplit, 38.0
  // split; Mixtral's 64-tile down equal; bench/RESULTS.md).
  int64_t colTiles =
      llvm::divideCeil(shape.outN, shape.gated ? tileN / 2 : tileN);
  int64_t busy = (shape.grouped ? std::min(shape.experts, rowCount)
                                : llvm::divideCeil(rowCount, tileM)) *
                 colTiles;
  int64_t splitK = std::clamp<int64_t>(
      4 * busy > multiprocessors ? 1 : llvm::divideCeil(multiprocessors, busy),
      1, std::clamp<int64_t>(kTiles / kSwapMinSplitTiles, 1, kMaxSplits));
  // Received rows are the capacity's: their partials would be too.
  splitK = shape.received ? 1 : pins.splitK.value_or(splitK);
  if (splitK > 1 && kTiles > 0)
    splitK = llvm::divideCeil(kTiles, llvm::divideCeil(kTiles, splitK));
  return MatmulConfigAttr::getChecked(
      [&] { return op.emitOpError(); }, op.getContext(), stamp, tileM, tileN,
      tileK, stages, pins.warpGroups.value_or(1), pins.clusterM.value_or(1),
      pins.clusterN.value_or(1), pins.multicast.value_or(MatmulMulticast::None),
      pins.raster.value_or(MatmulRaster::M), pins.group.value_or(kGroup),
      splitK, /*swapAB=*/true, pins.persistent.value_or(false),
      pins.epilogue.value_or(MatmulEpilogue::Registers));
}

MatmulConfigAttr ConfigureMatmulsPass::choose(GroupedMatmulOp op,
                                              const MatmulShape &shape,
                                              int64_t tokens) const {
  // Rows received from other ranks take the decode tile in a decode bucket
  // (its kernel walks row tiles past its grid, for peers that send more),
  // else the plan for any count: a rank's bucket says nothing of what its
  // peers send.
  bool decode = tokens > 0 && tokens <= kSwapTokens;
  return chooseFor(op, shape, shape.received && !decode ? 0 : tokens, tokens);
}

/// The configuration for calls of `tokens` (0: any), stamped as the plan
/// for `stamp` tokens.
MatmulConfigAttr ConfigureMatmulsPass::chooseFor(GroupedMatmulOp op,
                                                 const MatmulShape &shape,
                                                 int64_t tokens,
                                                 int64_t stamp) const {
  // A bucket of few tokens takes the decode tile, unless a pin is the wide
  // tile's (its shape, warpgroups, clusters, shared epilogue, persistent).
  bool wide = pins.tileM || pins.tileN || pins.warpGroups || pins.clusterM ||
              pins.clusterN || pins.multicast ||
              pins.epilogue == MatmulEpilogue::Shared ||
              pins.persistent.value_or(false);
  // Weights read transposed take the wide tile of one block alone: pins
  // of the decode tile or of clusters are not theirs.
  bool transposed = op.getTransposeRhs();
  DecodeTile tile = decodeTile(shape, tokens);
  if (!transposed &&
      pins.swapAB.value_or(!wide && decodeServes(shape, tokens, tile)))
    return chooseDecodeTile(op, shape, tile, stamp);
  int64_t tileM = pins.tileM.value_or(kTileM);
  int64_t tileN = pins.tileN.value_or(kTileN);
  int64_t tileK = pins.tileK.value_or(shape.wideTileK());
  int64_t kTiles = llvm::divideCeil(shape.k, tileK);

  // The epilogue stages its bf16 results in shared memory, in 16-byte
  // pieces of a row: rows must be 16-byte aligned, and a quantizing
  // epilogue works on the registers' blocks.
  MatmulEpilogue epilogue = pins.epilogue.value_or(
      shape.outQuant || shape.outF32 || shape.outN % 8 != 0
          ? MatmulEpilogue::Registers
          : MatmulEpilogue::Shared);
  // The ring takes what shared memory is left beside the epilogue buffers,
  // as the kernel lays it out (a stage: its operands, two mbarriers and
  // for FP8 its staged scales).
  MatmulLayout layout = shape.layout(tileM, tileN, tileK);
  layout.warpGroups = pins.warpGroups.value_or(kWarpGroups);
  layout.sharedEpilogue = epilogue == MatmulEpilogue::Shared;
  int64_t stages =
      pins.stages.value_or(layout.stagesWithin(sharedBytes, /*atLeast=*/2));

  // A bucket of few rows has few tiles, each streaming all of K: it splits
  // K among several blocks so the weight reads spread over the GPU.
  int64_t rowCount = std::max<int64_t>(
      shape.rows.fixed +
          shape.rows.perToken * (tokens > 0 ? tokens : kAnyTokens),
      1);
  int64_t rowTiles = llvm::divideCeil(rowCount, tileM);
  int64_t colTiles = shape.colTiles();
  // The tiles likely busy: one per expert that has rows, and one per tile
  // of rows.
  int64_t busy = shape.grouped
                     ? (std::min(shape.experts, rowCount) + rowTiles) * colTiles
                     : rowTiles * colTiles;
  int64_t splitK = 1;
  if (tokens > 0)
    splitK = std::clamp<int64_t>(
        std::min(multiprocessors / busy, kTiles / kMinSplitTiles), 1,
        kMaxSplits);
  splitK = pins.splitK.value_or(splitK);
  // Ranges of whole stages: a count that leaves one empty is the next
  // smaller count that does not.
  if (splitK > 1 && kTiles > 0) {
    int64_t perSplit = llvm::divideCeil(kTiles, splitK);
    splitK = llvm::divideCeil(kTiles, perSplit);
  }
  // Persistent when there are more tiles than multiprocessors: the next
  // tile's loads then overlap the last one's epilogue. Not when K is long
  // and one expert's weights are large: there blocks launched in order
  // keep a wave's weight tiles in L2 better than blocks that each walk a
  // fixed stride of tiles (H100: Mixtral's 4096 x 14336 and 28672 x 4096
  // ran 5-8% slower persistent, DeepSeek-V3's 4096 x 7168 1-3% faster;
  // bench/RESULTS.md).
  // Nor when a tile has few rows (a bucket of few tokens an expert): each
  // tile is then short, and a block's tiles would find their rows one
  // after another rather than side by side (H100: Qwen3-30B-A3B MXFP8 at
  // 128 tokens, 8 rows a tile, 11% slower persistent).
  bool longK = kTiles > kPersistentKTiles &&
               shape.n * shape.k > kPersistentWeightElements;
  bool fewRows = rowCount * colTiles < busy * tileM / 2;
  bool persistent = pins.persistent.value_or(
      splitK == 1 && busy > multiprocessors && !longK && !fewRows);

  return MatmulConfigAttr::getChecked(
      [&] { return op.emitOpError(); }, op.getContext(), stamp, tileM, tileN,
      tileK, stages, pins.warpGroups.value_or(kWarpGroups),
      transposed ? 1 : pins.clusterM.value_or(1), pins.clusterN.value_or(1),
      transposed ? MatmulMulticast::None
                 : pins.multicast.value_or(MatmulMulticast::None),
      pins.raster.value_or(MatmulRaster::M), pins.group.value_or(kGroup),
      splitK, !transposed && pins.swapAB.value_or(false), persistent, epilogue);
}
