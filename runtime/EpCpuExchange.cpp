//===- EpCpuExchange.cpp - a CPU layer's token exchanges over transport ---===//
//
// What the CPU backend's moe.ep_* ops call: bytes move between ranks through
// lib/transport (RMA writes counted per peer, no ordering assumed); the
// arithmetic stays in the generated code. One exchange per forward and
// direction, each in two halves:
//
//  dispatch  the sender packs one record per (token, destination rank) into
//            that rank's region (token index, the choices the rank holds,
//            their weights, the row and its scales) and writes the region's
//            count, then the region, to the rank. The receiver waits for
//            every count and region, then fans records out expert-major.
//  combine   each expert output row goes back to its token's rank, at the
//            row the token's rank chose for it when it sent the token.
//
// Buffers are sized at init from the most tokens a rank passes; a forward
// that would overflow them is refused on every rank alike (docs/
// expert-parallel.md).
//
//===----------------------------------------------------------------------===//

#include "runtime/moe_ep.h"

#include "moe_transport.h"
#include "runtime/EpJoin.h"
#include "runtime/EpLayout.h"
#include "runtime/moert.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A count slot: what rank s tells rank q before its tokens.
struct CountSlot {
  uint32_t tokens;     // records in the region that follows
  uint32_t returnBase; // where q's outputs for s start in s's combine buffer
  uint32_t failed;     // s cannot run this forward (detail says why)
  uint32_t detail;     // with failed: the tokens s was given
};
static_assert(sizeof(CountSlot) == 16, "count slots are 16 bytes");

using moe::rt::alignUp;
using moe::rt::checkEpConfig;
using moe::rt::EpLayout;
using moe::rt::joinEpGroup;
using Shape = EpLayout;

struct State {
  moe_transport_t *transport = nullptr;
  Shape shape;
  int rank = 0;
  int timeoutMs = 30000;
  int killAfterSend = -1;  // test hook: this rank dies mid-forward
  int sendsBeforeKill = 0; // after this many dispatches (a step's backward)
  // Test hook: the return base this rank gives its peers.
  std::optional<uint32_t> testReturnBase;
  uint8_t *send = nullptr, *recv = nullptr;
  // Cumulative arrivals expected from each peer, per counter.
  std::vector<uint64_t> countsExpected, payloadExpected, combineExpected;
  // A transport failure leaves the group unusable.
  std::string broken;

  // This forward.
  bool inForward = false;
  bool training = false; // every rank must pass the same token count
  int64_t tokens = 0, given = 0;
  std::string localFailure, groupFailure;
  size_t dataRowBytes = 0, scaleRowBytes = 0, recordBytes = 0;
  std::vector<uint32_t> choices;  // choices this rank sent each rank
  std::vector<CountSlot> arrived; // what each source told this rank
  std::vector<uint32_t> returns;  // rows this rank owes each source
  int64_t received = 0;           // rows fanned out here
};

State state;
std::string lastError;

template <typename T> T *at(int64_t address) {
  return reinterpret_cast<T *>(static_cast<uintptr_t>(address));
}

int32_t fail(const std::string &message) {
  lastError = message;
  // The library's moe_last_error reads the runtime's, which training
  // calls set too.
  moert_set_error(message.c_str());
  return 1;
}

bool ok() {
  return state.inForward && state.broken.empty() && state.groupFailure.empty();
}

/// A transport call that failed: the group cannot be trusted after it.
void transportFailed(const char *what, moe_transport_status_t status) {
  if (!state.broken.empty())
    return;
  state.broken = std::string(what) + ": " + moe_transport_status_name(status) +
                 ": " + moe_transport_last_error();
}

bool write(int peer, size_t srcOffset, size_t length, size_t remoteOffset,
           uint32_t counter) {
  moe_transport_status_t status =
      moe_transport_write(state.transport, peer, srcOffset, length,
                          remoteOffset, counter, state.timeoutMs);
  if (status != MOE_TRANSPORT_OK) {
    transportFailed("sending to a peer", status);
    return false;
  }
  return true;
}

