//===- EpLayout.h - buffer layout of an expert-parallel rank ----*- C++ -*-===//
//
// Shared by the runtime, which allocates and addresses the buffers, and the
// compiler, which states their sizes in a layer's description. Both sizes
// are linear in max_tokens (the most tokens a rank passes to a forward).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_EPLAYOUT_H
#define MOE_RUNTIME_EPLAYOUT_H

#include <cstddef>
#include <cstdint>

namespace moe::rt {

/// lib/transport counters the exchanges count arrivals under (0 and 1 are
/// its all-to-all's), on the CPU path and the GPU proxy path alike.
constexpr uint32_t kCounterDispatchPayload = 2;
constexpr uint32_t kCounterDispatchCount = 3;
constexpr uint32_t kCounterCombinePayload = 4;
constexpr uint32_t kCounterIpcHandles = 5;
constexpr uint32_t kCounterCombineCount = 6;

constexpr inline size_t alignUp(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

struct EpLayout {
  int64_t hidden = 0, topK = 0, experts = 0, ranks = 0, maxTokens = 0;
  // A record's header: token index, then per choice the local expert (-1:
  // not this rank's), its weight, the row its output returns to and (GPU
  // exchange) its place among the source's choices of that expert.
  size_t headerBytes() const { return alignUp(4 + 16 * size_t(topK), 16); }
  static size_t localIdOffset(int64_t j) { return 4 + 4 * size_t(j); }
  size_t weightOffset(int64_t j) const { return 4 + 4 * size_t(topK + j); }
  size_t returnOffset(int64_t j) const { return 4 + 4 * size_t(2 * topK + j); }
  size_t positionOffset(int64_t j) const {
    return 4 + 4 * size_t(3 * topK + j);
  }
  int64_t localExperts() const { return ranks ? experts / ranks : 0; }
  // The widest row: bf16, or codes with the most scales.
  size_t maxRecordBytes() const {
    return alignUp(headerBytes() + 2 * size_t(hidden) +
                       4 * ((size_t(hidden) + 31) / 32),
                   16);
  }
  size_t outRowBytes() const { return 2 * size_t(hidden); }
  size_t countsBytes() const { return alignUp(16 * size_t(ranks), 64); }
  // A dispatch region: how many of the source's choices each local expert
  // got (the GPU exchange places rows by them), then the records.
  size_t recordsOffset() const {
    return alignUp(4 * size_t(localExperts()), 16);
  }
  size_t regionBytes() const {
    return recordsOffset() + size_t(maxTokens) * maxRecordBytes();
  }
  // Receive: counts, one dispatch region per source, the combined rows.
  size_t dispatchOffset() const { return countsBytes(); }
  size_t combineOffset() const {
    return dispatchOffset() + size_t(ranks) * regionBytes();
  }
  // After the combined rows, a value (f32) each: the backward's routing
  // weights' gradients, which travel with the rows.
  size_t combineValuesOffset() const {
    return alignUp(
        combineOffset() + size_t(maxTokens) * size_t(topK) * outRowBytes(), 16);
  }
  // (Linear in maxTokens: the alignment's room is counted whole.)
  size_t recvBytes() const {
    return combineOffset() + 16 +
           size_t(maxTokens) * size_t(topK) * (outRowBytes() + 4);
  }
  // Send: staged counts, then dispatch regions or, later, combine rows.
  size_t sendDataOffset() const { return countsBytes(); }
  size_t sendBytes() const {
    size_t dispatch = size_t(ranks) * regionBytes();
    size_t combine = 16 + size_t(ranks) * size_t(maxTokens) * size_t(topK) *
                              (outRowBytes() + 4);
    return sendDataOffset() + (dispatch > combine ? dispatch : combine);
  }
  // The combine's values, staged after its rows (from sendDataOffset()).
  size_t sendValuesOffset() const {
    return alignUp(
        size_t(ranks) * size_t(maxTokens) * size_t(topK) * outRowBytes(), 16);
  }
};

/// A GPU rank's state, one device allocation: control words, the peers'
/// state addresses (CUDA IPC), the receive area of EpLayout (written by the
/// peers over NVLink), the combine flags and scratch.
struct EpDeviceLayout {
  EpLayout recvLayout; // maxTokens: the compiled capacity
  static constexpr int64_t kMaxRanks = 64;
  // Control words (u32 unless said).
  static constexpr size_t kSeq = 0;          // forwards run so far
  static constexpr size_t kError = 4;        // nonzero: an ErrorKind
  static constexpr size_t kErrorPeer = 8;    // the rank it waited for
  static constexpr size_t kTicket = 12;      // blocks done sending tokens
  static constexpr size_t kTicket2 = 16;     // blocks done sending outputs
  static constexpr size_t kRank = 20;        // this rank
  static constexpr size_t kTimeoutNs = 24;   // u64: how long a wait spins
  static constexpr size_t kErrorTokens = 32; // kUnevenStep: the peer's count
  static constexpr size_t kErrorOwn = 36;    // and this rank's
  /// Test hook (MOE_EP_TEST_EXTRA_CHOICE): choices the dispatch adds to
  /// the count it sends each peer for the peer's first expert; 0 but in
  /// tests.
  static constexpr size_t kTestExtraChoice = 40;
  /// Test hook (MOE_EP_TEST_RETURN_BASE): the return base + 1 the dispatch
  /// gives its peers (0: its own).
  static constexpr size_t kTestReturnBase = 44;
  static_assert(kTestReturnBase == kTestExtraChoice + 4,
                "init writes the test hooks' words together");
  /// What kError holds once a forward failed; the first failure stays.
  enum ErrorKind : uint32_t {
    kTimedOut = 1,     // a wait for kErrorPeer ran out of time
    kUnevenStep = 2,   // a training step's ranks passed different counts
    kRowsMismatch = 3, // kErrorPeer's counts claimed kErrorTokens rows
                       // here, its records filled kErrorOwn (or fewer
                       // when some of its choices found no row)
    kRowsRefused = 4,  // kErrorPeer found this rank's counts and records
                       // disagree (kRowsMismatch there)
    kBadReturn = 5     // kErrorPeer gave a return base (kErrorTokens) that
                       // leaves its kErrorOwn rows outside its combine area
  };
  static constexpr size_t kSentCounts = 64;   // u32 per rank: records sent
  static constexpr size_t kSentChoices = 320; // u32 per rank: choices sent
  static constexpr size_t kRecvCounts = 576;  // i32 per rank: records come
  static constexpr size_t kReturnRows = 832;  // u32 per rank: rows owed it
  static constexpr size_t kPeers = 1536;      // u64 per rank: state address
  static constexpr size_t kRecv = 2048;
  /// 16 bytes per source rank: the forward whose outputs it sent (its
  /// flag), the rows it sent (through the proxy), and nonzero when it
  /// refused this rank's rows (kRowsRefused).
  size_t combineFlags() const {
    return alignUp(kRecv + recvLayout.recvBytes(), 256);
  }
  size_t recordIndex() const { // i32 [maxTokens, ranks]
    return alignUp(combineFlags() + 16 * size_t(recvLayout.ranks), 256);
  }
  size_t choicePosition() const { // i32 [maxTokens, topK]
    return alignUp(recordIndex() + 4 * size_t(recvLayout.maxTokens) *
                                       size_t(recvLayout.ranks),
                   256);
  }
  size_t expertChoices() const { // u32 per expert: choices sent to it
    return alignUp(choicePosition() + 4 * size_t(recvLayout.maxTokens) *
                                          size_t(recvLayout.topK),
                   256);
  }
  /// u32 per receive row: the forward that last wrote it (kSeq), so a
  /// row that no record of this forward filled is never sent back.
  size_t rowStamps() const {
    return alignUp(expertChoices() + 4 * size_t(recvLayout.experts), 256);
  }
  /// u32 [2, ranks]: per source rank, the rows its records filled this
  /// forward, then its choices that found no row.
  size_t rowChecks() const {
    return alignUp(rowStamps() + 4 * receiveRows(), 256);
  }
  size_t receiveRows() const {
    return size_t(recvLayout.ranks) * size_t(recvLayout.maxTokens) *
           size_t(recvLayout.topK);
  }
  size_t bytes() const {
    return alignUp(rowChecks() + 8 * size_t(recvLayout.ranks), 256);
  }
};

} // namespace moe::rt

#endif // MOE_RUNTIME_EPLAYOUT_H
