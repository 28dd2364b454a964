//===- GroupedMatmul.cpp - the expert matmul kernel -----------------------===//
//
// moe.grouped_matmul (and its dense form) on the tensor cores, for bf16 and
// FP8 (E4M3) operands. A block computes a tile of 128 rows x 256 weight rows
// with three warpgroups: a producer, one of whose threads loads 128-byte K
// slices of both operands (64 bf16 or 128 E4M3) with TMA into a 4-slot
// shared-memory ring (128-byte swizzle; a "loaded" and a "released" mbarrier
// per slot), and two consumers that each issue wgmma for 64 of the rows,
// both operands K-major, and release each slot when done with it.
// bf16 accumulates the whole K in one m64n256k16 fragment.
// FP8 multiplies each scale block (128 of K for FP8 block-128, 32 for MXFP8)
// into a fresh f32 partial with m64n128k32 and adds partial x row scale x
// column scale to the accumulator, as the CPU backend does: the tensor
// cores' FP8 sums are short, and the scales differ per block. MXFP8 with
// 64 codes a stage (tile_k = 64) instead converts each stage to bf16 in
// shared memory (exact: a code times a power of two) and multiplies it as
// bf16, converting the next stage while the tensor cores run. The epilogue
// adds the bias, applies the gated activation (a tile holds 128 gate and the
// matching 128 up columns) and stores bf16 from registers, or quantizes each
// row's blocks first (out_quant). A grouped matmul
// finds its block's expert and rows from the device's counts, so its grid is
// an upper bound and spare blocks exit. A bucket of few tokens takes the
// decode tile instead (DecodeMatmul.cpp).
//
//===----------------------------------------------------------------------===//

#include "codegen/common/FP8.h"
#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/DecodeMatmul.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/kernels/Matmul.h"
#include "codegen/nvidia/support/Hopper.h"
#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static constexpr int64_t kSliceBytes = MatmulEncoding::kSliceBytes;
// Named barriers: 1 joins the consumers (split-K, converted MXFP8
// stages), 2 + g consumer warpgroup g (its epilogue buffer).
static constexpr int64_t kEpilogueBarrier = 2;
/// Named barriers 4 + g: consumer warpgroup g's turn to issue wgmma (the
/// other's is 4 + g xor 1).
static constexpr int64_t kTurnBarrier = 4;
// Decode-tile blocks for rows a bucket does not bound: two on each
// multiprocessor.
static constexpr int64_t kDecodeBlocks = sm90a::kTwoBlocksEach;

MatmulEncoding::MatmulEncoding(QuantAttr scheme, int64_t tileN, int64_t tileK)
    : scheme(scheme), tileN(tileN), instN(tileN) {
  if (!scheme)
    return;
  elementBytes = 1;
  scaleK = scheme.getBlockSize();
  // E4M3 times a power of two is exact in bf16, and a product of bf16 in
  // f32: the converted tile multiplies as bf16, the whole width at once.
  if (sm90a::MatmulLayout::converts(scheme.getKind() == QuantKind::MXFP8,
                                    tileK)) {
    convert = true;
    return;
  }
  // An FP8 partial needs registers beside the accumulator: two m64n128
  // fragments (gate and up, or the two column halves) of 64 f32 each.
  instN = 128;
  type = NVVM::WGMMATypes::e4m3;
}

/// The four E4M3 codes of `word` (i32, the first in its low byte) as two
/// vector<2xbf16> pairs (codes 0-1, 2-3), each the code's value times
/// 2^-120 exactly, E4M3's subnormals becoming bf16 subnormals: multiplied
/// by 2^(120 + s) (a normal bf16) they give code x 2^s exactly. A code's
/// sign is its half's, and its 7 bits of exponent and mantissa go 4 bits
/// down into the bf16's, its exponent 120 below: for all four codes at
/// once, the halves' high bytes (the sign, and the code's bits 4-6 in bits
/// 0-2) and low bytes (its bits 0-3 in bits 4-7), then two byte permutes
/// interleave them.
static SmallVector<Value, 2> e4m3ToBF16Pairs(Emitter &e, Value word) {
  OpBuilder &b = e.b;
  Type i32 = b.getI32Type();
  auto pairType = VectorType::get({2}, b.getBF16Type());
  Value high = e.ori(e.andi(word, e.i32(0x80808080)),
                     arith::ShRUIOp::create(
                         b, e.loc, e.andi(word, e.i32(0x70707070)), e.i32(4)));
  Value low = arith::ShLIOp::create(b, e.loc, e.andi(word, e.i32(0x0F0F0F0F)),
                                    e.i32(4));
  SmallVector<Value, 2> pairs;
  // Bytes (low 0, high 0, low 1, high 1), then (low 2, high 2, low 3,
  // high 3).
  for (int32_t selector : {0x5140, 0x7362}) {
    Value pair = NVVM::PermuteOp::create(
        b, e.loc, i32, low, high, e.i32(selector), NVVM::PermuteMode::DEFAULT);
    pairs.push_back(vector::BitCastOp::create(
        b, e.loc, pairType,
        vector::FromElementsOp::create(b, e.loc, VectorType::get({1}, i32),
                                       pair)));
  }
  return pairs;
}

/// Refuses the fields of a decode tile's `config` (swap_ab) that the
/// kernel cannot honour.
static LogicalResult checkSwapConfig(GroupedMatmulOp op,
                                     MatmulConfigAttr config,
                                     const MatmulConfig &c) {
  auto refuse = [&](StringRef field, auto value) {
    return op.emitOpError() << "has matmul_config " << field << " = " << value
                            << ", which the sm_90a decode tile (swap_ab) "
                               "cannot honour: ";
  };
  if (c.tileM < 8 || c.tileM > 64 || c.tileM % 8 != 0)
    return refuse("tile_m", c.tileM)
           << "its rows are wgmma's N: 8 to 64, a multiple of 8";
  int64_t unit = c.gated ? 2 * MatmulConfig::kSwapFragmentRows
                         : MatmulConfig::kSwapFragmentRows;
  if (c.tileN < unit || c.tileN > 256 || c.tileN % unit != 0)
    return refuse("tile_n", c.tileN)
           << "it takes 64-row weight fragments, at most 4"
           << (c.gated ? ", as many gate as up" : "");
  if (c.outBlock && c.outTile % c.outBlock != 0)
    return refuse("tile_n", c.tileN)
           << "a quantizing epilogue needs whole blocks of " << c.outBlock
           << " outputs in a tile, and it has " << c.outTile;
  // Accumulators; FP8 partials, scale products and a stage's scales.
  int64_t registers = sm90a::decodeRegisters(c.swapFragments(), c.tileM,
                                             c.enc.fp8(), c.enc.subBlocks());
  if (registers > sm90a::kDecodeRegisters)
    return refuse("tile_m", c.tileM)
           << "its accumulators"
           << (c.enc.fp8()
                   ? ", FP8 partials, scale products and a stage's scales"
                   : "")
           << " would take " << registers << " registers a thread, more than "
           << sm90a::kDecodeRegisters;
  if (config.getTileK() != c.enc.tileK())
    return refuse("tile_k", config.getTileK())
           << "it takes 128 bytes of K a stage (" << c.enc.tileK()
           << " elements)";
  if (config.getWarpgroups() != 1)
    return refuse("warpgroups", config.getWarpgroups())
           << "it has one consumer warpgroup";
  if (config.getClusterM() != 1)
    return refuse("cluster_m", config.getClusterM())
           << "its blocks do not form clusters";
  if (config.getClusterN() != 1)
    return refuse("cluster_n", config.getClusterN())
           << "its blocks do not form clusters";
  if (c.persistent)
    return refuse("persistent", "true") << "it runs a block per tile";
  if (c.sharedEpilogue)
    return refuse("epilogue", "shared") << "it stores from registers";
  if (c.rowTiles == 0)
    return refuse("swap_ab", "true")
           << "a decode tile needs a bucket's bound on the rows";
  if (c.splits > c.kTiles ||
      int64_t(llvm::divideCeil(c.kTiles, c.tilesPerSplit)) != c.splits)
    return refuse("split_k", c.splits)
           << "K's " << c.kTiles << " stages do not cut into " << c.splits
           << " non-empty ranges";
  if (c.stages < 2)
    return refuse("stages", c.stages)
           << "a stage's slot is released while the next is multiplied: "
              "the ring needs two";
  // The ring, its barriers and the epilogue's block statistics and split
  // ticket (static).
  int64_t outFragments = c.gated ? c.swapFragments() / 2 : c.swapFragments();
  int64_t statics = c.barrierBytes() + 16 +
                    (c.outBlock ? 2 * outFragments * 4 * c.tileM * 4 : 0);
  if (c.sharedBytes() + statics > sm90a::kSharedPerBlock)
    return refuse("stages", c.stages)
           << "the ring, its barriers and the epilogue's statistics need "
           << c.sharedBytes() + statics
           << " bytes of shared memory, more than the "
           << sm90a::kSharedPerBlock << " a block may have";
  return success();
}