bool waitFor(int peer, uint32_t counter, uint64_t target) {
  moe_transport_status_t status = moe_transport_wait_arrivals(
      state.transport, peer, counter, target, state.timeoutMs);
  if (status != MOE_TRANSPORT_OK) {
    transportFailed(("waiting for rank " + std::to_string(peer)).c_str(),
                    status);
    return false;
  }
  return true;
}

void flush() {
  moe_transport_status_t status =
      moe_transport_flush(state.transport, state.timeoutMs);
  if (status != MOE_TRANSPORT_OK)
    transportFailed("completing sends", status);
}

bool shapeFits(const Shape &s, std::string &why) {
  // Offsets must stay far from overflow; 2^46 bytes is beyond any host.
  const double limit = double(int64_t(1) << 46);
  double recv =
      double(s.countsBytes()) +
      double(s.ranks) * double(s.maxTokens) * double(s.maxRecordBytes()) +
      double(s.maxTokens) * double(s.topK) * double(s.outRowBytes());
  double send =
      double(s.ranks) * double(s.maxTokens) *
      (double(s.maxRecordBytes()) + double(s.topK) * double(s.outRowBytes()));
  if (recv > limit || send > limit) {
    why = "max_tokens " + std::to_string(s.maxTokens) +
          " needs buffers beyond 2^46 bytes";
    return false;
  }
  return true;
}

} // namespace

