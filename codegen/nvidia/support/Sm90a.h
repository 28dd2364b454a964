//===- Sm90a.h - what an sm_90a GPU offers a kernel -------------*- C++ -*-===//
//
// The one description of the target the sm_90a kernels are built for (H100,
// H200): shared memory, multiprocessors, registers, the wgmma shapes, TMA's
// box limits and the shared-memory layout of a matmul block. The dialect's
// verifiers, the passes that choose configurations, the kernel builders and
// the runtime all read it, so it is plain C++ with no MLIR inside. Another
// target is another description beside this one.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_SUPPORT_SM90A_H
#define MOE_CODEGEN_NVIDIA_SUPPORT_SM90A_H

#include <cstdint>

namespace sm90a {

// Shared memory.
/// A block may have 227 KiB, static and dynamic together, once the kernel
/// opts in (cuFuncSetAttribute); a multiprocessor holds 228 KiB.
inline constexpr int64_t kSharedPerBlock = 227 * 1024;
/// Shared memory a kernel gets without opting in: its static buffers, or
/// dynamic bytes the launch asks for without the attribute.
inline constexpr int64_t kSharedWithoutOptIn = 48 * 1024;
/// Shared memory a block of a kernel that runs two blocks a multiprocessor
/// may lay out, with room for each one's static part and reserved bytes.
inline constexpr int64_t kSharedTwoBlocks = 112 * 1024;
/// 128-byte swizzled tiles (TMA and wgmma operands) start at a multiple of
/// this; a kernel asks for as many bytes more than it lays out, and aligns
/// its dynamic buffer's start at run time.
inline constexpr int64_t kSwizzleAlign = 1024;
/// An mbarrier: 8 bytes of static shared memory.
inline constexpr int64_t kMbarrierBytes = 8;

// Multiprocessors and registers.
/// Multiprocessors of an H100 SXM or H200.
inline constexpr int64_t kMultiprocessors = 132;
/// Blocks of a grid that runs two on every multiprocessor.
inline constexpr int64_t kTwoBlocksEach = 2 * kMultiprocessors;
/// 32-bit registers of a multiprocessor.
inline constexpr int64_t kRegisterFile = 64 * 1024;
/// setmaxnreg: a producer warpgroup gives registers up to the consumers
/// (128 x 24 + 256 x 240 <= 64 Ki for two consumer warpgroups).
inline constexpr int64_t kProducerRegisters = 24, kConsumerRegisters = 240;
/// A producer warpgroup that also stages scales (FP8) keeps its loop state
/// and scale addresses in registers: at 24 the FP8 tile spilled 340 bytes
/// in its producer; at 40 (consumers 232) 24 bytes.
inline constexpr int64_t kScaleProducerRegisters = 40,
                         kScaleConsumerRegisters = 232;
static_assert(128 * (kScaleProducerRegisters + 2 * kScaleConsumerRegisters) <=
              kRegisterFile);
/// A decode-tile consumer thread's registers for its accumulators, FP8
/// partials, scale products and a stage's scales (decodeRegisters), so
/// that within kDecodeMaxRegisters the rest (addresses, loop state, the
/// epilogue's) fits without spilling: MXFP8's four scale blocks a stage at
/// 144 of these spilled 148 bytes under 168.
inline constexpr int64_t kDecodeRegisters = 128;
/// A decode-tile block: a consumer warpgroup and a producer warp. Its
/// threads may hold at most kDecodeMaxRegisters each (ptxas's .maxnreg),
/// so that two blocks always share a multiprocessor (one block alone
/// leaves the weight stream half its parallelism): each of the four
/// schedulers' quarters of the register file holds the 3 of their 10 warps
/// that one of them gets.
inline constexpr int64_t kDecodeThreads = 128 + 32;
inline constexpr int64_t kDecodeMaxRegisters =
    kRegisterFile / 4 / ((2 * kDecodeThreads / 32 + 3) / 4 * 32) / 8 * 8;
static_assert(kDecodeMaxRegisters == 168);

// wgmma.
/// Rows of one wgmma (a warpgroup's fragment) and its K in bytes: 16 bf16
/// or 32 E4M3 elements.
inline constexpr int64_t kWgmmaM = 64, kWgmmaKBytes = 32;
/// N of a dense wgmma: a multiple of 8 from 8 to 256, for bf16 and E4M3.
inline constexpr int64_t kWgmmaNStep = 8, kWgmmaMaxN = 256;
constexpr bool isWgmmaN(int64_t n) {
  return n >= kWgmmaNStep && n <= kWgmmaMaxN && n % kWgmmaNStep == 0;
}
/// K of one wgmma for elements of `elementBytes` (2: bf16, 1: E4M3).
constexpr int64_t wgmmaK(int64_t elementBytes) {
  return kWgmmaKBytes / elementBytes;
}

// TMA.
/// A box spans at most 256 elements along each dimension; with the 128-byte
/// swizzle its inner dimension is at most 128 bytes; a tensor's rows are a
/// multiple of 16 bytes.
inline constexpr int64_t kTmaMaxBoxDim = 256, kTmaSwizzleBytes = 128;
/// bf16 columns of a chunk of an MN-major wgmma operand: one swizzled
/// 128-byte row; a descriptor's leading offset spans chunk to chunk.
inline constexpr int64_t kMNMajorChunkColumns = kTmaSwizzleBytes / 2;
inline constexpr int64_t kTmaRowAlign = 16;
/// An mbarrier wait's suspend-time hint (try_wait.parity), in ticks.
inline constexpr int64_t kWaitTicks = 10000000;

/// A grouped matmul block as its #moe.matmul_config lays it out in shared
/// memory (the kernel's layout, which the cost model sizes its ring by).
/// After the 1024-byte alignment:
///   [stages] x (A tileM rows, B tileN rows) of tileK elements;
///   FP8 per-column weight scales: [stages][scale blocks][tileN] f32;
///   FP8 staged row scales: [stages][scale blocks][stagedScales()], E8M0
///   bytes (per-column weight scales) or f32 followed by the square weight
///   blocks' scales;
///   MXFP8 converted to bf16: from the next 1024-byte boundary,
///   convertBuffers() bf16 stages (A tileM rows, B tileN rows of 128 bytes);
///   the consumer warpgroups' epilogue buffers (shared epilogue).
/// The ring's mbarriers (a full and an empty one a stage) are static.
struct MatmulLayout {
  /// The wide tile: 128 rows x 256 weight rows with two consumer
  /// warpgroups, 128 bytes of K (one swizzled row) a stage.
  static constexpr int64_t kTileM = 128, kTileN = 256, kWarpGroups = 2;
  static constexpr int64_t kSliceBytes = kTmaSwizzleBytes;
  /// The decode tile's weight rows are wgmma's M side, a fragment each.
  static constexpr int64_t kSwapFragmentRows = kWgmmaM;
  /// Columns of a consumer warpgroup's epilogue buffer (its rows of bf16).
  static constexpr int64_t kEpilogueColumns = 64;
  /// Slots for a stage's square weight-block scales after its row scales
  /// (32 f32: the buffers after them stay 128-byte aligned).
  static constexpr int64_t kBlockScaleSlots = 32;
  /// bf16 stages converted from MXFP8 codes: two, so a stage's conversion
  /// overlaps the last stage's wgmma, and the ring keeps four code stages
  /// beside them (H200: 4-8% faster than three bf16 stages beside two).
  static constexpr int64_t kConvertBuffers = 2;
  /// MXFP8 codes of K a stage when they are converted: a bf16 stage's
  /// 128-byte rows.
  static constexpr int64_t kConvertedTileK = kSliceBytes / 2;
  /// Whether stages of `tileK` codes are converted to bf16: MXFP8's (`mx`)
  /// of kConvertedTileK codes (the wide tile's; 128 codes promote).
  static bool converts(bool mx, int64_t tileK) {
    return mx && tileK == kConvertedTileK;
  }