/// Refuses `config` fields the kernel cannot honour: an error that names
/// the field and what the kernel takes.
static LogicalResult checkConfig(GroupedMatmulOp op, MatmulConfigAttr config,
                                 const MatmulConfig &c) {
  auto refuse = [&](StringRef field, auto value) {
    return op.emitOpError() << "has matmul_config " << field << " = " << value
                            << ", which the sm_90a kernel cannot honour: ";
  };
  if (c.transposed && (c.swapAb || c.cluster > 1))
    return refuse(c.swapAb ? "swap_ab" : "cluster_m", c.swapAb ? 1 : c.cluster)
           << "weights read transposed (transpose_rhs) take the wide tile "
              "of one block";
  if (c.swapAb)
    return checkSwapConfig(op, config, c);
  if (config.getTileM() != c.tileM)
    return refuse("tile_m", config.getTileM()) << "it takes 128-row tiles";
  if (config.getTileN() != c.tileN)
    return refuse("tile_n", config.getTileN())
           << "it takes tiles of 256 weight rows";
  if (config.getTileK() != c.enc.tileK())
    return refuse("tile_k", config.getTileK())
           << "it takes 128 bytes of K a stage (" << c.enc.tileK()
           << " elements)"
           << (c.enc.scheme && c.enc.scheme.getKind() == QuantKind::MXFP8
                   ? ", or 64 MXFP8 codes that it converts to bf16"
                   : "");
  if (c.enc.convert && config.getClusterM() > 1)
    return refuse("cluster_m", config.getClusterM())
           << "MXFP8 codes converted to bf16 (tile_k = 64) take one block's "
              "ring";
  if (config.getWarpgroups() != c.warpGroups)
    return refuse("warpgroups", config.getWarpgroups())
           << "it has two consumer warpgroups";
  if (config.getClusterM() > 2)
    return refuse("cluster_m", config.getClusterM())
           << "its clusters are of one or two blocks";
  if (config.getClusterN() != 1)
    return refuse("cluster_n", config.getClusterN())
           << "its clusters share the weight tile, along M alone";
  if (c.cluster > 1 && config.getMulticast() != MatmulMulticast::Rhs)
    return refuse("multicast", stringifyMatmulMulticast(config.getMulticast()))
           << "a cluster's blocks share the weight tile: multicast is rhs";
  if (c.cluster > 1 && c.splits > 1)
    return refuse("cluster_m", c.cluster)
           << "a cluster's blocks walk whole K, not split_k ranges";
  if (c.splits > 1 && c.rowTiles == 0)
    return refuse("split_k", c.splits)
           << "splitting K needs a bucket's bound on the rows";
  if (c.splits > c.kTiles ||
      int64_t(llvm::divideCeil(c.kTiles, c.tilesPerSplit)) != c.splits)
    return refuse("split_k", c.splits)
           << "K's " << c.kTiles << " stages do not cut into " << c.splits
           << " non-empty ranges";
  if (c.sharedEpilogue && c.outBlock)
    return refuse("epilogue", "shared")
           << "a quantizing epilogue stores from registers";
  if (!c.sharedEpilogue && c.activationGrad)
    return refuse("epilogue", "registers")
           << "an activation's backward stages its input's rows in shared "
              "memory";
  if (c.sharedEpilogue && c.outN % 8 != 0)
    return refuse("epilogue", "shared")
           << "its 16-byte stores need output rows of a multiple of 8 "
              "columns, and N is "
           << c.outN;
  if (c.stages < 2)
    return refuse("stages", c.stages)
           << "a stage's slot is released while the next is multiplied: "
              "the ring needs two";
  if (c.sharedBytes() + c.barrierBytes() > sm90a::kSharedPerBlock)
    return refuse("stages", c.stages)
           << "the ring, its barriers and the buffers need "
           << c.sharedBytes() + c.barrierBytes()
           << " bytes of shared memory, more than the "
           << sm90a::kSharedPerBlock << " a block may have";
  return success();
}

FailureOr<MatmulConfig> nvidia::configureMatmul(GroupedMatmulOp op,
                                                TokenLinear rows,
                                                int64_t maxTokens) {
  MatmulConfigAttr config = op.getConfigFor(maxTokens);
  if (!config)
    return op.emitOpError() << "has no matmul_config for calls of "
                            << (maxTokens ? std::to_string(maxTokens)
                                          : std::string("any count of"))
                            << " tokens (run moe-configure-matmuls)";
  MatmulConfig c;
  auto rhsType = cast<RankedTensorType>(op.getRhs().getType());
  if (config.getSwapAb()) {
    // A decode tile: tile_m rows as wgmma's N, tile_n weight rows.
    c.swapAb = true;
    c.tileM = config.getTileM();
    c.tileN = config.getTileN();
    c.warpGroups = 1;
  }
  c.enc =
      MatmulEncoding(op.getScheme(), c.tileN, c.swapAb ? 0 : config.getTileK());
  if (c.swapAb)
    c.enc.instN = c.tileM;
  c.converted = c.enc.convert;
  c.tileK = c.enc.tileK();
  c.elementBytes = c.enc.elementBytes;
  c.scaleK = c.enc.scaleK;
  c.stages = config.getStages();
  c.grouped = static_cast<bool>(op.getTokensPerExpert());
  c.experts = c.grouped ? rhsType.getDimSize(0) : 1;
  c.n = op.getN();
  c.kDim = op.getK();
  c.transposed = op.getTransposeRhs();
  // Weight scales: one per 128 x 128 block (FP8 block-128) or per row and
  // K block (MXFP8, or block-128 weights quantized in 1 x 128 blocks).
  if (c.enc.fp8())
    c.rhsScaleRows = common::scaleRowsPerBlock(
        rhsType.getShape(),
        cast<RankedTensorType>(op.getRhsScale().getType()).getShape(),
        c.enc.scheme);
  c.columnScales = c.enc.fp8() && c.rhsScaleRows == 1;
  if (c.enc.fp8() && !c.swapAb) {
    c.producerRegisters = sm90a::kScaleProducerRegisters;
    c.consumerRegisters = sm90a::kScaleConsumerRegisters;
  }
  c.activationGrad = op.isActivationGrad();
  c.gated = static_cast<bool>(op.getActivationAttr()) && !c.activationGrad;
  c.outN = c.gated ? c.n / 2 : c.n;
  c.outTile = c.gated ? c.tileN / 2 : c.tileN;
  if (QuantAttr outQuant = op.getOutQuantAttr())
    c.outBlock = outQuant.getBlockSize();
  // A gated tile's up half starts at n / 2: when that is not a multiple of
  // 128 the half spans two square weight blocks.
  if (c.gated && (c.n / 2) % 128 != 0)
    c.scaleSplit[1] = 128 - (c.n / 2) % 128;
  c.cluster = config.getClusterM();
  c.persistent = config.getPersistent();
  c.raster = config.getRaster();
  c.group = config.getGroup();
  c.sharedEpilogue = config.getEpilogue() == MatmulEpilogue::Shared;
  c.epiloguePlanes = c.activationGrad ? 2 : 1;

  // Split tiles sum their f32 partials in split order in the tile's last
  // block, which runs the epilogue. A bucket's grid is cut to the tiles
  // its rows can have: a tile holds at least one row.
  c.kTiles = llvm::divideCeil(c.kDim, c.enc.tileK());
  c.colTiles = llvm::divideCeil(c.outN, c.outTile);
  c.splits = config.getSplitK();
  c.tilesPerSplit = llvm::divideCeil(c.kTiles, c.splits);
  if (maxTokens > 0) {
    int64_t rowCount =
        std::max<int64_t>(rows.fixed + rows.perToken * maxTokens, 1);
    c.rowTiles = llvm::divideCeil(rowCount, c.clusterRows());
    if (c.grouped)
      c.rowTiles = std::min(c.rowTiles + c.experts, rowCount);
  }
  if (failed(checkConfig(op, config, c)))
    return failure();
  return c;
}

namespace {
/// The pieces of the wgmma main loop: an accumulator is an LLVM struct of
/// f32, one m64nN fragment per warpgroup.
struct Wgmma {
  Kernel &k;
  OpBuilder &b;
  Location loc;
  const MatmulEncoding &enc;
  Type fragment;

  Wgmma(Kernel &k, const MatmulEncoding &enc)
      : k(k), b(k.b), loc(k.e.loc), enc(enc) {
    SmallVector<Type> fields(enc.fragment(), b.getF32Type());
    fragment = LLVM::LLVMStructType::getLiteral(b.getContext(), fields);
  }
  Value zero() { return zeroFragment(b, loc, fragment); }
  /// The descriptor of a K-major tile at shared address `address` (i64):
  /// 128-byte swizzle, 1024 bytes between 8-row groups.
  Value descriptor(Value address) {
    return swizzledDescriptor(b, loc, address);
  }
  Value fence(Value acc) { return fenceFragment(b, loc, acc); }
  /// `desc` with its address field `step` x 16 bytes further.
  Value stepped(Value desc, int64_t step) {
    if (step == 0)
      return desc;
    Type i32 = b.getI32Type(), i64 = b.getI64Type();
    Value low = LLVM::TruncOp::create(b, loc, i32, desc);
    Value high = LLVM::LShrOp::create(b, loc, desc, k.constI64(32));
    low = LLVM::AddOp::create(
        b, loc, low, LLVM::ConstantOp::create(b, loc, i32, int32_t(step)));
    return LLVM::OrOp::create(
        b, loc, LLVM::ZExtOp::create(b, loc, i64, low),
        LLVM::ShlOp::create(b, loc, high, k.constI64(32)));
  }
  /// acc + A x B, or A x B alone when `accumulate` is false; B MN-major
  /// where `bMNMajor`.
  Value mma(Value acc, Value a, Value bDesc, bool accumulate = true,
            bool bMNMajor = false) {
    if (bMNMajor)
      return wgmma(b, loc, fragment, acc, a, bDesc, enc.instN, enc.instK(),
                   enc.type, accumulate, /*aMNMajor=*/false, /*bMNMajor=*/true);
    return wgmmaKMajor(b, loc, fragment, acc, a, bDesc, enc.instN, enc.instK(),
                       enc.type, accumulate);
  }
};
} // namespace

/// What K is in the layer, from the step moe-decompose named the matmul.
static std::string describeK(GroupedMatmulOp op) {
  auto step = dyn_cast<NameLoc>(op.getLoc());
  StringRef name = step ? step.getName().strref() : "";
  if (name == "down")
    return "the intermediate size, in the down matmul";
  if (name == "shared_down")
    return "the shared experts' intermediate size, in their down matmul";
  if (!name.empty())
    return ("the hidden size, in the " + name + " matmul").str();
  return "the length of the rows it multiplies";
}

namespace {
/// Emits a grouped matmul kernel of a given configuration, stage by stage:
/// the block's tile, the shared-memory ring, the producer, the consumers'
/// main loop, the split-K sum and the epilogue. The values several stages
/// use are members, set in emission order.
class MatmulEmitter {
public:
  MatmulEmitter(LayerKernels &layer, GroupedMatmulOp op,
                const MatmulConfig &config, const TensorInfo &lhs, Kernel &k)
      : layer(layer), op(op), c(config), enc(config.enc), lhs(lhs), k(k),
        e(k.e), b(k.b), ctx(b.getContext()) {}

  /// Emits the kernel body; its parameters are `buffers` (tensors of the
  /// op), then the split-K partials and counters, then the two tensor maps.
  LogicalResult emit(ArrayRef<Value> buffers, ArrayRef<unsigned> indices,
                     const TensorInfo &partials);

private:
  void emitViews(ArrayRef<Value> buffers, ArrayRef<unsigned> indices,
                 const TensorInfo &partials);
  void emitTiles(bool consumer);
  void emitTileAt(Value u, Value split);
  Value emitTile(Value pos, bool consumer);
  void emitSharedMemory();
  void emitThreadLayout();
  void emitProducer();
  void emitConsumer();
  SmallVector<Value> emitMainLoop();
  void emitScaledStage(SmallVector<Value> &accs, ValueRange scales, Value slot);
  Value emitConvertedStage(Value acc, Value stage, Value slot);
  void emitConvert(Value slot, Value buffer);
  void emitSplitSum(SmallVector<Value> &finals, Value counters);
  void emitStore(ArrayRef<Value> finals);
  void emitSharedStore(ArrayRef<Value> finals);
  void emitQuantizedStore(ArrayRef<Value> finals);
  void emitActivationGradStore(ArrayRef<Value> finals);
  /// This consumer warpgroup's epilogue buffer: [planes x] 64 rows of
  /// kEpilogueColumns bf16 (sm90a::MatmulLayout). It also sets the id of
  /// the named barrier of the warpgroup's 128 threads, which
  /// epilogueBarrier() then syncs on (computed there, where the epilogue
  /// begins).
  Value epilogueBuffer();
  void epilogueBarrier();
  /// Joins both consumer warpgroups (named barrier 1).
  void consumersBarrier();

