//===- KernelConfigs.h - what each kernel family decides --------*- C++ -*-===//
//
// What a kernel family decides before it emits anything: tile shapes, ring
// stages, warpgroups, shared-memory layout, split counts, blocks and vector
// widths, as plain data computed from the op and its shapes. The builders
// emit from these, and tests can check them without building a kernel.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_KERNELCONFIGS_H
#define MOE_CODEGEN_NVIDIA_KERNELS_KERNELCONFIGS_H

#include "codegen/nvidia/support/LaunchPlan.h"
#include "codegen/nvidia/support/Sm90a.h"
#include "dialects/moe/MoeOps.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

namespace mlir::moe::nvidia {

/// The operands' encoding of a grouped matmul and the wgmma that multiplies
/// them: bf16, or E4M3 codes with a scale per block of `scaleK` along K.
/// MXFP8 codes may also be converted to bf16 in shared memory (`convert`),
/// exactly, and multiplied as bf16 with no per-block promotion.
struct MatmulEncoding {
  /// A tile is 128 bytes of K per stage (64 bytes of codes when they are
  /// converted: 128 bytes of bf16).
  static constexpr int64_t kSliceBytes = sm90a::MatmulLayout::kSliceBytes;

  /// `tileK` is the configuration's (0 for a decode tile): 64 MXFP8 codes
  /// a stage convert them.
  MatmulEncoding(QuantAttr scheme, int64_t tileN, int64_t tileK = 0);
  bool fp8() const { return static_cast<bool>(scheme); }
  int64_t tileK() const { return kSliceBytes / (convert ? 2 : elementBytes); }
  int64_t instK() const { return sm90a::wgmmaK(convert ? 2 : elementBytes); }
  int64_t halves() const { return tileN / instN; }
  /// f32 per thread of one m64nN fragment.
  int64_t fragment() const { return instN / 2; }
  /// Scale blocks along K in one stage.
  int64_t subBlocks() const { return fp8() ? tileK() / scaleK : 1; }

  QuantAttr scheme;
  int64_t tileN;
  int64_t elementBytes = 2, instN, scaleK = 0;
  bool convert = false;
  NVVM::WGMMATypes type = NVVM::WGMMATypes::bf16;
};

/// A grouped (or dense) matmul kernel, as its #moe.matmul_config says: a
/// block computes tileM rows x tileN weight rows with a producer and
/// `warpGroups` consumer warpgroups over a ring of `stages` K slices; K may
/// be split among `splits` blocks; a persistent kernel's blocks walk the
/// tiles in raster order.
struct MatmulConfig : sm90a::MatmulLayout {
  /// Registers per thread after setmaxnreg.
  int64_t producerRegisters = sm90a::kProducerRegisters,
          consumerRegisters = sm90a::kConsumerRegisters;
  MatmulEncoding enc{QuantAttr(), kTileN};

  bool grouped = false;
  int64_t experts = 1, n = 0, kDim = 0;
  /// The weights are stored [E, K, N] (a dgrad's) and loaded as they lie,
  /// 64 x 64 boxes of K rows by N columns read MN-major by wgmma.
  bool transposed = false;
  /// Weight rows per weight scale: 1 for per-row (column) scales, else a
  /// square block of 128.
  int64_t rhsScaleRows = 1;
  /// A gated activation: a tile computes tileN / 2 gate and the matching
  /// up columns, and gives tileN / 2 outputs.
  bool gated = false;
  /// The epilogue is a gated activation's backward (activation_input): a
  /// tile's tileN columns of g give their gate and up gradients.
  bool activationGrad = false;
  int64_t outN = 0, outTile = 0;
  /// Quantization block of the output, 0 when it stays bf16.
  int64_t outBlock = 0;

  /// K slices, column tiles, K splits and the slices each takes; rowTiles
  /// is the row tiles of a bucket's grid, 0 when the grid follows the rows.
  int64_t kTiles = 0, colTiles = 0, splits = 1, tilesPerSplit = 0, rowTiles = 0;

  /// Blocks of a cluster along M: a cluster's blocks take consecutive row
  /// tiles of one column tile and each loads a share of the weight tile
  /// for all of them (TMA multicast).
  int64_t cluster = 1;
  /// Blocks walk the tiles (one block per multiprocessor); tiles are
  /// taken `group` at a time along `raster`.
  bool persistent = false;
  MatmulRaster raster = MatmulRaster::M;
  int64_t group = 8;
  /// Decode tiles (swapAb): the weights are wgmma's M side and the rows
  /// its N. A block computes tileN weight rows (m64 fragments; gated: the
  /// gate rows of tileN / 2 outputs, then their up rows) x tileM rows of
  /// one expert with one consumer warpgroup and a producer warp, its
  /// stages small enough that two blocks share a multiprocessor.
  int64_t swapFragments() const { return tileN / kSwapFragmentRows; }
  /// Weight rows of one TMA box: a fragment's when swapped, else a half's.
  int64_t weightBoxRows() const {
    return swapAb ? kSwapFragmentRows : tileN / 2;
  }