  int64_t tileM = kTileM, tileN = kTileN, tileK = kSliceBytes / 2;
  int64_t stages = 0, warpGroups = kWarpGroups;
  /// 2: bf16; 1: E4M3 codes with a scale per `scaleK` elements of K.
  int64_t elementBytes = 2, scaleK = 0;
  /// FP8 weight scales per row (staged per column), not per square block.
  bool columnScales = false;
  /// A decode tile: the scales are read from global memory, not staged.
  bool swapAb = false;
  bool sharedEpilogue = false;
  /// bf16 planes of a warpgroup's epilogue buffer: 2 for an activation's
  /// backward (its gate and up columns).
  int64_t epiloguePlanes = 1;
  /// The consumers convert MXFP8 codes into bf16 stages (converts()).
  bool converted = false;

  bool fp8() const { return scaleK > 0; }
  int64_t groupRows() const { return tileM / warpGroups; }
  /// Scale blocks along K in one stage.
  int64_t subBlocks() const { return fp8() ? tileK / scaleK : 1; }
  /// bf16 stages the consumers convert MXFP8 codes into (0: none).
  int64_t convertBuffers() const { return converted ? kConvertBuffers : 0; }
  /// Bytes of a row of a stage's operands.
  int64_t rowBytes() const { return tileK * elementBytes; }
  int64_t stageBytes() const { return (tileM + tileN) * rowBytes(); }
  int64_t columnScaleBytes() const {
    return columnScales && !swapAb ? stages * subBlocks() * tileN * 4 : 0;
  }
  int64_t stagedScales() const {
    return tileM + (columnScales ? 0 : kBlockScaleSlots);
  }
  int64_t stagedScaleBytes() const {
    return fp8() && !swapAb
               ? stages * subBlocks() * stagedScales() * (columnScales ? 1 : 4)
               : 0;
  }
  int64_t columnScaleOffset() const { return stages * stageBytes(); }
  int64_t stagedScaleOffset() const {
    return columnScaleOffset() + columnScaleBytes();
  }
  /// A bf16 stage of converted codes, after the staged scales.
  int64_t convertBytes() const { return (tileM + tileN) * kSliceBytes; }
  int64_t convertOffset() const {
    int64_t end = stagedScaleOffset() + stagedScaleBytes();
    return converted ? (end + kSwizzleAlign - 1) / kSwizzleAlign * kSwizzleAlign
                     : end;
  }
  /// One consumer warpgroup's epilogue buffer, after those.
  int64_t epilogueBytes() const {
    return epiloguePlanes * groupRows() * kEpilogueColumns * 2;
  }
  int64_t epilogueOffset() const {
    return convertOffset() + convertBuffers() * convertBytes();
  }
  /// The dynamic shared memory the kernel asks for: the buffers and room to
  /// align them.
  int64_t sharedBytes() const {
    return epilogueOffset() +
           (sharedEpilogue ? warpGroups * epilogueBytes() : 0) + kSwizzleAlign;
  }
  /// The ring's mbarriers: static shared memory, which a block's limit
  /// counts beside the dynamic bytes.
  int64_t barrierBytes() const { return 2 * stages * kMbarrierBytes; }
  int64_t totalBytes() const { return sharedBytes() + barrierBytes(); }
  /// The stages whose layout fits `limit` bytes, static and dynamic (at
  /// least `atLeast`).
  int64_t stagesWithin(int64_t limit, int64_t atLeast) const {
    MatmulLayout none = *this, one = *this;
    none.stages = 0, one.stages = 1;
    int64_t perStage = one.totalBytes() - none.totalBytes();
    MatmulLayout fits = *this;
    fits.stages = (limit - none.totalBytes()) / perStage;
    // The converted stages' alignment may take a stage's worth less.
    while (fits.stages > atLeast && fits.totalBytes() > limit)
      --fits.stages;
    return fits.stages > atLeast ? fits.stages : atLeast;
  }
};

/// An attention block's shared memory after the alignment: `qBuffers` Q
/// tiles, then a ring of `stages` K tiles and one of V tiles.
struct AttentionLayout {
  int64_t qBytes = 0, kBytes = 0, vBytes = 0;
  int64_t qBuffers = 1, stages = 0;