  MemRefType tileType(int64_t rows);
  SmallVector<int64_t> transposedBox();
  /// A transposed weight chunk: tileK rows of 128 bytes.
  int64_t transposedChunkBytes() const { return enc.tileK() * kSliceBytes; }
  nvgpu::TensorMapDescriptorType mapType(int64_t rows);
  Value tile(Value slot, int64_t offset, int64_t rows);
  Value tile(Value slot, Value offset, int64_t rows);
  Value fragmentColumn(int64_t i);
  Value ringSlot(Value j);
  Value kBlockOf(Value kt, int64_t s);
  void issue(Value kt, Value slot);
  void release(Value slot);
  void takeTurn();
  void passTurn();
  void storeStagedScales(Value kt, Value slot, Value p);
  void storeColumnScales(Value kt, Value slot, Value p);
  SmallVector<Value> stagedScales(Value kt, Value slot);
  Value multiply(Value acc, int64_t h, int64_t first, int64_t last,
                 bool accumulate);
  Value weightRow(int64_t h, int64_t i);
  Value column(ArrayRef<Value> finals, int64_t i);
  Value addBias(Value v, Value col);
  Value output(ArrayRef<Value> finals, int64_t i, Value col);

  LayerKernels &layer;
  GroupedMatmulOp op;
  const MatmulConfig &c;
  const MatmulEncoding &enc;
  const TensorInfo &lhs;
  Kernel &k;
  Emitter &e;
  OpBuilder &b;
  MLIRContext *ctx;
  std::optional<Wgmma> w;

  // The kernel's parameters.
  Value out, counts, offsets, bias, lhsScale, rhsScale, outScale;
  Value activationInput, rowWeights, rowTerm, rowDots;
  Value descA, descB, partialView;
  unsigned splitCounters = 0;
  // The block's tile: its row tiles, its place among the tiles (tileU
  // counts (row tile, column tile) pairs), K range, expert and rows; the
  // ring position of its first stage.
  Value tid, mTiles, splitIdx, tileU, kBegin, kCount, mTile, nTile;
  Value expert, rowStart, rowEnd, ringBase;
  // The block's place in its cluster; the named barriers of this consumer
  // warpgroup's turn and of the other's.
  Value rank, myTurn, otherTurn;
  // Shared memory: the ring, its mbarriers, the column and the staged
  // (row and weight-block) scales.
  std::optional<AlignedShared> shared;
  std::optional<Ring> ring;
  Value columnScaleTile, stagedScaleTile, barriers, empty;
  // MXFP8 converted: the bf16 stages, as i32 words.
  Value convertWords;
  // Indices of the tile, and of this thread's fragment.
  Value rowStartIdx, rowEndIdx, expertIdx, colTile, halfRows[2], bRow0, bRow1;
  Value group, warp, lane, rowBase, colBase, tileRows[2];
  // Consumer state: this warpgroup's offset in an A tile, a stage's
  // operands, its epilogue's named barrier.
  Value groupOffset, aBase, bBase, epilogueBarrierId;
};
} // namespace

void MatmulEmitter::emitViews(ArrayRef<Value> buffers,
                              ArrayRef<unsigned> indices,
                              const TensorInfo &partials) {
  MatmulViews views(layer, op, c, k, buffers);
  out = views.out, counts = views.counts, offsets = views.offsets;
  bias = views.bias, lhsScale = views.lhsScale, rhsScale = views.rhsScale;
  outScale = views.outScale;
  activationInput = views.activationInput, rowWeights = views.rowWeights;
  rowTerm = views.rowTerm, rowDots = views.rowDots;
  unsigned firstMap = indices.size();
  descA = k.tensorMap(firstMap, mapType(c.tileM));
  descB = k.tensorMap(firstMap + 1,
                      c.transposed
                          ? matmulMapType(ctx, b.getBF16Type(), transposedBox())
                          : mapType(c.tileN / 2));
  partialView = c.splits > 1 ? k.view(indices.size() - 2, partials) : Value();
}

MemRefType MatmulEmitter::tileType(int64_t rows) {
  Type element = enc.fp8() ? Type(b.getI8Type()) : Type(b.getBF16Type());
  return sharedType({rows, enc.tileK()}, element);
}

nvgpu::TensorMapDescriptorType MatmulEmitter::mapType(int64_t rows) {
  return matmulMapType(ctx, tileType(rows).getElementType(), rows, enc.tileK());
}

void MatmulEmitter::emitTiles(bool consumer) {
  if (!c.persistent) {
    // A block per tile: row tiles on x, column tile x split on y (splits
    // consecutive).
    mTiles =
        e.divUI(gpu::GridDimOp::create(b, e.loc, gpu::Dimension::x), c.cluster);
    Value y = k.blockId(gpu::Dimension::y);
    emitTileAt(e.iadd(e.imul(e.divUI(y, c.splits), mTiles),
                      e.divUI(k.blockId(gpu::Dimension::x), c.cluster)),
               e.remUI(y, c.splits));
    emitTile(e.index(0), consumer);
    return;
  }
  // One cluster per multiprocessor (pair) walks tiles t = cluster,
  // cluster + clusters, ...; the producer and the consumers walk the same
  // tiles, so their ring positions agree, and so do a cluster's blocks.
  // Row tiles (of a cluster's rows): grouped, those the experts' rows
  // fill (rows received from other ranks are counted on the device, far
  // fewer than the capacity the grid is sized for); else the bucket's, or
  // those the rows can fill.
  if (c.grouped) {
    mTiles = countTiles(e, tid, counts, c.experts, c.clusterRows());
  } else if (c.rowTiles > 0) {
    mTiles = e.index(c.rowTiles);
  } else {
    mTiles = e.divUI(e.iadd(k.linear(lhs.rows), e.index(c.clusterRows() - 1)),
                     c.clusterRows());
  }
  Value total = e.imul(e.imul(mTiles, c.colTiles), c.splits);
  Value step =
      e.divUI(gpu::GridDimOp::create(b, e.loc, gpu::Dimension::x), c.cluster);
  auto loop = scf::ForOp::create(
      b, e.loc, e.divUI(k.blockId(gpu::Dimension::x), c.cluster), total, step,
      ValueRange{e.index(0)});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  Value t = loop.getInductionVar();
  emitTileAt(e.divUI(t, c.splits), e.remUI(t, c.splits));
  Value next = emitTile(loop.getRegionIterArgs()[0], consumer);
  scf::YieldOp::create(b, e.loc, next);
}

void MatmulEmitter::emitTileAt(Value u, Value split) {
  tileU = u;
  splitIdx = split;
  // This split's K slices [kBegin, kBegin + kCount).
  kBegin = e.imul(splitIdx, c.tilesPerSplit);
  kCount = e.minUI(e.index(c.tilesPerSplit), e.isub(e.index(c.kTiles), kBegin));
  // Consecutive tiles walk `group` tiles along the raster dimension, then
  // step across: the tiles a wave of blocks runs share their operands in
  // L2.
  bool alongM = c.raster == MatmulRaster::M;
  Value along = alongM ? mTiles : e.index(c.colTiles);
  Value across = alongM ? e.index(c.colTiles) : mTiles;
  Value perGroup = e.imul(across, c.group);
  Value first = e.imul(e.divUI(u, perGroup), c.group);
  Value width = e.minUI(e.index(c.group), e.isub(along, first));
  Value inGroup = e.remUI(u, perGroup);
  Value alongTile = e.iadd(first, e.remUI(inGroup, width));
  Value acrossTile = e.divUI(inGroup, width);
  mTile = alongM ? alongTile : acrossTile;
  nTile = alongM ? acrossTile : alongTile;
}

