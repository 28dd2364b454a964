//===- Training.cpp - a training library's saved buffer and gradients -----===//
//
// What a layer built for training calls around its training forward and
// backward: the header that ties a saved buffer to the layer and token
// count it was written for, and each gradient's way into the caller's
// buffer (the backward computes weight gradients in f32 and the tokens' in
// bf16; the caller may want bf16, or the sum with what it holds).
//
//===----------------------------------------------------------------------===//

#include "runtime/moert.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
constexpr char kMagic[8] = {'M', 'O', 'E', 'S', 'A', 'V', 'E', 'D'};

struct SavedHeader {
  char magic[8];
  int64_t layer;
  int64_t tokens;
};

int32_t fail(const std::string &message) {
  moert_set_error(message.c_str());
  return 1;
}

float fromBF16(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t toBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) // NaN stays NaN
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1); // round to nearest even
  return uint16_t(bits >> 16);
}

bool sourceBF16(int32_t mode) { return mode & MOERT_GRAD_SOURCE_BF16; }
bool targetBF16(int32_t mode) {
  return sourceBF16(mode) || (mode & MOERT_GRAD_BF16);
}
} // namespace

extern "C" int32_t moert_saved_begin(void *saved, int64_t tokens,
                                     int64_t layer) {
  if (!saved)
    return fail("the training forward needs a saved buffer (saved_size(" +
                std::to_string(tokens) + ") bytes); it is null");
  SavedHeader header;
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.layer = layer;
  header.tokens = tokens;
  std::memcpy(saved, &header, sizeof(header));
  return 0;
}

extern "C" void moert_saved_clear(void *saved) {
  if (saved)
    std::memset(saved, 0, sizeof(SavedHeader));
}

extern "C" int32_t moert_backward_check(const void *saved, int64_t tokens,
                                        int64_t layer, int32_t flags) {
  if (flags & ~(MOERT_GRAD_ACCUMULATE | MOERT_GRAD_BF16))
    return fail("backward flags " + std::to_string(flags) +
                " have bits other than accumulate (1) and bf16 (2)");
  if (!saved)
    return fail("the backward needs the saved tensors its training forward "
                "wrote; the saved buffer is null");
  SavedHeader header;
  std::memcpy(&header, saved, sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0)
    return fail("the saved buffer was not written by a training forward");
  if (header.layer != layer)
    return fail("the saved buffer was written by another layer's training "
                "forward");
  if (header.tokens != tokens)
    return fail("the saved tensors are of " + std::to_string(header.tokens) +
                " tokens; the backward was called with " +
                std::to_string(tokens));
  return 0;
}

extern "C" void *moert_grad_target(void *dst, int64_t bytes, int32_t mode) {
  bool direct = dst && !(mode & (MOERT_GRAD_ACCUMULATE | MOERT_GRAD_STAGED)) &&
                targetBF16(mode) == sourceBF16(mode);
  if (direct)
    return dst;
  void *scratch = std::malloc(bytes > 0 ? size_t(bytes) : 1);
  if (!scratch)
    fail("the backward could not allocate " + std::to_string(bytes) +
         " bytes for a gradient");
  return scratch;
}

extern "C" void moert_grad_finish(void *dst, void *target, int64_t count,
                                  int32_t mode) {
  if (target == dst)
    return;
  if (dst) {
    bool accumulate = mode & MOERT_GRAD_ACCUMULATE;
    for (int64_t i = 0; i < count; ++i) {
      float v = sourceBF16(mode) ? fromBF16(static_cast<uint16_t *>(target)[i])
                                 : static_cast<float *>(target)[i];
      if (targetBF16(mode)) {
        uint16_t *out = static_cast<uint16_t *>(dst) + i;
        *out = toBF16(accumulate ? fromBF16(*out) + v : v);
      } else {
        float *out = static_cast<float *>(dst) + i;
        *out = accumulate ? *out + v : v;
      }
    }
  }
  std::free(target);
}

namespace {
bool misaligned(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 != 0;
}
} // namespace

extern "C" int32_t moert_device_saved_check(const void *saved, int64_t tokens) {
  if (!saved || misaligned(saved))
    return fail("the training step needs the saved buffer (saved_size(" +
                std::to_string(tokens) +
                ") bytes of device memory, 16-byte aligned); it is " +
                (saved ? "not aligned" : "null"));
  return 0;
}

extern "C" int32_t moert_device_backward_check(const void *output_grad,
                                               void *const *grads,
                                               const char *kinds,
                                               int64_t tokens, int32_t flags) {
  if (flags != 0)
    return fail("backward flags " + std::to_string(flags) +
                ": the GPU backward overwrites each gradient in the dtype it "
                "computes it (training.gradients); add or convert it on the "
                "caller's side, with flags 0");
  if ((tokens > 0 && !output_grad) || misaligned(output_grad))
    return fail("the output's gradient is null or not 16-byte aligned");
  size_t count = std::strlen(kinds);
  if (count > 0 && !grads)
    return fail("grads is null; the GPU backward writes every gradient");
  for (size_t i = 0; i < count; ++i) {
    // A token-sized gradient of no tokens has nothing to write.
    bool written = kinds[i] == 'w' || (kinds[i] == 't' && tokens > 0);
    if ((written && !grads[i]) || misaligned(grads[i]))
      return fail("grads[" + std::to_string(i) +
                  "] is null or not 16-byte aligned; the GPU backward "
                  "writes every gradient");
  }
  return 0;
}