  int64_t kRingOffset() const { return qBuffers * qBytes; }
  int64_t vRingOffset() const { return kRingOffset() + stages * kBytes; }
  int64_t sharedBytes() const {
    return vRingOffset() + stages * vBytes + kSwizzleAlign;
  }
  /// Two Q buffers where two K/V slots still fit beside them (the producer
  /// loads the next tile's Q while the row groups finish this one), then
  /// as many K/V slots as fit, at most `maxStages`.
  void fit(int64_t maxStages) {
    qBuffers =
        2 * qBytes + 2 * (kBytes + vBytes) + kSwizzleAlign <= kSharedPerBlock
            ? 2
            : 1;
    int64_t fits = (kSharedPerBlock - qBuffers * qBytes - kSwizzleAlign) /
                   (kBytes + vBytes);
    stages = fits < maxStages ? fits : maxStages;
  }
};

/// A weight-gradient (K-grouped) matmul block: dW tile [tileM, tileN] =
/// sum over an expert's rows of dY[rows, tileM columns]^T X[rows, tileN
/// columns]. A stage holds `kSlabRows` rows of both operands, each as
/// 64-column chunks of kSlabRows swizzled 128-byte rows (MN-major for
/// wgmma): tileM / 64 chunks of dY, then tileN / 64 of X. After the
/// 1024-byte alignment: [stages] x stageBytes(), then each consumer
/// warpgroup's kEpilogueBuffers epilogue buffers of its 64 rows x 128
/// bytes of the result (swizzled as TMA stores them: one fills while the
/// other's store reads it). The mbarriers are static.
struct WgradLayout {
  static constexpr int64_t kTileM = 128, kWarpGroups = 2, kSlabRows = 64;
  static constexpr int64_t kChunkColumns = kMNMajorChunkColumns;
  static constexpr int64_t kChunkBytes = kSlabRows * kTmaSwizzleBytes;
  static constexpr int64_t kEpilogueBuffers = 2;
  static constexpr int64_t kEpilogueBufferBytes = kWgmmaM * kTmaSwizzleBytes;
  int64_t tileM = kTileM, tileN = 256, stages = 0;