Value MatmulEmitter::emitTile(Value pos, bool consumer) {
  // This tile's expert and rows [rowStart, rowEnd).
  if (c.grouped) {
    auto found = findTile(e, tid, counts, offsets, c.experts, c.clusterRows(),
                          e.toI32(mTile));
    expert = found[0];
    rowStart = found[1];
    rowEnd = found[2];
  } else {
    // A tile past the call's rows (a grid sized for a bucket) has none.
    rowStart = e.toI32(e.imul(mTile, c.clusterRows()));
    rowEnd = e.toI32(k.linear(lhs.rows));
    expert = e.select(e.icmp(arith::CmpIPredicate::slt, rowStart, rowEnd),
                      e.i32(0), e.i32(-1));
  }
  if (c.cluster > 1) {
    // The block's share of the cluster's rows. One past the rows still
    // loads its share of the weights for the others and computes, but
    // stores nothing (rowStart = rowEnd).
    rowStart = arith::MinSIOp::create(
        b, e.loc, e.iadd(rowStart, e.toI32(e.imul(rank, c.tileM))), rowEnd);
  }
  // A tile with rows takes kCount ring stages.
  auto active = scf::IfOp::create(
      b, e.loc, TypeRange{b.getIndexType()},
      e.icmp(arith::CmpIPredicate::sge, expert, e.i32(0)), /*withElse=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&active.getElseRegion().front());
  scf::YieldOp::create(b, e.loc, pos);
  b.setInsertionPointToStart(&active.getThenRegion().front());
  ringBase = pos;
  emitThreadLayout();
  {
    OpBuilder::InsertionGuard inTile(b);
    if (consumer)
      emitConsumer();
    else
      emitProducer();
  }
  b.setInsertionPointToEnd(&active.getThenRegion().front());
  scf::YieldOp::create(b, e.loc, e.iadd(pos, kCount));
  return active.getResult(0);
}

void MatmulEmitter::emitSharedMemory() {
  // Shared memory (sm90a::MatmulLayout): stages x (A 128 rows, B 256 rows)
  // of 128 bytes, aligned for the 128-byte swizzle.
  shared.emplace(e);
  ring.emplace(Ring{*shared, c.stages, c.stageBytes()});
  // [stages][sub-blocks][256 columns] f32, after the ring: each stage's
  // per-column weight scales, written by the producer warpgroup.
  if (c.columnScales)
    columnScaleTile = shared->view(
        sharedType({c.stages, enc.subBlocks(), c.tileN}, b.getF32Type()),
        e.index(c.columnScaleOffset()));
  // [stages][sub-blocks][tile rows (+ block scales)], after those: each
  // stage's row scales (and square weight-block scales), also written by
  // the producer warpgroup, so the consumers' loop loads no scale from
  // global memory and computes no scale address.
  if (enc.fp8())
    stagedScaleTile = shared->view(
        sharedType({c.stages, enc.subBlocks(), c.stagedScales()},
                   c.columnScales ? Type(b.getI8Type()) : Type(b.getF32Type())),
        e.index(c.stagedScaleOffset()));

  if (enc.convert)
    convertWords = shared->view(
        sharedType({c.convertBuffers() * c.convertBytes() / 4}, b.getI32Type()),
        e.index(c.convertOffset()));

  // `barriers[s]` completes when slot s is loaded (TMA bytes), `empty[s]`
  // when every consumer thread is done reading it.
  barriers = createBarriers(e, c.stages);
  empty = createBarriers(e, c.stages);
  Value leader = e.eq(tid, e.index(0));
  // With FP8 every producer thread also arrives on a slot's barrier once
  // it has stored its scales there.
  int64_t fullArrivals = enc.fp8() ? 1 + 128 : 1;
  // A cluster's slot is free once every consumer warp of its blocks is
  // done with it; alone, once every consumer thread is.
  int64_t emptyArrivals =
      c.cluster > 1 ? c.cluster * c.consumers() / 32 : c.consumers();
  initBarriers(e, leader, c.stages,
               {{barriers, fullArrivals}, {empty, emptyArrivals}});
  fenceBarrierInits(e, leader);
}

Value MatmulEmitter::tile(Value slot, int64_t offset, int64_t rows) {
  return tile(slot, e.index(offset), rows);
}

Value MatmulEmitter::tile(Value slot, Value offset, int64_t rows) {
  return ring->view(tileType(rows), slot, offset);
}

void MatmulEmitter::emitThreadLayout() {
  rowStartIdx = e.toIndex(rowStart);
  rowEndIdx = e.toIndex(rowEnd);
  expertIdx = e.toIndex(expert);
  colTile = e.imul(nTile, c.outTile);
  // The first weight row (within the expert) of each 128-column half.
  halfRows[0] = colTile;
  halfRows[1] = c.gated ? e.iadd(colTile, e.index(c.n / 2))
                        : e.iadd(colTile, e.index(c.tileN / 2));
  bRow0 = e.iadd(e.imul(expertIdx, c.n), halfRows[0]);
  bRow1 = e.iadd(e.imul(expertIdx, c.n), halfRows[1]);

  // Fragment element i of a thread in warp w (of its warpgroup), lane l is
  // row 16w + l/4 + 8((i/2)%2) and column 8(i/4) + 2(l%4) + i%2 of its
  // m64nN result.
  group = e.divUI(tid, 128);
  warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  rowBase = e.iadd(e.iadd(e.iadd(rowStartIdx, e.imul(group, c.groupRows())),
                          e.imul(warp, 16)),
                   e.divUI(lane, 4));
  colBase = e.imul(e.remUI(lane, 4), 2);

  // FP8: this thread's two rows within the tile, for their staged scales.
  tileRows[0] = e.isub(rowBase, rowStartIdx);
  tileRows[1] = e.iadd(tileRows[0], e.index(8));
}

Value MatmulEmitter::fragmentColumn(int64_t i) {
  return e.iadd(colBase, e.index((i / 4) * 8 + i % 2));
}

Value MatmulEmitter::ringSlot(Value j) {
  return ring->slot(e.iadd(ringBase, j));
}

void MatmulEmitter::issue(Value kt, Value slot) {
  // Thread 0 loads K slice `kt` into ring slot `slot`.
  Value col = e.imul(kt, enc.tileK());
  expectBytes(e, barriers, c.stageBytes(), slot);
  tmaLoad(e, tile(slot, 0, c.tileM), barriers, descA,
          ValueRange{col, rowStartIdx}, slot);
  int64_t bOffset = c.tileM * c.rowBytes();
  if (c.cluster > 1) {
    // Block r loads weight half r into the same slot of both blocks; each
    // block's barrier counts both halves' bytes.
    Value share = e.iadd(e.index(bOffset), e.imul(rank, c.halfBytes()));
    Value mask = arith::ConstantIntOp::create(b, e.loc, b.getI16Type(),
                                              (1 << c.cluster) - 1);
    tmaLoad(e, tile(slot, share, c.tileN / 2), barriers, descB,
            ValueRange{col, e.select(e.eq(rank, e.index(0)), bRow0, bRow1)},
            slot, mask);
    return;
  }
  if (c.transposed) {
    // Weights [E, K, N]: the slice's tileK rows of K, each half's columns
    // as boxes of wgmma's MN-major chunks, one after another.
    Value kRow = e.imul(kt, enc.tileK());
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < c.tileN / 2 / sm90a::kMNMajorChunkColumns; ++j) {
        SmallVector<Value> at = {
            e.iadd(halfRows[h], e.index(j * sm90a::kMNMajorChunkColumns)),
            kRow};
        if (c.grouped)
          at.push_back(expertIdx);
        tmaLoad(e,
                ring->view(sharedType(transposedBox(), b.getBF16Type()), slot,
                           e.index(bOffset + h * c.halfBytes() +
                                   j * transposedChunkBytes())),
                barriers, descB, at, slot);
      }
    return;
  }
  tmaLoad(e, tile(slot, bOffset, c.tileN / 2), barriers, descB,
          ValueRange{col, bRow0}, slot);
  tmaLoad(e, tile(slot, bOffset + c.halfBytes(), c.tileN / 2), barriers, descB,
          ValueRange{col, bRow1}, slot);
}

SmallVector<int64_t> MatmulEmitter::transposedBox() {
  // Grouped: [1 expert][tileK rows][a chunk's columns].
  SmallVector<int64_t> box = {enc.tileK(), sm90a::kMNMajorChunkColumns};
  if (c.grouped)
    box.insert(box.begin(), 1);
  return box;
}

void MatmulEmitter::takeTurn() {
  if (c.pingPong())
    namedBarrierSync(b, e.loc, myTurn, c.consumers());
}

void MatmulEmitter::passTurn() {
  if (c.pingPong())
    namedBarrierArrive(b, e.loc, otherTurn, c.consumers());
}

void MatmulEmitter::release(Value slot) {
  if (c.cluster == 1) {
    mbarrierArrive(b, e.loc, empty, slot);
    return;
  }
  // Both blocks' loads fill this slot in both: each warp's first lane
  // tells both blocks it is done (the warp's wgmma have completed). The
  // arrive orders nothing beyond the block: a release at cluster scope
  // would stall the warp on a fence every stage.
  e.ifThen(e.eq(lane, e.index(0)), [&] {
    mbarrierArrive(b, e.loc, empty, slot);
    mbarrierArriveRemote(b, e.loc, empty, slot,
                         e.toI32(e.xori(rank, e.index(1))));
  });
}

Value MatmulEmitter::kBlockOf(Value kt, int64_t s) {
  return e.minUI(e.iadd(e.imul(kt, enc.subBlocks()), e.index(s)),
                 e.index(c.kBlocks() - 1));
}

void MatmulEmitter::storeStagedScales(Value kt, Value slot, Value p) {
  // Producer thread p stores the scale of tile row p (clamped into the
  // tile's rows) for each sub-block of stage `kt`; for square weight
  // blocks, thread i < 4 also stores the stage's i-th block scale: each
  // half's one or two.
  Value row = e.minUI(e.iadd(rowStartIdx, p), e.isub(rowEndIdx, e.index(1)));
  for (int64_t s = 0; s < enc.subBlocks(); ++s) {
    Value kb = kBlockOf(kt, s);
    // MXFP8's codes as they are; the consumers decode them.
    Value scale = c.columnScales ? e.loadRaw(lhsScale, {row, kb})
                                 : common::loadScale(e, lhsScale, {row, kb});
    memref::StoreOp::create(b, e.loc, scale, stagedScaleTile,
                            ValueRange{slot, e.index(s), p});
    if (c.columnScales)
      continue;
    int64_t slotIdx = 0;
    for (int64_t h = 0; h < 2; ++h) {
      Value blockRow = e.divUI(halfRows[h], 128);
      for (int64_t part = 0; part < c.blockScales(h); ++part) {
        int64_t at = slotIdx++;
        e.ifThen(e.eq(p, e.index(at)), [&] {
          Value r = e.minUI(e.iadd(blockRow, e.index(part)),
                            e.index(c.weightBlockRows() - 1));
          SmallVector<Value> index;
          if (c.grouped)
            index.push_back(expertIdx);
          index.append({r, kb});
          memref::StoreOp::create(
              b, e.loc, common::loadScale(e, rhsScale, index), stagedScaleTile,
              ValueRange{slot, e.index(s), e.index(c.tileM + at)});
        });
      }
    }
  }
}

SmallVector<Value> MatmulEmitter::stagedScales(Value kt, Value slot) {
  // Stage `kt`'s scales as the promotion takes them: per sub-block, both
  // rows' scales, then for square weight blocks each half's one or two.
  int64_t sub = enc.subBlocks(), kBlocks = c.kBlocks();
  SmallVector<Value> values;
  for (int64_t s = 0; s < sub; ++s) {
    for (Value row : tileRows) {
      Value scale = memref::LoadOp::create(b, e.loc, stagedScaleTile,
                                           ValueRange{slot, e.index(s), row});
      if (c.columnScales)
        scale = common::decodeE8M0(e, scale);
      // A sub-block past K (MXFP8, K not a multiple of 128) adds nothing.
      if (kBlocks % sub != 0)
        scale = e.select(e.icmp(arith::CmpIPredicate::uge,
                                e.iadd(e.imul(kt, sub), e.index(s)),
                                e.index(kBlocks)),
                         e.f32(0.0), scale);
      values.push_back(scale);
    }
    if (c.columnScales)
      continue;
    for (int64_t i = 0; i < c.blockScales(0) + c.blockScales(1); ++i)
      values.push_back(memref::LoadOp::create(
          b, e.loc, stagedScaleTile,
          ValueRange{slot, e.index(s), e.index(c.tileM + i)}));
  }
  return values;
}

void MatmulEmitter::storeColumnScales(Value kt, Value slot, Value p) {
  // Producer thread p stores tile columns p and p + 128 of a stage (weight
  // rows clamped into the expert).
  for (int64_t h = 0; h < 2; ++h) {
    Value row = e.minUI(e.iadd(halfRows[h], p), e.index(c.n - 1));
    for (int64_t s = 0; s < enc.subBlocks(); ++s) {
      SmallVector<Value> index;
      if (c.grouped)
        index.push_back(expertIdx);
      index.append({row, kBlockOf(kt, s)});
      memref::StoreOp::create(
          b, e.loc, common::loadScale(e, rhsScale, index), columnScaleTile,
          ValueRange{slot, e.index(s), e.iadd(p, e.index(h * 128))});
    }
  }
}

void MatmulEmitter::emitProducer() {
  Value producerLead = e.eq(tid, e.index(c.consumers()));
  // The producer threads taking part: the lead alone, or all of them when
  // they also stage scales (FP8).
  Value producing =
      enc.fp8() ? arith::ConstantIntOp::create(b, e.loc, 1, 1).getResult()
                : producerLead;
  e.ifThen(producing, [&] {
    e.forEach(e.index(0), kCount, [&](Value j) {
      Value kt = e.iadd(kBegin, j);
      Value stage = e.iadd(ringBase, j);
      Value slot = ring->slot(stage);
      ring->waitReleased(empty, stage, slot);
      e.ifThen(producerLead, [&] { issue(kt, slot); });
      if (enc.fp8()) {
        Value p = e.isub(tid, e.index(c.consumers()));
        storeStagedScales(kt, slot, p);
        if (c.columnScales)
          storeColumnScales(kt, slot, p);
        mbarrierArrive(b, e.loc, barriers, slot);
      }
    });
  });
}

void MatmulEmitter::emitConsumer() {
  SmallVector<Value> finals = emitMainLoop();
  if (c.splits > 1)
    emitSplitSum(finals, k.func.getArgument(splitCounters));
  if (c.outBlock)
    emitQuantizedStore(finals);
  else if (c.activationGrad)
    emitActivationGradStore(finals);
  else if (c.sharedEpilogue)
    emitSharedStore(finals);
  else
    emitStore(finals);
}

Value MatmulEmitter::multiply(Value acc, int64_t h, int64_t first, int64_t last,
                              bool accumulate) {
  // wgmma over instructions [first, last) of the slice into `acc` for
  // columns of half `h` (all 256 for bf16).
  // A descriptor holds the address / 16 in its low word, in a field no
  // offset within the ring carries out of: step the low words (32-bit
  // adds) rather than the addresses.
  // MN-major weights step 16 rows of 128 bytes a k16, their chunks
  // transposedChunkBytes() apart.
  int64_t bStep = c.transposed ? enc.instK() * kSliceBytes : 32;
  Value bAddress = LLVM::AddOp::create(
      b, e.loc, bBase, k.constI64(h * c.halfBytes() + first * bStep));
  Value bDesc0 = c.transposed ? swizzledDescriptor(b, e.loc, bAddress,
                                                   transposedChunkBytes(), 1024)
                              : w->descriptor(bAddress);
  Value aDesc0 = w->descriptor(
      LLVM::AddOp::create(b, e.loc, aBase, k.constI64(first * 32)));
  for (int64_t kk = first; kk < last; ++kk) {
    acc = w->mma(acc, w->stepped(aDesc0, (kk - first) * 32 / 16),
                 w->stepped(bDesc0, (kk - first) * bStep / 16),
                 accumulate || kk != first, c.transposed);
  }
  return acc;
}

SmallVector<Value> MatmulEmitter::emitMainLoop() {
  Value zero = w->zero();
  SmallVector<Value> init(enc.halves(), zero);
  // This thread's warpgroup computes rows [64 g, 64 g + 64) of the tile.
  groupOffset = arith::IndexCastOp::create(
      b, e.loc, b.getI64Type(), e.imul(group, c.groupRows() * kSliceBytes));
  auto loop =
      scf::ForOp::create(b, e.loc, e.index(0), kCount, e.index(1), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value j = loop.getInductionVar();
    Value stage = e.iadd(ringBase, j);
    Value slot = ring->slot(stage);
    SmallVector<Value> accs(loop.getRegionIterArgs());
    waitBarrier(e, barriers, ring->parity(stage, /*released=*/false), slot);
    // The stage's operands where they landed (a converted stage's are its
    // bf16 stage's, which emitConvertedStage sets).
    if (!enc.convert) {
      aBase =
          LLVM::AddOp::create(b, e.loc, ring->address(slot, 0), groupOffset);
      bBase = ring->address(slot, c.tileM * kSliceBytes);
    }
    if (enc.convert) {
      accs[0] = emitConvertedStage(accs[0], stage, slot);
    } else if (!enc.fp8()) {
      NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
      accs[0] = multiply(accs[0], 0, 0, enc.tileK() / enc.instK(),
                         /*accumulate=*/true);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
      // The previous slice's wgmma are done: its slot can be refilled.
      NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 1);
      e.ifThen(e.icmp(arith::CmpIPredicate::uge, j, e.index(1)),
               [&] { release(ringSlot(e.isub(j, e.index(1)))); });
    } else {
      // The stage's scales, staged with its operands.
      SmallVector<Value> scales = stagedScales(e.iadd(kBegin, j), slot);
      emitScaledStage(accs, scales, slot);
      release(slot);
    }
    scf::YieldOp::create(b, e.loc, accs);
  }
  if (enc.convert) {
    // The tile's sums are in the registers.
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
  } else if (!enc.fp8()) {
    // The last slice's slot too, for the next tile's loads.
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
    e.ifThen(e.icmp(arith::CmpIPredicate::uge, kCount, e.index(1)),
             [&] { release(ringSlot(e.isub(kCount, e.index(1)))); });
  }

  SmallVector<Value> finals;
  for (int64_t h = 0; h < enc.halves(); ++h)
    finals.push_back(loop.getResult(h));
  return finals;
}