  /// Square weight blocks: the columns of each 128-column half before the
  /// half's second block row (128 when it lies in one).
  int64_t scaleSplit[2] = {128, 128};

  /// FP8: the consumer warpgroups take turns issuing each partial's
  /// wgmma, one promoting while the other's run.
  bool pingPong() const { return enc.fp8() && !enc.convert && warpGroups == 2; }
  /// Rows a cluster covers: the unit the tile walk counts.
  int64_t clusterRows() const { return tileM * cluster; }
  int64_t consumers() const { return warpGroups * 128; }
  /// f32 per consumer thread of the whole m64 x tileN accumulator.
  int64_t fragment() const { return groupRows() * tileN / 128; }
  /// Bytes of one 128-column half of a stage's weight tile.
  int64_t halfBytes() const { return tileN / 2 * rowBytes(); }
  /// Scale blocks along K (FP8).
  int64_t kBlocks() const {
    return enc.fp8() ? llvm::divideCeil(kDim, enc.scaleK) : 0;
  }
  /// Square weight blocks a stage's 128-column half `h` spans: one, or two
  /// where the half starts inside a block.
  int64_t blockScales(int64_t h) const { return scaleSplit[h] < 128 ? 2 : 1; }
  int64_t weightBlockRows() const { return llvm::divideCeil(n, int64_t(128)); }
};

/// The configuration of `op`'s kernel whose left operand has `rows` rows,
/// for calls of at most `maxTokens` tokens (0: any): its #moe.matmul_config
/// for that plan, checked against what the kernel can do (an error names
/// the field it cannot honour).
FailureOr<MatmulConfig> configureMatmul(GroupedMatmulOp op, TokenLinear rows,
                                        int64_t maxTokens);

/// An attention kernel: a block takes kBlockRows query rows (positions
/// times `pack` query heads of one key/value head) with a producer and
/// kGroups row groups of kGroupRows, over rings of `stages` K and V tiles
/// of `tileN` keys; the keys may be cut into `splits` ranges.
struct AttentionConfig : sm90a::AttentionLayout {
  static constexpr int64_t kGroupRows = 64, kGroups = 2, kBlockRows = 128;
  /// bf16 per 128-byte swizzled row, and its bytes.
  static constexpr int64_t kChunk = 64, kChunkBytes = 128;
  static constexpr int64_t kMaxStages = 4;
  int64_t producerRegisters = sm90a::kProducerRegisters,
          consumerRegisters = sm90a::kConsumerRegisters;

  int64_t batch = 0, sq = 0, hq = 0, d = 0, skv = 0, hkv = 0, dv = 0;
  int64_t tileN = 0, splits = 1;
  bool causal = false;
  /// Whether the row groups take turns on the tensor cores.
  bool pingPong = false;
  /// Query heads per key/value head; `pack` of them share a row tile, in
  /// `headBlocks` row tiles.
  int64_t group = 1, pack = 1, headBlocks = 1;
  int64_t rowTiles = 0, keyTiles = 0, perSplit = 1;
  /// Work tiles per row tile (heads x batch x splits), all work tiles, and
  /// row tiles per unit of work (2: a causal pair).
  int64_t headTiles = 0, workTiles = 0, perUnit = 1, unitsPerHead = 0;
  /// Whether a row group stores its output with TMA from its Q buffer.
  bool tmaStore = false;
  /// Rows of the output: batch x positions x query heads.
  int64_t rowsTotal = 0;