  int64_t aChunks() const { return tileM / kChunkColumns; }
  int64_t bChunks() const { return tileN / kChunkColumns; }
  int64_t stageBytes() const { return (aChunks() + bChunks()) * kChunkBytes; }
  int64_t epilogueOffset() const { return stages * stageBytes(); }
  int64_t epilogueBytes() const {
    return kWarpGroups * kEpilogueBuffers * kEpilogueBufferBytes;
  }
  int64_t sharedBytes() const {
    return epilogueOffset() + epilogueBytes() + kSwizzleAlign;
  }
  int64_t barrierBytes() const { return 2 * stages * kMbarrierBytes; }
  /// As many stages as fit a block beside the epilogue, at most
  /// `maxStages`.
  void fit(int64_t maxStages) {
    int64_t fits = (kSharedPerBlock - kSwizzleAlign - epilogueBytes()) /
                   (stageBytes() + 2 * kMbarrierBytes);
    stages = fits < maxStages ? fits : maxStages;
  }
};

/// Registers a decode-tile consumer thread keeps: `fragments` m64 x `tileM`
/// accumulators; FP8: as many partials and as many products of a row's and
/// a weight row's scale (ptxas computes them while the wgmma run), and for
/// each of a stage's `sub` scale blocks its rows' and weight rows' scales.
constexpr int64_t decodeRegisters(int64_t fragments, int64_t tileM, bool fp8,
                                  int64_t sub) {
  return fragments * tileM / 2 * (fp8 ? 3 : 1) +
         (fp8 ? sub * (tileM / 4 + 2 * fragments) : 0);
}

} // namespace sm90a

#endif // MOE_CODEGEN_NVIDIA_SUPPORT_SM90A_H