Value MatmulEmitter::emitConvertedStage(Value acc, Value stage, Value slot) {
  // The stage's codes into bf16 stage `stage` mod convertBuffers, whose
  // last wgmma both warpgroups had waited for at the end of the last
  // stage; the code slot is then free.
  Value buffer = e.remUI(stage, c.convertBuffers());
  emitConvert(slot, buffer);
  release(slot);
  // The bf16 stage, written by both warpgroups through the generic proxy,
  // is read by wgmma through the async one.
  inlinePtx(b, e.loc, {}, {}, "fence.proxy.async.shared::cta;", "");
  consumersBarrier();
  // The operands are the bf16 stage's, not the code slot's.
  Value base = shared->address(
      e.iadd(e.index(c.convertOffset()), e.imul(buffer, c.convertBytes())));
  aBase = LLVM::AddOp::create(b, e.loc, base, groupOffset);
  bBase =
      LLVM::AddOp::create(b, e.loc, base, k.constI64(c.tileM * kSliceBytes));
  NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
  acc = multiply(acc, 0, 0, enc.tileK() / enc.instK(), /*accumulate=*/true);
  NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
  // The wgmma of the stage convertBuffers - 1 back are done in both
  // warpgroups: its bf16 stage may be refilled while the later ones run.
  NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, c.convertBuffers() - 1);
  consumersBarrier();
  return acc;
}

void MatmulEmitter::emitConvert(Value slot, Value buffer) {
  // The consumers' threads take the stage's rows (A's, then B's) in
  // 16-byte pieces of codes, piece q being row q / 4's piece q % 4: the
  // codes of half a scale block. TMA wrote the 64-byte rows with the
  // 64-byte swizzle, which moves a 16-byte piece by its address: bits 4-5
  // xor bits 7-8. A piece becomes two 16-byte pieces of its row in the
  // bf16 stage, K-major rows of 128 bytes, swizzled for wgmma the same
  // way (by the row mod 8).
  Type i32 = b.getI32Type();
  auto quad = VectorType::get({4}, i32);
  auto pairType = VectorType::get({2}, b.getBF16Type());
  Value codes =
      ring->view(sharedType({c.stageBytes() / 4}, i32), slot, e.index(0));
  Value bufferWords = e.imul(buffer, c.convertBytes() / 4);
  int64_t rowPieces = c.rowBytes() / 16;
  // Piece i of a thread is `step` rows below its first: the same piece of
  // a row with the same swizzle, at a constant offset.
  int64_t step = c.consumers() / rowPieces;
  Value row0 = e.divUI(tid, rowPieces), piece = e.remUI(tid, rowPieces);
  Value at = e.iadd(e.imul(row0, c.rowBytes()), e.imul(piece, 16));
  Value codeWord0 =
      e.divUI(e.xori(at, e.andi(e.divUI(at, 8), e.index(0x30))), 4);
  Value outWord0[2];
  for (int64_t h = 0; h < 2; ++h)
    outWord0[h] = e.iadd(
        e.iadd(bufferWords, e.imul(row0, kSliceBytes / 4)),
        e.imul(e.xori(e.iadd(e.imul(piece, 2), e.index(h)), e.remUI(row0, 8)),
               4));
  Value sub = e.divUI(piece, enc.scaleK / 16);
  // The scales of the thread's pieces (their row's for A, their weight
  // row's for B), and whether each has a one-multiply factor.
  int64_t pieces = (c.tileM + c.tileN) / step;
  SmallVector<Value> scales;
  Value small;
  for (int64_t i = 0; i < pieces; ++i) {
    Value row = e.iadd(row0, e.index(i * step));
    bool isA = (i + 1) * step <= c.tileM;
    scales.push_back(
        isA ? common::decodeE8M0(
                  e, memref::LoadOp::create(b, e.loc, stagedScaleTile,
                                            ValueRange{slot, sub, row}))
            : memref::LoadOp::create(
                  b, e.loc, columnScaleTile,
                  ValueRange{slot, sub, e.isub(row, e.index(c.tileM))})
                  .getResult());
    Value fits = arith::CmpFOp::create(b, e.loc, arith::CmpFPredicate::OLE,
                                       scales.back(), e.f32(128.0));
    small = small ? arith::AndIOp::create(b, e.loc, small, fits) : fits;
  }
  // A power of two in f32 as a bf16 pair: its high half.
  auto pairOf = [&](Value f32) {
    Value high = arith::ShRUIOp::create(
        b, e.loc, arith::BitcastOp::create(b, e.loc, i32, f32), e.i32(16));
    Value bf16 = arith::BitcastOp::create(
        b, e.loc, b.getBF16Type(),
        arith::TruncIOp::create(b, e.loc, b.getI16Type(), high));
    return vector::BroadcastOp::create(b, e.loc, pairType, bf16).getResult();
  };
  // code x 2^-120 x 2^(120 + s) in one multiply where 2^(120 + s) is a
  // bf16 (s <= 7: every scale of data below 2^15); else in two. One branch
  // for all the thread's pieces, so that their conversions interleave.
  Value unbias = e.f32(std::ldexp(1.0, 120));
  auto scaled = scf::IfOp::create(b, e.loc, small, /*withElse=*/true);
  for (bool one : {true, false}) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(one ? &scaled.getThenRegion().front()
                                   : &scaled.getElseRegion().front());
    Value first = one ? Value() : pairOf(unbias);
    for (int64_t i = 0; i < pieces; ++i) {
      Value words = vector::LoadOp::create(
          b, e.loc, quad, codes,
          ValueRange{e.iadd(codeWord0, e.index(i * step * c.rowBytes() / 4))});
      Value factor = pairOf(one ? e.mul(scales[i], unbias) : scales[i]);
      SmallVector<Value> pairs;
      for (int64_t w = 0; w < 4; ++w) {
        for (Value pair : e4m3ToBF16Pairs(
                 e, vector::ExtractOp::create(b, e.loc, words, w))) {
          Value product = e.mul(one ? pair : e.mul(pair, first), factor);
          pairs.push_back(vector::ExtractOp::create(
              b, e.loc,
              vector::BitCastOp::create(b, e.loc, VectorType::get({1}, i32),
                                        product),
              0));
        }
      }
      for (int64_t h = 0; h < 2; ++h) {
        Value out = vector::FromElementsOp::create(
            b, e.loc, quad, ArrayRef<Value>(pairs).slice(4 * h, 4));
        vector::StoreOp::create(
            b, e.loc, out, convertWords,
            ValueRange{
                e.iadd(outWord0[h], e.index(i * step * kSliceBytes / 4))});
      }
    }
  }
}