  int64_t consumers() const { return kGroups * 128; }
};

/// The configuration of `op`'s kernel; `op` has passed the kernel's shape
/// checks (static shapes, head sizes, row groups, tiles and schedule).
AttentionConfig configureAttention(TiledAttentionOp op);

/// A dispatch's kernels: the plan (one block of `planThreads`) and the
/// scatter (a block of `scatterThreads` per token, `width`-element
/// vectors).
struct DispatchConfig {
  /// One block plans every choice; experts beyond the thread count take
  /// turns.
  int64_t planThreads = 1024, scatterThreads = 128;
  /// The most shared memory the plan's per-warp table of experts' rows
  /// takes (beyond it, the table lives in the workspace).
  static constexpr int64_t kPlanTableBytes = 32 * 1024;
  int64_t experts = 0, topK = 0, hidden = 0, align = 1;
  TokenLinear tokens;
  /// Rows for every choice, plus each expert's alignment padding.
  TokenLinear dispatchedRows;
  int64_t width = 1;
  /// Quantization block of the dispatched rows, 0 when they stay bf16,
  /// and the lanes that share one.
  int64_t quantBlock = 0, lanes = 0;
};

/// The configuration of `op`'s kernels for `tokens` tokens.
DispatchConfig configureDispatch(DispatchOp op, TokenLinear tokens);

/// A route's kernels. A router of bf16 rows whose width is a multiple of 8
/// takes its product on tensor cores (`tensorCores`): in `chunks` column
/// ranges of kChunk, summed in order, whatever kernel computes them. For a
/// bucket of at most kProductSplitTokens tokens each chunk of each 16
/// experts' rows is a warp's on its own (the partial sums go through the
/// workspace); otherwise a block copies each step's rows once into a shared
/// ring and each warp sums every chunk of 16 experts for its tokens. A
/// kernel of `selectWarps` warps a block then chooses, a token a warp (a
/// split form of more than 32 experts: a token a block, its warps summing
/// a stripe of experts' parts each, the first choosing).
/// Other routers: one kernel of blocks of kTokens tokens, or for a bucket of
/// at most kSplitTokens tokens (kSplitTokensEp for an expert-parallel layer)
/// a logits kernel that spreads the experts over blocks, then the choosing
/// kernel.
struct RouteConfig {
  static constexpr int64_t kWarps = 8, kTokens = 4, kSplitTokens = 64,
                           kSplitTokensEp = 512, kProductSplitTokens = 512,
                           kChunk = 256;
  int64_t experts = 0, hidden = 0, topK = 0;
  TokenLinear tokens;
  bool split = false;
  bool tensorCores = false;
  int64_t chunks = 1;
  /// Experts a warp takes per pass: two where the passes come out even
  /// (four would keep 128 f32 accumulators per thread and one block per
  /// SM).
  int64_t unroll = 1;
  /// Blocks along y of the split logits kernel, whose warps take one
  /// expert a pass, over twice the blocks.
  int64_t logitBlocks = 0;
  /// Warps (a token each) whose selection scratch shares a block.
  int64_t selectWarps = 0;
  /// Warps a block of the choosing kernel that sum one token's parts, a
  /// stripe of 32 experts each, where there are several parts and
  /// stripes (1: a warp a token, selectWarps a block).
  int64_t sumWarps = 1;
};

/// The configuration of `op`'s kernels for `tokens` tokens, built for
/// calls of at most `maxTokens` tokens (0: any), in an `expertParallel`
/// layer or not.
RouteConfig configureRoute(RouteOp op, TokenLinear tokens, int64_t maxTokens,
                           bool expertParallel = false);

/// A combine's kernel: a block of `threads` per token and per
/// `threads` x `width` columns of its row (`columnBlocks` of them on y).
struct CombineConfig {
  int64_t threads = 128;
  int64_t hidden = 0, topK = 0;
  TokenLinear tokens;
  int64_t width = 1, columnBlocks = 0;
};

/// The configuration of `op`'s kernel for `tokens` tokens.
CombineConfig configureCombine(CombineOp op, TokenLinear tokens);

/// A quantize or dequantize kernel of one thread per scale block: `data`
/// (the codes' side) is [prefix x] rows x cols, in blocks of rowsPerBlock
/// rows x blockSize columns.
struct ScaleBlockConfig {
  int64_t threads = 128;
  int64_t rank = 2, prefix = 1, rowsPerBlock = 1;
  int64_t blockSize = 0, cols = 0, colBlocks = 0;
  /// Token rows (dynamic, a scale row each), else the static row blocks.
  bool dynamicRows = false;
  int64_t rowBlocks = 0;
  int64_t blocksPerRowBlock() const { return prefix * colBlocks; }
};

/// The configuration of a kernel over `data` (rank 2 or 3) and its
/// `scales` in `scheme`.
ScaleBlockConfig configureScaleBlocks(Value data, Value scales,
                                      QuantAttr scheme);

/// A row quantize kernel: a block of `threads` per bf16 row of `cols`,
/// each thread `width` elements of a block of blockSize that `lanes`
/// neighbours share.
struct RowQuantizeConfig {
  int64_t threads = 128, width = 8;
  int64_t cols = 0, blockSize = 0, lanes = 0;
  /// Columns every thread walks: whole chunks of threads x width.
  int64_t chunkedCols() const {
    return llvm::divideCeil(cols, threads * width) * threads * width;
  }
};

/// The configuration of quantizing the bf16 rows of `input` in `scheme`.
RowQuantizeConfig configureRowQuantize(Value input, QuantAttr scheme);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_KERNELS_KERNELCONFIGS_H