extern "C" {

const char *moe_ep_last_error(void) { return lastError.c_str(); }

int32_t moe_ep_init(int64_t hidden, int64_t topK, int64_t experts,
                    int64_t ranks, const moe_ep_config_t *config) {
  moe::rt::ListenSocket listenSocket(config);
  if (state.transport)
    return fail("the expert-parallel group is already initialized (call "
                "finalize first)");
  // Offsets are i32 in the generated code: tokens x top_k must fit.
  std::string why =
      checkEpConfig(config, ranks, (int64_t(1) << 31) / (topK > 0 ? topK : 1));
  if (!why.empty())
    return fail(why);
  Shape shape{hidden, topK, experts, ranks, config->max_tokens};
  if (!shapeFits(shape, why))
    return fail(why);

  moe_transport_t *transport =
      joinEpGroup(config, listenSocket, nullptr, shape.sendBytes(), nullptr,
                  shape.recvBytes(), why);
  if (!transport)
    return fail(why);
  state = State();
  state.transport = transport;
  state.shape = shape;
  state.rank = config->rank;
  state.timeoutMs = config->timeout_ms ? config->timeout_ms : 30000;
  state.send = static_cast<uint8_t *>(moe_transport_send_buffer(transport));
  state.recv = static_cast<uint8_t *>(moe_transport_recv_buffer(transport));
  state.countsExpected.assign(ranks, 0);
  state.payloadExpected.assign(ranks, 0);
  state.combineExpected.assign(ranks, 0);
  if (const char *kill = std::getenv("MOE_EP_TEST_KILL_RANK"))
    state.killAfterSend = std::atoi(kill);
  if (const char *after = std::getenv("MOE_EP_TEST_KILL_AFTER"))
    state.sendsBeforeKill = std::atoi(after);
  state.testReturnBase = moe::rt::testReturnBase(state.rank);
  return 0;
}

void moe_ep_finalize(void) {
  moe_transport_close(state.transport);
  state = State();
}

// Finalize meets no one on the CPU: closing tells the peers' transports.
void moe_ep_leave(void) { moe_ep_finalize(); }

int32_t moe_ep_begin_training(int64_t tokens) {
  int32_t status = moe_ep_begin(tokens);
  state.training = status == 0;
  return status;
}

int32_t moe_ep_begin(int64_t tokens) {
  if (!state.transport)
    return fail("the expert-parallel group is not initialized (call "
                "moe_<layer>_ep_init first)");
  if (!state.broken.empty())
    return fail("the expert-parallel group failed earlier: " + state.broken);
  int64_t ranks = state.shape.ranks;
  state.inForward = true;
  state.training = false;
  state.given = tokens;
  state.localFailure.clear();
  state.groupFailure.clear();
  state.tokens = tokens;
  state.choices.assign(ranks, 0);
  state.arrived.assign(ranks, CountSlot{});
  state.returns.assign(ranks, 0);
  state.received = 0;
  // Refused here, the call still takes part in the exchange (with no
  // tokens), so every rank learns of it and none waits in vain.
  if (tokens < 0 || tokens > state.shape.maxTokens) {
    state.localFailure = "rank " + std::to_string(state.rank) + " was given " +
                         std::to_string(tokens) +
                         " tokens, more than the max_tokens (" +
                         std::to_string(state.shape.maxTokens) +
                         ") its buffers were sized for at init";
    state.tokens = 0;
  }
  return 0;
}

int32_t moe_ep_end(void) {
  state.inForward = false;
  if (!state.broken.empty())
    return fail(state.broken);
  if (!state.localFailure.empty())
    return fail(state.localFailure);
  if (!state.groupFailure.empty())
    return fail(state.groupFailure);
  return 0;
}

void moe_ep_dispatch_send(int64_t data, int64_t dataRowBytes, int64_t scales,
                          int64_t scaleRowBytes, int64_t expertIds,
                          int64_t weights, int64_t tokens, int64_t sent,
                          int64_t rows) {
  const Shape &s = state.shape;
  int64_t k = s.topK, local = s.experts / s.ranks;
  int32_t *rowsOut = at<int32_t>(rows);
  int32_t *sentOut = at<int32_t>(sent);
  for (int64_t i = 0; i < tokens * k; ++i)
    rowsOut[i] = -1;
  for (int64_t r = 0; r < s.ranks; ++r)
    sentOut[r] = 0;
  if (!state.inForward || !state.broken.empty())
    return;
  int64_t count = state.localFailure.empty() ? tokens : 0;
  state.dataRowBytes = size_t(dataRowBytes);
  state.scaleRowBytes = size_t(scaleRowBytes);
  state.recordBytes =
      alignUp(s.headerBytes() + state.dataRowBytes + state.scaleRowBytes, 16);
  if (state.recordBytes > s.maxRecordBytes()) {
    state.broken = "a token record of " + std::to_string(state.recordBytes) +
                   " bytes exceeds the " + std::to_string(s.maxRecordBytes()) +
                   " the buffers were sized for";
    return;
  }
  const int32_t *ids = at<const int32_t>(expertIds);
  const float *w = weights ? at<const float>(weights) : nullptr;
  const uint8_t *rowData = at<const uint8_t>(data);
  const uint8_t *rowScales = scales ? at<const uint8_t>(scales) : nullptr;
  auto owner = [&](int32_t id) -> int64_t {
    return id >= 0 && id < s.experts ? id / local : -1;
  };

  // Each rank's choices first: they fix where outputs come home.
  std::vector<uint32_t> base(s.ranks, 0), cursor(s.ranks, 0);
  for (int64_t i = 0; i < count * k; ++i)
    if (int64_t q = owner(ids[i]); q >= 0)
      ++state.choices[q];
  for (int64_t q = 1; q < s.ranks; ++q)
    base[q] = base[q - 1] + state.choices[q - 1];
  cursor = base;

  std::vector<uint32_t> records(s.ranks, 0);
  size_t header = s.headerBytes();
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t q = 0; q < s.ranks; ++q) {
      bool holds = false;
      for (int64_t j = 0; j < k; ++j)
        holds |= owner(ids[t * k + j]) == q;
      if (!holds)
        continue;
      uint8_t *record = state.send + s.sendDataOffset() +
                        size_t(q) * s.regionBytes() + s.recordsOffset() +
                        size_t(records[q]++) * state.recordBytes;
      std::memset(record, 0, header);
      int32_t token = int32_t(t);
      std::memcpy(record, &token, 4);
      for (int64_t j = 0; j < k; ++j) {
        int32_t id = ids[t * k + j];
        int32_t localId = owner(id) == q ? int32_t(id - q * local) : -1;
        float weight = w ? w[t * k + j] : 0.0f;
        int32_t back = localId >= 0 ? int32_t(cursor[q]++) : -1;
        if (localId >= 0)
          rowsOut[t * k + j] = back;
        std::memcpy(record + s.localIdOffset(j), &localId, 4);
        std::memcpy(record + s.weightOffset(j), &weight, 4);
        std::memcpy(record + s.returnOffset(j), &back, 4);
      }
      std::memcpy(record + header, rowData + size_t(t) * state.dataRowBytes,
                  state.dataRowBytes);
      if (rowScales)
        std::memcpy(record + header + state.dataRowBytes,
                    rowScales + size_t(t) * state.scaleRowBytes,
                    state.scaleRowBytes);
    }
  }

  // Counts first, then the records; this rank's own go by memcpy.
  for (int64_t q = 0; q < s.ranks; ++q) {
    sentOut[q] = int32_t(records[q]);
    CountSlot slot{records[q], base[q], state.localFailure.empty() ? 0u : 1u,
                   uint32_t(tokens)};
    if (state.testReturnBase && q != state.rank)
      slot.returnBase = *state.testReturnBase;
    size_t slotOffset = size_t(q) * sizeof(CountSlot);
    size_t regionSrc =
        s.sendDataOffset() + size_t(q) * s.regionBytes() + s.recordsOffset();
    size_t regionDst = s.dispatchOffset() +
                       size_t(state.rank) * s.regionBytes() + s.recordsOffset();
    size_t bytes = size_t(records[q]) * state.recordBytes;
    if (q == state.rank) {
      std::memcpy(state.recv + size_t(state.rank) * sizeof(CountSlot), &slot,
                  sizeof slot);
      std::memcpy(state.recv + regionDst, state.send + regionSrc, bytes);
      continue;
    }
    std::memcpy(state.send + slotOffset, &slot, sizeof slot);
    if (!write(int(q), slotOffset, sizeof slot,
               size_t(state.rank) * sizeof(CountSlot),
               moe::rt::kCounterDispatchCount))
      return;
    if (bytes && !write(int(q), regionSrc, bytes, regionDst,
                        moe::rt::kCounterDispatchPayload))
      return;
  }
  if (state.killAfterSend == state.rank && state.sendsBeforeKill-- <= 0)
    std::raise(SIGKILL);
}