void MatmulEmitter::emitScaledStage(SmallVector<Value> &accs, ValueRange scales,
                                    Value stage) {
  int64_t sub = enc.subBlocks();
  int64_t perBlock = enc.tileK() / enc.instK() / sub;
  // Each scale block into a fresh partial, then scaled into the
  // accumulator: acc += partial * (row scale * column scale).
  for (int64_t s = 0; s < sub; ++s) {
    int64_t perSub = scales.size() / sub;
    ValueRange blockScales = scales.slice(s * perSub, perSub);
    for (int64_t h = 0; h < enc.halves(); ++h) {
      // The warpgroups take turns to issue, so the tensor cores run one's
      // wgmma while the other promotes (issued together, they finish
      // together and promote together, the tensor cores idle).
      takeTurn();
      NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
      // The first wgmma ignores its input: no registers for it.
      Value partial =
          multiply(LLVM::PoisonOp::create(b, e.loc, w->fragment), h,
                   s * perBlock, (s + 1) * perBlock, /*accumulate=*/false);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
      passTurn();
      NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
      partial = w->fence(partial);
      Value acc = accs[h];
      // Square blocks: this half's first (and second) block scale.
      int64_t first = 2 + (h == 1 ? c.blockScales(0) : 0);
      for (int64_t i = 0; i < enc.fragment(); ++i) {
        Value rowScale = blockScales[(i / 2) % 2];
        Value columnScale;
        if (c.columnScales) {
          Value col = e.iadd(fragmentColumn(i), e.index(h * 128));
          columnScale = memref::LoadOp::create(
              b, e.loc, columnScaleTile, ValueRange{stage, e.index(s), col});
        } else if (c.scaleSplit[h] == 128) {
          columnScale = blockScales[first];
        } else {
          Value inFirst = e.ult(fragmentColumn(i), e.index(c.scaleSplit[h]));
          columnScale =
              e.select(inFirst, blockScales[first], blockScales[first + 1]);
        }
        Value p = LLVM::ExtractValueOp::create(b, e.loc, partial,
                                               ArrayRef<int64_t>{i});
        Value a =
            LLVM::ExtractValueOp::create(b, e.loc, acc, ArrayRef<int64_t>{i});
        // One multiply-add (one rounding where the CPU backend has two):
        // the promotion's instructions bound the kernel, not the tensor
        // cores.
        Value scale = e.mul(rowScale, columnScale);
        Value sum = math::FmaOp::create(b, e.loc, p, scale, a).getResult();
        acc = LLVM::InsertValueOp::create(b, e.loc, acc, sum,
                                          ArrayRef<int64_t>{i});
      }
      accs[h] = w->fence(acc);
    }
  }
}

Value MatmulEmitter::weightRow(int64_t h, int64_t i) {
  // The weight row (output column before the activation) of fragment
  // element i of half h.
  int64_t col = h * enc.instN + (i / 4) * 8 + i % 2;
  Value inHalf = e.iadd(colBase, e.index(col % 128));
  return e.iadd(col < 128 ? halfRows[0] : halfRows[1], inHalf);
}

void MatmulEmitter::emitSplitSum(SmallVector<Value> &finals, Value counters) {
  // Every split stores its partial; the tile's last block to count
  // itself in adds them in split order, the same sum whichever is last.
  for (int64_t h = 0; h < enc.halves(); ++h)
    for (int64_t i = 0; i < enc.fragment(); ++i) {
      Value row = e.iadd(rowBase, e.index(((i / 2) % 2) * 8));
      Value wr = weightRow(h, i);
      e.ifThen(e.andi(e.ult(row, rowEndIdx), e.ult(wr, e.index(c.n))), [&] {
        memref::StoreOp::create(b, e.loc,
                                LLVM::ExtractValueOp::create(
                                    b, e.loc, finals[h], ArrayRef<int64_t>{i}),
                                partialView,
                                splitPartialAt(k, lhs.rows, splitIdx, row, wr));
      });
    }
  enterLastSplit(k, tid, counters, tileU, c.splits,
                 [&] { consumersBarrier(); });
  // Only a thread's rows that hold data are summed (a decode tile has a
  // row or two of its 128).
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    auto summed = scf::IfOp::create(b, e.loc, TypeRange(ValueRange(finals)),
                                    e.ult(row, rowEndIdx), true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(&summed.getElseRegion().front());
      scf::YieldOp::create(b, e.loc, finals);
      b.setInsertionPointToStart(&summed.getThenRegion().front());
      SmallVector<std::pair<int64_t, int64_t>> elements;
      SmallVector<Value> mine;
      SmallVector<std::pair<Value, Value>> at;
      for (int64_t h = 0; h < enc.halves(); ++h)
        for (int64_t i = 0; i < enc.fragment(); ++i) {
          if ((i / 2) % 2 != rowHalf)
            continue;
          elements.push_back({h, i});
          at.push_back({row, e.minUI(weightRow(h, i), e.index(c.n - 1))});
          mine.push_back(LLVM::ExtractValueOp::create(b, e.loc, finals[h],
                                                      ArrayRef<int64_t>{i}));
        }
      SmallVector<Value> totals =
          sumSplits(k, partialView, lhs.rows, c.splits, splitIdx, mine, at);
      SmallVector<Value> sums(finals);
      for (auto [n, hi] : llvm::enumerate(elements))
        sums[hi.first] = LLVM::InsertValueOp::create(
            b, e.loc, sums[hi.first], totals[n], ArrayRef<int64_t>{hi.second});
      scf::YieldOp::create(b, e.loc, sums);
    }
    finals.assign(summed.getResults().begin(), summed.getResults().end());
  }
}

Value MatmulEmitter::column(ArrayRef<Value> finals, int64_t i) {
  // Element i of the m64n256 tile is element i % fragment of half
  // i / fragment.
  return LLVM::ExtractValueOp::create(b, e.loc, finals[i / enc.fragment()],
                                      ArrayRef<int64_t>{i % enc.fragment()})
      .getResult();
}

Value MatmulEmitter::addBias(Value v, Value col) {
  if (!bias)
    return v;
  // Out-of-range columns are masked at the store; clamp the read.
  Value safe = e.minUI(col, e.index(c.n - 1));
  return e.add(v, c.grouped ? e.load(bias, {expertIdx, safe})
                            : e.load(bias, {safe}));
}

Value MatmulEmitter::output(ArrayRef<Value> finals, int64_t i, Value col) {
  // Output column `col` of the tile and its value (bias and activation
  // applied). With an activation, gate column c is element i and its up
  // column c + tileN / 2 is element i + fragment / 2.
  Value v = addBias(column(finals, i), col);
  if (c.gated) {
    Value up = addBias(column(finals, i + c.fragment() / 2),
                       e.iadd(col, e.index(c.n / 2)));
    v = common::activate(e, op.getActivationAttr(), v, up);
  }
  return v;
}

void MatmulEmitter::emitStore(ArrayRef<Value> finals) {
  int64_t perThread = c.gated ? c.fragment() / 2 : c.fragment();
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    e.ifThen(e.ult(row, rowEndIdx), [&] {
      for (int64_t i = 0; i < perThread; ++i) {
        if ((i / 2) % 2 != rowHalf)
          continue;
        Value col = e.iadd(colTile, fragmentColumn(i));
        Value v = output(finals, i, col);
        e.ifThen(e.ult(col, e.index(c.outN)), [&] {
          e.store(v, out, {row, col});
        });
      }
    });
  }
}

