/*===- moe_ep.h - an expert-parallel layer's init and what it calls -*- C
 *-*-===*
 *
 * A layer compiled with ep_size N > 1 runs as N ranks, one per process, each
 * holding experts [rank * E / N, (rank + 1) * E / N). The library exports
 *   int32_t moe_<name>_ep_init(const moe_ep_config_t *config);
 *   void    moe_<name>_ep_finalize(void);
 * around its forward, and moe_last_error(). Every rank calls init (it
 * connects to the others), then each forward together with the others
 * (a collective: a rank with no tokens still calls it), then finalize.
 *
 *===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_MOE_EP_H
#define MOE_RUNTIME_MOE_EP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_ep_config {
  int32_t rank;
  int32_t world_size; /* must be the layer's ep_size */
  /* Rank 0 listens at bootstrap_host:bootstrap_port (or on listen_fd when
   * >= 0, see moe_transport_bootstrap_listen); the others connect there.
   * Init takes listen_fd: it is closed when init returns, whether it
   * succeeded or failed. */
  const char *bootstrap_host;
  int32_t bootstrap_port;
  int32_t listen_fd;
  /* The most tokens any rank passes to one forward: it sizes the buffers. */
  int64_t max_tokens;
  /* libfabric provider and domain; NULL: FI_PROVIDER, else the first of
   * efa, verbs, tcp, shm found (see moe_transport.h). */
  const char *provider;
  const char *domain;
  /* How long a forward waits for a peer, in ms; 0: 30000. */
  int32_t timeout_ms;
  /* GPU layers: nonzero moves every byte through host memory and
   * lib/transport's proxy, as between hosts, even for GPUs that share one
   * (NVLink is used otherwise). */
  int32_t proxy;
} moe_ep_config_t;

/* ---- called by the generated code -------------------------------------- */

int32_t moe_ep_init(int64_t hidden, int64_t top_k, int64_t experts,
                    int64_t ranks, const moe_ep_config_t *config);
void moe_ep_finalize(void);
/* Leaves the group without meeting the others (finalize is local on the
 * CPU: the same). */
void moe_ep_leave(void);
const char *moe_ep_last_error(void);
/* Around each forward: begin checks the call, end reports how it went. */
int32_t moe_ep_begin(int64_t tokens);
/* A training forward or backward: every rank must pass the same count (its
 * saved buffer holds ranks x tokens x top-k expert rows), else every rank
 * refuses the call alike. */
int32_t moe_ep_begin_training(int64_t tokens);
int32_t moe_ep_end(void);
/* The four halves of moe.ep_dispatch_send/recv and moe.ep_combine_send/recv;
 * pointers are passed as integers. A failure is kept for moe_ep_end, and
 * the calls after it move nothing (counts come out zero), so the forward
 * runs to its end without touching memory it does not own. */
void moe_ep_dispatch_send(int64_t data, int64_t data_row_bytes, int64_t scales,
                          int64_t scale_row_bytes, int64_t expert_ids,
                          int64_t weights, int64_t tokens, int64_t sent,
                          int64_t rows);
int64_t moe_ep_dispatch_wait(void);
void moe_ep_dispatch_unpack(int64_t data, int64_t scales, int64_t weights,
                            int64_t tokens_per_expert, int64_t expert_offsets,
                            int64_t origin);
/* `capacity`: the rows `expert_out` has room for (at least those that
 * arrived, which go back). `values` (0: none), an f32 a row, travels with
 * the rows; the receiver lays them out as `choice_rows` [rows] says. */
void moe_ep_combine_send(int64_t expert_out, int64_t row_bytes, int64_t origin,
                         int64_t capacity, int64_t sent, int64_t values);
void moe_ep_combine_recv(int64_t gathered, int64_t rows, int64_t choice_rows,
                         int64_t values);

/* ---- called by a GPU layer's generated code (EpCudaGroup.cpp) -----------
 * Init allocates the rank's state (`state_bytes`, for `capacity` tokens per
 * rank) in the current context and maps every peer's (or, with `proxy`,
 * pins it and a staging copy per peer in host memory and starts a thread
 * that calls `proxy_turn`, the layer's generated proxy routine); the
 * forward's
 * kernels find it at moe_ep_cuda_state(). Status reads whether a wait ran
 * out of time (call it once the forward's stream is done); finalize waits
 * for the context, meets the other ranks and frees the state. Errors are
 * moert_last_error()'s. */
int32_t moe_ep_cuda_init(int64_t state_bytes, int64_t capacity, int64_t hidden,
                         int64_t top_k, int64_t experts, int64_t ranks,
                         const moe_ep_config_t *config, void *proxy_turn);
void *moe_ep_cuda_state(void);
int32_t moe_ep_cuda_status(void);
void moe_ep_cuda_finalize(void);
/* Leaves the group without meeting the others, for a rank whose peers may
 * be gone: waits for the state's context (from any thread), stops the proxy
 * without forwarding what is staged, closes the transport and the peers'
 * mappings. Over NVLink its own state stays allocated until exit (a peer's
 * kernels may still write into it); through the proxy the transport is
 * closed before its host memory is freed. */
void moe_ep_cuda_leave(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RUNTIME_MOE_EP_H */