int64_t moe_ep_dispatch_wait(void) {
  if (!state.inForward || !state.broken.empty())
    return 0;
  const Shape &s = state.shape;
  for (int64_t q = 0; q < s.ranks; ++q) {
    if (q != state.rank && !waitFor(int(q), moe::rt::kCounterDispatchCount,
                                    ++state.countsExpected[q]))
      return 0;
    CountSlot slot;
    std::memcpy(&slot, state.recv + size_t(q) * sizeof(CountSlot), sizeof slot);
    if (slot.tokens > uint64_t(s.maxTokens)) {
      state.broken = "rank " + std::to_string(q) + " sent " +
                     std::to_string(slot.tokens) + " tokens, more than " +
                     "max_tokens (" + std::to_string(s.maxTokens) + ")";
      return 0;
    }
    state.arrived[q] = slot;
    if (slot.failed && state.groupFailure.empty())
      state.groupFailure =
          "rank " + std::to_string(q) + " could not run this forward (given " +
          std::to_string(slot.detail) + " tokens, more than max_tokens " +
          std::to_string(s.maxTokens) + "), so no rank ran it";
    if (q != state.rank && slot.tokens &&
        !waitFor(int(q), moe::rt::kCounterDispatchPayload,
                 ++state.payloadExpected[q]))
      return 0;
  }
  // A training step's saved buffer holds ranks x tokens x top-k expert
  // rows: every rank must have passed the same count. Each rank sees every
  // count, so all refuse alike.
  if (state.training && state.groupFailure.empty()) {
    bool same = true;
    std::string counts;
    for (int64_t q = 0; q < s.ranks; ++q) {
      same &= state.arrived[q].detail == state.arrived[0].detail;
      counts += (q ? ", " : "") + std::to_string(state.arrived[q].detail);
    }
    if (!same)
      state.groupFailure =
          "the ranks passed " + counts +
          " tokens: an expert-parallel training step takes the same count "
          "on every rank (its saved buffer holds ranks x tokens x top-k "
          "expert rows)";
  }
  flush();
  if (!ok())
    return 0;
  int64_t k = s.topK, local = s.experts / s.ranks;
  int64_t rows = 0;
  for (int64_t q = 0; q < s.ranks; ++q) {
    const uint8_t *region = state.recv + s.dispatchOffset() +
                            size_t(q) * s.regionBytes() + s.recordsOffset();
    int64_t fromQ = 0;
    for (uint32_t i = 0; i < state.arrived[q].tokens; ++i)
      for (int64_t j = 0; j < k; ++j) {
        int32_t localId;
        std::memcpy(&localId,
                    region + size_t(i) * state.recordBytes + s.localIdOffset(j),
                    4);
        if (localId < -1 || localId >= local) {
          state.broken =
              "rank " + std::to_string(q) + " sent a token for local expert " +
              std::to_string(localId) + " of " + std::to_string(local);
          return 0;
        }
        fromQ += localId >= 0;
      }
    // q's outputs go back at the base q gave: inside its combine area.
    uint64_t base = state.arrived[q].returnBase;
    if (base + uint64_t(fromQ) > uint64_t(s.maxTokens) * uint64_t(k)) {
      state.broken = "rank " + std::to_string(q) + " gave return base " +
                     std::to_string(base) + " for its " +
                     std::to_string(fromQ) + " rows; a combine area holds " +
                     std::to_string(s.maxTokens * k);
      return 0;
    }
    rows += fromQ;
  }
  state.received = rows;
  return rows;
}

