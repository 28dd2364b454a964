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

constexpr inline size_t alignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct EpLayout {
  int64_t hidden = 0, topK = 0, experts = 0, ranks = 0, maxTokens = 0;
  size_t headerBytes() const { return alignUp(4 + 8 * size_t(topK), 16); }
  // The widest row: bf16, or codes with the most scales.
  size_t maxRecordBytes() const {
    return alignUp(headerBytes() + 2 * size_t(hidden) +
                       4 * ((size_t(hidden) + 31) / 32),
                   16);
  }
  size_t outRowBytes() const { return 2 * size_t(hidden); }
  size_t countsBytes() const { return alignUp(16 * size_t(ranks), 64); }
  size_t regionBytes() const { return size_t(maxTokens) * maxRecordBytes(); }
  // Receive: counts, one dispatch region per source, the combined rows.
  size_t dispatchOffset() const { return countsBytes(); }
  size_t combineOffset() const {
    return dispatchOffset() + size_t(ranks) * regionBytes();
  }
  size_t recvBytes() const {
    return combineOffset() + size_t(maxTokens) * size_t(topK) * outRowBytes();
  }
  // Send: staged counts, then dispatch regions or, later, combine rows.
  size_t sendDataOffset() const { return countsBytes(); }
  size_t sendBytes() const {
    size_t dispatch = size_t(ranks) * regionBytes();
    size_t combine =
        size_t(ranks) * size_t(maxTokens) * size_t(topK) * outRowBytes();
    return sendDataOffset() + (dispatch > combine ? dispatch : combine);
  }
};

} // namespace moe::rt

#endif // MOE_RUNTIME_EPLAYOUT_H