void MatmulEmitter::emitActivationGradStore(ArrayRef<Value> finals) {
  // Each consumer warpgroup takes 64 columns of its 64 rows at a time: its
  // threads load those columns of h's gate and up halves, whole 16-byte
  // pieces of rows, into the two planes of its buffer (pieces swizzled by
  // the row, as the shared store's); each thread turns its fragment's
  // elements into their gradients there; the pieces go back out (over h,
  // in place). <g, a> is summed over the 64 columns: in a thread, then
  // over the four lanes that share a row.
  constexpr int64_t kColumns = MatmulConfig::kEpilogueColumns;
  static_assert(kColumns == GroupedMatmulOp::kRowDotColumns,
                "a chunk's row sums are one row_dots entry");
  Type bf16 = b.getBF16Type();
  Value buffer = epilogueBuffer();
  auto pairType = VectorType::get({2}, bf16);
  auto pieceType = VectorType::get({8}, bf16);
  ActivationAttr activation = op.getActivationAttr();
  Value fragmentRow = e.iadd(e.imul(warp, 16), e.divUI(lane, 4));
  Value swizzle = e.divUI(lane, 4);
  Value inGroup = e.remUI(tid, 128);
  Value groupRow0 = e.iadd(rowStartIdx, e.imul(group, c.groupRows()));
  Value lastRow = e.isub(rowEndIdx, e.index(1));
  Value firstChunk = e.divUI(colTile, e.index(kColumns));
  int64_t dotChunks = llvm::divideCeil(c.n, kColumns);
  Value rowLeader = e.eq(e.remUI(lane, 4), e.index(0));
  // This thread's two rows: in range, and their weights.
  Value inRows[2], w[2];
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    inRows[rowHalf] = e.ult(row, rowEndIdx);
    w[rowHalf] = rowWeights ? e.loadColumn(rowWeights, e.minUI(row, lastRow))
                            : e.f32(1.0);
  }
  // The buffer's pieces, 8 a thread: plane, row, piece of 8 columns, and
  // where the piece lies in h (and `out`); loads stay in bounds.
  auto forPieces =
      [&](int64_t chunk,
          function_ref<void(Value, Value, Value, Value, Value, Value)> body) {
        int64_t perPlane = c.groupRows() * kColumns / 8;
        for (int64_t j = 0; j < 2 * perPlane / 128; ++j) {
          Value idx = e.iadd(inGroup, e.index(j * 128));
          Value plane = e.divUI(idx, perPlane);
          Value row = e.divUI(e.remUI(idx, perPlane), 8);
          Value piece = e.remUI(idx, 8);
          Value hRow = e.iadd(groupRow0, row);
          Value col = e.iadd(
              colTile, e.iadd(e.index(chunk * kColumns), e.imul(piece, 8)));
          Value valid =
              e.andi(e.ult(hRow, rowEndIdx), e.ult(col, e.index(c.n)));
          Value hCol = e.iadd(e.minUI(col, e.index(c.n - 8)),
                              e.imul(plane, e.index(c.n)));
          body(plane, row, e.imul(e.xori(piece, e.remUI(row, 8)), 8),
               e.minUI(hRow, lastRow), hCol, valid);
        }
      };
  for (int64_t chunk = 0; chunk < c.tileN / kColumns; ++chunk) {
    // The last chunk's (or tile's) pieces are out.
    epilogueBarrier();
    forPieces(chunk, [&](Value plane, Value row, Value at, Value hRow,
                         Value hCol, Value valid) {
      Value v = vector::LoadOp::create(b, e.loc, pieceType, activationInput,
                                       ValueRange{hRow, hCol}, false,
                                       vectorAlign(8, bf16));
      v = e.select(valid, v,
                   arith::ConstantOp::create(b, e.loc, pieceType,
                                             b.getZeroAttr(pieceType)));
      vector::StoreOp::create(b, e.loc, v, buffer, ValueRange{plane, row, at},
                              false, vectorAlign(8, bf16));
    });
    epilogueBarrier();
    for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
      Value row = e.iadd(fragmentRow, e.index(rowHalf * 8));
      Value sum = e.f32(0.0);
      for (int64_t i = chunk * 32; i < chunk * 32 + 32; i += 2) {
        if ((i / 2) % 2 != rowHalf)
          continue;
        Value at = e.iadd(e.imul(e.xori(e.index((i % 32) / 4), swizzle), 8),
                          e.imul(e.remUI(lane, 4), 2));
        SmallVector<Value, 3> gateAt = {e.index(0), row, at},
                              upAt = {e.index(1), row, at};
        Value gates = vector::LoadOp::create(b, e.loc, pairType, buffer, gateAt,
                                             false, vectorAlign(2, bf16));
        Value ups = vector::LoadOp::create(b, e.loc, pairType, buffer, upAt,
                                           false, vectorAlign(2, bf16));
        SmallVector<Value> dGates, dUps;
        for (int64_t q = 0; q < 2; ++q) {
          auto element = [&](Value pair) -> Value {
            return arith::ExtFOp::create(
                b, e.loc, b.getF32Type(),
                vector::ExtractOp::create(b, e.loc, pair, q).getResult());
          };
          Value gate = element(gates), up = element(ups);
          Value g = column(finals, i + q);
          auto [dGate, dUp] = common::activationGrad(e, activation, gate, up);
          Value wg = e.mul(w[rowHalf], g);
          dGates.push_back(
              arith::TruncFOp::create(b, e.loc, bf16, e.mul(wg, dGate)));
          dUps.push_back(
              arith::TruncFOp::create(b, e.loc, bf16, e.mul(wg, dUp)));
          if (!rowDots)
            continue;
          // a as the forward rounded it for the down matmul; columns past
          // N hold zeros, whose a is 0.
          Value a = arith::ExtFOp::create(
              b, e.loc, b.getF32Type(),
              arith::TruncFOp::create(b, e.loc, bf16,
                                      common::activate(e, activation, gate, up))
                  .getResult());
          sum = e.add(sum, e.mul(g, a));
        }
        vector::StoreOp::create(
            b, e.loc,
            vector::FromElementsOp::create(b, e.loc, pairType, dGates), buffer,
            gateAt, false, vectorAlign(2, bf16));
        vector::StoreOp::create(
            b, e.loc, vector::FromElementsOp::create(b, e.loc, pairType, dUps),
            buffer, upAt, false, vectorAlign(2, bf16));
      }
      if (!rowDots)
        continue;
      for (int64_t offset : {1, 2})
        sum = e.add(sum, gpu::ShuffleOp::create(b, e.loc, sum, offset, 32,
                                                gpu::ShuffleMode::XOR)
                             .getShuffleResult());
      Value p = e.iadd(firstChunk, e.index(chunk));
      Value outRow = e.iadd(rowBase, e.index(rowHalf * 8));
      if (rowTerm)
        sum = e.select(
            e.eq(p, e.index(0)),
            e.add(sum, e.load(rowTerm, {e.minUI(outRow, lastRow), e.index(0)})),
            sum);
      e.ifThen(e.andi(e.andi(inRows[rowHalf], rowLeader),
                      e.ult(p, e.index(dotChunks))),
               [&] {
                 e.store(sum, rowDots, {outRow, p});
               });
    }
    epilogueBarrier();
    forPieces(chunk, [&](Value plane, Value row, Value at, Value hRow,
                         Value hCol, Value valid) {
      Value v = vector::LoadOp::create(b, e.loc, pieceType, buffer,
                                       ValueRange{plane, row, at}, false,
                                       vectorAlign(8, bf16));
      e.ifThen(valid, [&] {
        vector::StoreOp::create(b, e.loc, v, out, ValueRange{hRow, hCol}, false,
                                vectorAlign(8, bf16));
      });
    });
  }
}

Value MatmulEmitter::epilogueBuffer() {
  SmallVector<int64_t> shape = {c.groupRows(), MatmulConfig::kEpilogueColumns};
  if (c.epiloguePlanes > 1)
    shape.insert(shape.begin(), c.epiloguePlanes);
  Value buffer = memref::ViewOp::create(
      b, e.loc, sharedType(shape, b.getBF16Type()), shared->bytes,
      e.iadd(e.iadd(shared->pad, e.index(c.epilogueOffset())),
             e.imul(group, c.epilogueBytes())),
      ValueRange{});
  epilogueBarrierId = e.toI32(e.iadd(group, e.index(kEpilogueBarrier)));
  return buffer;
}

void MatmulEmitter::consumersBarrier() {
  inlinePtx(b, e.loc, {}, {}, "bar.sync 1, 256;", "");
}

void MatmulEmitter::epilogueBarrier() {
  inlinePtx(b, e.loc, {}, {epilogueBarrierId}, "bar.sync $0, 128;", "r");
}

void MatmulEmitter::emitSharedStore(ArrayRef<Value> finals) {
  // Each consumer warpgroup stages 64 columns of its 64 rows at a time in
  // its own buffer (16-byte pieces of a row swizzled by the row, so both
  // the fragment's writes and the row reads are free of bank conflicts),
  // then its threads store whole 16-byte pieces of rows.
  constexpr int64_t kColumns = MatmulConfig::kEpilogueColumns;
  Value buffer = epilogueBuffer();
  auto pairType = VectorType::get({2}, b.getBF16Type());
  auto pieceType = VectorType::get({8}, b.getBF16Type());
  // The rows this thread's fragment holds, within the warpgroup's 64; a
  // row's swizzle is its index mod 8, lane / 4 for both.
  Value fragmentRow = e.iadd(e.imul(warp, 16), e.divUI(lane, 4));
  Value swizzle = e.divUI(lane, 4);
  Value inGroup = e.remUI(tid, 128);
  int64_t perThread = c.gated ? c.fragment() / 2 : c.fragment();
  for (int64_t chunk = 0; chunk < c.outTile / kColumns; ++chunk) {
    // The last chunk's (or tile's) reads are done.
    epilogueBarrier();
    for (int64_t i = chunk * 32; i < std::min(perThread, chunk * 32 + 32);
         i += 2) {
      Value col = e.iadd(colTile, fragmentColumn(i));
      Value pair = vector::FromElementsOp::create(
          b, e.loc, pairType,
          ValueRange{arith::TruncFOp::create(b, e.loc, b.getBF16Type(),
                                             output(finals, i, col)),
                     arith::TruncFOp::create(
                         b, e.loc, b.getBF16Type(),
                         output(finals, i + 1, e.iadd(col, e.index(1))))});
      Value row = e.iadd(fragmentRow, e.index(((i / 2) % 2) * 8));
      Value piece = e.xori(e.index((i % 32) / 4), swizzle);
      Value at = e.iadd(e.imul(piece, 8), e.imul(e.remUI(lane, 4), 2));
      vector::StoreOp::create(b, e.loc, pair, buffer, ValueRange{row, at},
                              false, vectorAlign(2, b.getBF16Type()));
    }
    epilogueBarrier();
    // 64 rows x 8 pieces; a warp stores 4 rows of 128 bytes at a time.
    for (int64_t j = 0; j < c.groupRows() * 8 / 128; ++j) {
      Value idx = e.iadd(inGroup, e.index(j * 128));
      Value row = e.divUI(idx, 8), piece = e.remUI(idx, 8);
      Value v = vector::LoadOp::create(
          b, e.loc, pieceType, buffer,
          ValueRange{row, e.imul(e.xori(piece, e.remUI(row, 8)), 8)}, false,
          vectorAlign(8, b.getBF16Type()));
      Value outRow =
          e.iadd(e.iadd(rowStartIdx, e.imul(group, c.groupRows())), row);
      Value outCol =
          e.iadd(colTile, e.iadd(e.index(chunk * kColumns), e.imul(piece, 8)));
      e.ifThen(e.andi(e.ult(outRow, rowEndIdx), e.ult(outCol, e.index(c.outN))),
               [&] {
                 vector::StoreOp::create(b, e.loc, v, out,
                                         ValueRange{outRow, outCol}, false,
                                         vectorAlign(8, b.getBF16Type()));
               });
    }
  }
}

void MatmulEmitter::emitQuantizedStore(ArrayRef<Value> finals) {
  // A row's block of `bs` columns is held by the four lanes that share the
  // row, elements i with i/4 in the block's range of 8-column groups. Each
  // value is rounded to bf16 first, as the unfused matmul stores it; the
  // lanes combine their statistics by shuffles, which every lane runs
  // (rows past the segment are computed, not stored).
  QuantAttr outQuant = op.getOutQuantAttr();
  int64_t bs = c.outBlock;
  int64_t perThread = c.gated ? c.fragment() / 2 : c.fragment();
  assert(c.outTile % bs == 0 && "the tile holds whole quantization blocks");
  Type bf16 = b.getBF16Type();
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    Value rowValid = e.ult(row, rowEndIdx);
    for (int64_t block = 0; block < c.outTile / bs; ++block) {
      SmallVector<std::pair<Value, Value>> values; // (column, value)
      Value amax = e.f32(0.0), special = e.f32(0.0);
      for (int64_t i = 0; i < perThread; ++i) {
        if ((i / 2) % 2 != rowHalf || (i / 4) * 8 / bs != block)
          continue;
        Value col = e.iadd(colTile, fragmentColumn(i));
        Value v = arith::ExtFOp::create(
            b, e.loc, b.getF32Type(),
            arith::TruncFOp::create(b, e.loc, bf16, output(finals, i, col))
                .getResult());
        // Columns past N are no part of any block.
        v = e.select(e.ult(col, e.index(c.outN)), v, e.f32(0.0));
        Value isSpecial;
        Value magnitude = common::blockStats(e, v, isSpecial);
        amax = arith::MaxNumFOp::create(b, e.loc, amax, magnitude);
        special = arith::MaximumFOp::create(b, e.loc, special, isSpecial);
        values.push_back({col, v});
      }
      reduceBlockStats(e, amax, special, 4);
      common::BlockScale scale = common::blockScale(e, outQuant, amax, special);
      Value first = e.iadd(colTile, e.index(block * bs));
      e.ifThen(rowValid, [&] {
        for (auto [col, v] : values) {
          Value code = scale.encode(e, v);
          e.ifThen(e.ult(col, e.index(c.outN)), [&] {
            e.storeRaw(code, out, {row, col});
          });
        }
        e.ifThen(
            e.andi(e.eq(e.remUI(lane, 4), e.index(0)),
                   e.ult(first, e.index(c.outN))),
            [&] {
              e.storeRaw(scale.stored, outScale, {row, e.divUI(first, bs)});
            });
      });
    }
  }
}

