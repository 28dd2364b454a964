/*===- moert.h - what a compiled GPU layer calls in the runtime ---*- C -*-===*
 *
 * The host code moe-compile generates for a GPU target launches its kernels
 * through these calls; the library links them in statically, so a layer
 * needs only the CUDA driver at run time. Every call returns 0 on success,
 * else nonzero with moert_last_error() saying which driver call failed.
 *
 *===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_MOERT_H
#define MOE_RUNTIME_MOERT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launches `kernel` of the cubin `image` on `stream` (a CUstream, or null for
 * the default stream) in the current context, or in device 0's primary
 * context if none is current. `*module` caches the module, loaded once per
 * context, with each kernel's dynamic shared-memory limit raised. */
/* The multiprocessors of the current context's device (1 if it cannot be
 * told): a persistent kernel's grid. */
int32_t moert_multiprocessors(void);

/* `flags` bit 0: a cooperative launch (every block resident at once, or
 * the launch fails), for a kernel whose blocks wait for each other. */
int32_t moert_launch(void **module, const void *image, const char *kernel,
                     uint32_t grid_x, uint32_t grid_y, uint32_t block_x,
                     uint32_t shared_bytes, uint32_t flags, void *stream,
                     void **params);

/* Encodes the TMA descriptor (128 bytes, 64-byte aligned) of a tensor at
 * `base` of `rank` (2 to 5) dimensions, innermost first: `dims` sizes,
 * `strides` (rank - 1 of them) the elements between consecutive indices of
 * dimensions 1 and up, `box` the tile, with `element_bytes`-byte elements
 * (2: bf16, 1: bytes) and 128-byte swizzling. An empty tensor gets a zeroed
 * descriptor: no tile reads it. */
int32_t moert_tensor_map(void *descriptor, void *base, int32_t element_bytes,
                         int32_t rank, const int64_t *dims,
                         const int64_t *strides, const int64_t *box);

/* Checks a forward's call before anything is launched: `tokens` must be
 * between 0 and `max_tokens` (beyond it grids or row indices would
 * overflow); `kinds` has a letter per argument, 'w' for one read whatever the
 * token count (weights), 't' for one with a token dimension and 'e' for an
 * empty one (a dimension of 0): each must be non-null (a 't' one only when
 * tokens > 0, an 'e' one never) and 16-byte aligned, as the kernels move 16
 * bytes at a time; the workspace must be too when
 * `workspace_bytes` > 0. */
int32_t moert_check_call(void *const *args, const char *kinds, int64_t tokens,
                         int64_t max_tokens, const void *workspace,
                         int64_t workspace_bytes);

/* Writes the call's token count into the first `words` i32 words of
 * `workspace` on `stream`: the first is where the kernels read it, the
 * others split-K counters that count on from it. */
int32_t moert_set_tokens(void *workspace, int64_t tokens, int64_t words,
                         void *stream);

/* A layer's enqueue function: launches a plan's kernels with grids, TMA
 * descriptors and workspace slices sized for `tokens`. */
typedef int32_t (*moert_enqueue_fn)(void *const *args, int64_t tokens,
                                    void *stream, void *workspace);

/* Runs a token bucket's kernels on `stream`: replays the bucket's CUDA graph
 * for these `num_args` argument pointers, workspace and context, captured
 * (on a stream of the runtime's) with `enqueue` at the bucket's
 * `bucket_tokens` on first use, or re-captured and updated in place when
 * the arguments change (`*graphs` holds the bucket's few most recent
 * graphs). Launches eagerly, with grids for `tokens`, instead when `enabled`
 * is 0, MOE_GRAPHS=0 or MOERT_KERNEL_TIMES is set, or the caller is
 * capturing `stream`. */
int32_t moert_graph_launch(void **graphs, moert_enqueue_fn enqueue,
                           void *const *args, int32_t num_args, int64_t tokens,
                           int64_t bucket_tokens, void *stream, void *workspace,
                           int32_t enabled);

/* Captures the bucket's graph for these arguments as moert_graph_launch
 * would, without launching it. */
int32_t moert_graph_prepare(void **graphs, moert_enqueue_fn enqueue,
                            void *const *args, int32_t num_args,
                            int64_t bucket_tokens, void *stream,
                            void *workspace);

/* Training (a library built with moe-compile --train). The saved buffer a
 * training forward fills starts with a header naming the layer (`layer`, a
 * digest of its description) and the token count; begin writes it, after
 * checking the buffer is there. */
int32_t moert_saved_begin(void *saved, int64_t tokens, int64_t layer);
/* Unmarks a saved buffer whose training forward failed, so that no backward
 * reads it. */
void moert_saved_clear(void *saved);
/* Nonzero (with the reason in moert_last_error) unless `saved` holds what
 * this layer's training forward wrote for `tokens` tokens and `flags` are
 * the backward's (MOERT_GRAD_*). */
int32_t moert_backward_check(const void *saved, int64_t tokens, int64_t layer,
                             int32_t flags);
/* A gradient's flags: add into the caller's buffer rather than overwrite
 * it; weight gradients in bf16 rather than f32. */
#define MOERT_GRAD_ACCUMULATE 1
#define MOERT_GRAD_BF16 2
/* Set by generated code on a gradient the backward computes in bf16. */
#define MOERT_GRAD_SOURCE_BF16 4
/* Set by generated code where the backward may fail after computing (an
 * expert-parallel exchange): every gradient goes through scratch, moved
 * only once the call has succeeded. */
#define MOERT_GRAD_STAGED 8
/* Where the backward writes gradient `dst` (`bytes` as it computes it,
 * `mode` its flags): `dst` itself where the caller's dtype is the
 * backward's and nothing is added, else scratch memory; null (with the
 * reason in moert_last_error) if that cannot be had. */
void *moert_grad_target(void *dst, int64_t bytes, int32_t mode);
/* Moves a gradient from its target into `dst` (converted to the caller's
 * dtype, added where asked) and frees the scratch; `count` elements; a null
 * `dst` (a gradient not asked for) takes nothing. */
void moert_grad_finish(void *dst, void *target, int64_t count, int32_t mode);

/* A GPU training call's checks: the saved buffer (device memory) must be
 * there and 16-byte aligned; the backward's output gradient (when tokens >
 * 0) and each of its gradients too (`kinds` a letter each, as
 * moert_check_call's), and `flags` must be 0 (the GPU backward writes each
 * gradient in the dtype it computes it, over what the buffer held). */
int32_t moert_device_saved_check(const void *saved, int64_t tokens);
int32_t moert_device_backward_check(const void *output_grad, void *const *grads,
                                    const char *kinds, int64_t tokens,
                                    int32_t flags);
/* What the last failing call on this thread said. */
const char *moert_last_error(void);
/* Sets it (for the expert-parallel runtime, runtime/moe_ep.h). */
void moert_set_error(const char *message);
/* With MOERT_KERNEL_TIMES set in the environment, each kernel launch is
 * timed with events; this prints each kernel's mean time to stderr, each
 * line starting with `label`, and forgets them. */
void moert_kernel_times_report(const char *label);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RUNTIME_MOERT_H */