void moe_ep_dispatch_unpack(int64_t data, int64_t scales, int64_t weights,
                            int64_t tokensPerExpert, int64_t expertOffsets,
                            int64_t origin) {
  const Shape &s = state.shape;
  int64_t k = s.topK, local = s.experts / s.ranks;
  int32_t *counts = at<int32_t>(tokensPerExpert);
  int32_t *offsets = at<int32_t>(expertOffsets);
  for (int64_t e = 0; e < local; ++e)
    counts[e] = 0;
  for (int64_t e = 0; e <= local; ++e)
    offsets[e] = 0;
  if (!ok() || state.received == 0)
    return;
  auto localIdOf = [&](const uint8_t *record, int64_t j) {
    int32_t id;
    std::memcpy(&id, record + Shape::localIdOffset(j), 4);
    return id;
  };
  auto regionOf = [&](int64_t q) {
    return state.recv + s.dispatchOffset() + size_t(q) * s.regionBytes() +
           s.recordsOffset();
  };
  for (int64_t q = 0; q < s.ranks; ++q)
    for (uint32_t i = 0; i < state.arrived[q].tokens; ++i)
      for (int64_t j = 0; j < k; ++j)
        if (int32_t e =
                localIdOf(regionOf(q) + size_t(i) * state.recordBytes, j);
            e >= 0)
          ++counts[e];
  std::vector<int64_t> cursor(local);
  for (int64_t e = 0; e < local; ++e) {
    offsets[e + 1] = offsets[e] + counts[e];
    cursor[e] = offsets[e];
  }
  uint8_t *rowData = at<uint8_t>(data);
  uint8_t *rowScales = scales ? at<uint8_t>(scales) : nullptr;
  float *rowWeights = weights ? at<float>(weights) : nullptr;
  int32_t *origins = at<int32_t>(origin);
  size_t header = s.headerBytes();
  // By source rank, then token: each source's choices in the order that
  // source numbered them (its `rows`).
  for (int64_t q = 0; q < s.ranks; ++q) {
    uint32_t returned = 0;
    for (uint32_t i = 0; i < state.arrived[q].tokens; ++i) {
      const uint8_t *record = regionOf(q) + size_t(i) * state.recordBytes;
      for (int64_t j = 0; j < k; ++j) {
        int32_t e = localIdOf(record, j);
        if (e < 0)
          continue;
        int64_t row = cursor[e]++;
        std::memcpy(rowData + size_t(row) * state.dataRowBytes, record + header,
                    state.dataRowBytes);
        if (rowScales)
          std::memcpy(rowScales + size_t(row) * state.scaleRowBytes,
                      record + header + state.dataRowBytes,
                      state.scaleRowBytes);
        if (rowWeights)
          std::memcpy(&rowWeights[row], record + s.weightOffset(j), 4);
        origins[2 * row] = int32_t(q);
        origins[2 * row + 1] =
            int32_t(state.arrived[q].returnBase + returned++);
      }
    }
    state.returns[q] = returned;
  }
}