LogicalResult MatmulEmitter::emit(ArrayRef<Value> buffers,
                                  ArrayRef<unsigned> indices,
                                  const TensorInfo &partials) {
  emitViews(buffers, indices, partials);
  splitCounters = indices.size() - 1;
  tid = k.threadId();
  if (c.cluster > 1)
    rank = e.remUI(k.blockId(gpu::Dimension::x), c.cluster);
  emitSharedMemory();
  // A cluster's blocks arrive on each other's barriers and load into each
  // other's ring: all must be initialized first, and none may exit while
  // another can still reach it.
  auto clusterBarrier = [&] {
    NVVM::ClusterArriveOp::create(b, e.loc, UnitAttr());
    NVVM::ClusterWaitOp::create(b, e.loc, UnitAttr());
  };
  if (c.cluster > 1)
    clusterBarrier();
  else
    gpu::BarrierOp::create(b, e.loc);

  // Warp specialization: the producer warpgroup gives up registers and one
  // of its threads keeps the ring full, waiting only for a slot to be
  // released; the consumers take the registers and never wait on each
  // other, so one's promotion or epilogue overlaps the other's wgmma.
  // Both walk the same tiles.
  auto roles = scf::IfOp::create(b, e.loc, e.ult(tid, e.index(c.consumers())),
                                 /*withElse=*/true);
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  producerRegisters(e, c.producerRegisters);
  e.ifThen(e.eq(tid, e.index(c.consumers())), [&] {
    nvgpu::TmaPrefetchOp::create(b, e.loc, descA, Value());
    nvgpu::TmaPrefetchOp::create(b, e.loc, descB, Value());
  });
  emitTiles(/*consumer=*/false);
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  consumerRegisters(e, c.consumerRegisters);
  w.emplace(k, enc);
  // Warpgroup 0 takes the first turn, and at the end takes the turn
  // warpgroup 1 passed it last, so every arrival is waited for.
  Value first = e.eq(e.divUI(tid, 128), e.index(0));
  myTurn = e.toI32(e.iadd(e.divUI(tid, 128), e.index(kTurnBarrier)));
  otherTurn = arith::XOrIOp::create(b, e.loc, myTurn, e.i32(1));
  if (c.pingPong())
    e.ifThen(arith::XOrIOp::create(
                 b, e.loc, first, arith::ConstantIntOp::create(b, e.loc, 1, 1)),
             [&] { passTurn(); });
  emitTiles(/*consumer=*/true);
  if (c.pingPong())
    e.ifThen(first, [&] { takeTurn(); });
  b.setInsertionPointAfter(roles);
  if (c.cluster > 1)
    clusterBarrier();
  return k.finish(op);
}

LogicalResult nvidia::buildGroupedMatmul(LayerKernels &layer,
                                         GroupedMatmulOp op) {
  int64_t kDim = op.getK();
  int64_t elementBytes = op.getScheme() ? 1 : 2;
  // TMA reads rows whose length in bytes is a multiple of 16.
  if ((kDim * elementBytes) % 16 != 0)
    return op.emitOpError()
           << "has K = " << kDim << " (" << describeK(op)
           << "): sm_90a loads the operands with TMA, whose rows must be a "
              "multiple of 16 bytes, so K must be a multiple of "
           << 16 / elementBytes;
  if (op.getTransposeRhs() && op.getN() % 8 != 0)
    return op.emitOpError()
           << "has N = " << op.getN()
           << " with transpose_rhs: sm_90a loads the weights' rows of N "
              "columns with TMA, whose rows must be a multiple of 16 bytes, "
              "so N must be a multiple of 8";
  // A copy: define() may grow the map it lives in.
  FailureOr<TensorInfo> source = layer.tmaSource(op, op.getLhs());
  if (failed(source))
    return failure();
  TensorInfo lhs = *source;
  FailureOr<MatmulConfig> configured =
      configureMatmul(op, lhs.rows, layer.maxTokens);
  if (failed(configured))
    return failure();
  const MatmulConfig &c = *configured;
  const MatmulEncoding &enc = c.enc;
  // In place, the gate/up gradient takes the gate/up output's buffer.
  if (op.getInPlace())
    layer.bind(op.getOut(), layer.info(op.getActivationInput()).buffer,
               layer.info(op.getActivationInput()).rows);
  else
    layer.define(op.getOut(), lhs.rows);
  if (c.outBlock)
    layer.define(op.getOutScale(), lhs.rows);
  if (op.getRowDots())
    layer.define(op.getRowDots(), lhs.rows);

  unsigned mapA = layer.plan.addTensorMap(lhs.buffer, enc.elementBytes,
                                          lhs.rows, kDim, c.tileM, enc.tileK());
  unsigned rhsBuffer = layer.info(op.getRhs()).buffer;
  // Transposed weights as [E][K rows][N columns]: a box past an expert's
  // K rows reads zeros, not the next expert's.
  unsigned mapB =
      !c.transposed ? layer.plan.addTensorMap(rhsBuffer, enc.elementBytes,
                                              {c.experts * c.n, 0}, kDim,
                                              c.weightBoxRows(), enc.tileK())
      : c.grouped
          ? layer.plan.addTensorMap(rhsBuffer, 2, kDim, c.n, c.n, enc.tileK(),
                                    sm90a::kMNMajorChunkColumns,
                                    {c.experts, kDim * c.n, 1})
          : layer.plan.addTensorMap(rhsBuffer, 2, {kDim, 0}, c.n, enc.tileK(),
                                    sm90a::kMNMajorChunkColumns);
  // Split partials [splits, rows, n] f32 and one counter per tile.
  TensorInfo partials{};
  if (c.splits > 1)
    partials =
        TensorInfo{layer.plan.addWorkspace(lhs.rows * (c.splits * c.n * 4)),
                   MemRefType::get({ShapedType::kDynamic, c.n},
                                   Float32Type::get(op.getContext())),
                   lhs.rows * c.splits};
  unsigned counters =
      c.splits > 1 ? layer.plan.addCounters(c.rowTiles * c.colTiles) : 0;

  SmallVector<Value> buffers = {op.getOut()};
  if (c.grouped)
    buffers.append({op.getTokensPerExpert(), op.getExpertOffsets()});
  if (op.getBias())
    buffers.push_back(op.getBias());
  if (enc.fp8())
    buffers.append({op.getLhsScale(), op.getRhsScale()});
  if (c.outBlock)
    buffers.push_back(op.getOutScale());
  for (Value v : {Value(op.getActivationInput()), Value(op.getRowWeights()),
                  Value(op.getRowTerm()), op.getRowDots()})
    if (v)
      buffers.push_back(v);
  SmallVector<unsigned> bufferIndices;
  for (Value v : buffers)
    bufferIndices.push_back(layer.info(v).buffer);
  if (c.splits > 1)
    bufferIndices.append({partials.buffer, counters});
  Kernel k = layer.kernelOn(op, c.grouped ? "grouped_matmul" : "matmul",
                            bufferIndices, {mapA, mapB});
  Launch &launch = k.launch;
  if (c.swapAb) {
    // A decode tile's bucket bounds its row tiles: those on x, column
    // tiles x splits on y; a consumer warpgroup and a producer warp.
    launch.work = {c.rowTiles, 0};
    launch.gridY = c.colTiles * c.splits;
    // Rows that a bucket does not bound (received from other ranks, up to
    // the capacity): two blocks a multiprocessor, each walking row tiles
    // until the experts' rows are done.
    if (c.grouped && lhs.rows.perToken == 0)
      launch.work = {
          std::clamp<int64_t>(llvm::divideCeil(kDecodeBlocks, launch.gridY), 1,
                              std::max<int64_t>(c.rowTiles, 1)),
          0};
    launch.block = sm90a::kDecodeThreads;
    k.func.setKnownBlockSizeAttr(
        k.b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
    k.func->setAttr(NVVM::NVVMDialect::getMaxnregAttrName(),
                    k.b.getI32IntegerAttr(sm90a::kDecodeMaxRegisters));
    launch.sharedBytes = c.sharedBytes();
    // A fragment's tileM / 2 a thread; FP8 keeps each scale block's
    // partials beside the totals. (The fused kernel's pairing limit was
    // measured against this count; sm90a::decodeRegisters adds the scales
    // for the register rule.)
    launch.accumulators =
        c.swapFragments() * c.tileM / 2 * (c.enc.fp8() ? 2 : 1);
    return emitDecodeMatmul(layer, op, c, lhs, k, buffers, bufferIndices,
                            partials);
  }
  // Row tiles (a cluster's rows each) on x (no 65535 limit), column tiles
  // on y. Grouped: at most ceil(rows / cluster rows) + experts row tiles
  // are non-empty.
  launch.work = lhs.rows;
  launch.perBlock = c.clusterRows();
  launch.extraBlocks = c.grouped ? c.experts : 0;
  if (c.rowTiles > 0)
    launch.work = {c.rowTiles, 0}, launch.perBlock = 1, launch.extraBlocks = 0;
  launch.gridY = c.colTiles * c.splits;
  if (c.persistent) {
    // One block per multiprocessor (at most one per tile), each walking
    // the tiles: the same count of blocks along x alone. ceil(rows / M)
    // tiles a column may exceed ceil(rows x columns / M) by up to a tile
    // a column (one token and 16 column tiles: 16 tiles, not 1 block).
    launch.work = launch.work * (c.colTiles * c.splits);
    launch.extraBlocks =
        (launch.extraBlocks + (c.rowTiles > 0 ? 0 : 1)) * c.colTiles * c.splits;
    launch.gridY = 1;
    launch.persistent = true;
  }
  // The consumer warpgroups and a producer warpgroup; the block size is
  // fixed (.reqntid), so ptxas plans registers for 384 threads.
  launch.block = (c.warpGroups + 1) * 128;
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
  if (c.cluster > 1) {
    // The cluster shape is the kernel's own (.reqnctapercluster), so a
    // plain launch forms the clusters.
    launch.cluster = c.cluster;
    k.func.setKnownClusterSizeAttr(
        k.b.getDenseI32ArrayAttr({int32_t(c.cluster), 1, 1}));
  }
  launch.sharedBytes = c.sharedBytes();
  // A consumer warpgroup's rows of the tile over its 128 threads.
  launch.accumulators = c.tileM * c.tileN / (128 * c.warpGroups) *
                        (enc.fp8() && !enc.convert ? 2 : 1);
  return MatmulEmitter(layer, op, c, lhs, k)
      .emit(buffers, bufferIndices, partials);
}