void moe_ep_combine_send(int64_t expertOut, int64_t rowBytes, int64_t origin,
                         int64_t capacity, int64_t sent, int64_t values) {
  const Shape &s = state.shape;
  int32_t *sentOut = at<int32_t>(sent);
  for (int64_t q = 0; q < s.ranks; ++q)
    sentOut[q] = 0;
  if (!ok())
    return;
  // The rows that arrived go back; `capacity` is the buffer's room.
  int64_t rows = state.received;
  if (size_t(rowBytes) != s.outRowBytes() || capacity < rows) {
    state.broken = "combine was given " + std::to_string(capacity) +
                   " rows of " + std::to_string(rowBytes) + " bytes, but " +
                   std::to_string(rows) + " of " +
                   std::to_string(s.outRowBytes()) + " arrived";
    return;
  }
  std::vector<size_t> start(s.ranks, 0);
  for (int64_t q = 1; q < s.ranks; ++q)
    start[q] = start[q - 1] + state.returns[q - 1];
  const uint8_t *out = at<const uint8_t>(expertOut);
  const int32_t *origins = at<const int32_t>(origin);
  size_t bytes = s.outRowBytes();
  uint8_t *packed = state.send + s.sendDataOffset();
  float *packedValues =
      reinterpret_cast<float *>(packed + s.sendValuesOffset());
  const float *rowValues = values ? at<const float>(values) : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t q = origins[2 * i];
    int64_t back = int64_t(origins[2 * i + 1]) - state.arrived[q].returnBase;
    std::memcpy(packed + (start[q] + size_t(back)) * bytes,
                out + size_t(i) * bytes, bytes);
    if (rowValues)
      packedValues[start[q] + size_t(back)] = rowValues[i];
  }
  for (int64_t q = 0; q < s.ranks; ++q) {
    sentOut[q] = int32_t(state.returns[q]);
    size_t length = size_t(state.returns[q]) * bytes;
    size_t dst =
        s.combineOffset() + size_t(state.arrived[q].returnBase) * bytes;
    if (!length)
      continue;
    size_t valuesDst =
        s.combineValuesOffset() + 4 * size_t(state.arrived[q].returnBase);
    size_t valuesLength = 4 * size_t(state.returns[q]);
    if (q == state.rank) {
      std::memcpy(state.recv + dst, packed + start[q] * bytes, length);
      if (rowValues)
        std::memcpy(state.recv + valuesDst, packedValues + start[q],
                    valuesLength);
      continue;
    }
    if (!write(int(q), s.sendDataOffset() + start[q] * bytes, length, dst,
               moe::rt::kCounterCombinePayload))
      return;
    if (rowValues &&
        !write(int(q), s.sendDataOffset() + s.sendValuesOffset() + 4 * start[q],
               valuesLength, valuesDst, moe::rt::kCounterCombinePayload))
      return;
  }
}

void moe_ep_combine_recv(int64_t gathered, int64_t rows, int64_t choiceRows,
                         int64_t values) {
  const Shape &s = state.shape;
  uint8_t *out = at<uint8_t>(gathered);
  size_t bytes = s.outRowBytes();
  size_t total = 0;
  for (uint32_t c : state.choices)
    total += c;
  // With values, each peer's rows and values land as two writes.
  uint64_t writes = values ? 2 : 1;
  if (ok()) {
    for (int64_t q = 0; q < s.ranks; ++q)
      if (q != state.rank && state.choices[q] &&
          !waitFor(int(q), moe::rt::kCounterCombinePayload,
                   state.combineExpected[q] += writes))
        break;
    flush();
  }
  bool good = ok() && total <= size_t(rows);
  if (values) {
    // Laid out as the choices: rows [T, k] says where each one's row is.
    const int32_t *where = at<const int32_t>(choiceRows);
    float *valuesOut = at<float>(values);
    const float *arrived =
        reinterpret_cast<const float *>(state.recv + s.combineValuesOffset());
    for (int64_t i = 0; i < rows; ++i) {
      int32_t row = where[i];
      valuesOut[i] =
          good && row >= 0 && size_t(row) < total ? arrived[row] : 0.0f;
    }
  }
  if (!good) {
    std::memset(out, 0, size_t(rows) * bytes);
    return;
  }
  std::memcpy(out, state.recv + s.combineOffset(), total * bytes);
  std::memset(out + total * bytes, 0, (size_t(rows) - total) * bytes);
}

} // extern "C"
