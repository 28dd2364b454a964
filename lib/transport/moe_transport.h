/* moe_transport.h - expert-parallel communication on libfabric.
 *
 * One communicator per rank. Each owns a send buffer and a receive buffer
 * registered with the NIC, and a proxy thread that drives the NIC: the
 * producer (a GPU kernel in production, a host thread here) posts commands to
 * a single-producer ring in host-mapped memory and waits on counters in the
 * same memory; the proxy posts RMA writes carrying a 32-bit immediate and
 * counts, per source peer, the writes that land. Nothing assumes ordering
 * between writes or more than 4 bytes of immediate data (as on EFA).
 *
 * Every call returns a status; on failure moe_transport_last_error() holds a
 * message for the calling thread. Every wait takes a timeout in
 * milliseconds; a peer that dies or falls silent fails the communicator with
 * an error naming that peer's rank.
 */
#ifndef MOE_TRANSPORT_H
#define MOE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moe_transport_status {
  MOE_TRANSPORT_OK = 0,
  MOE_TRANSPORT_ERR_INVALID_ARGUMENT, /* bad config, null pointer, bad peer */
  MOE_TRANSPORT_ERR_OUT_OF_BOUNDS,    /* access past a registered region */
  MOE_TRANSPORT_ERR_RING_FULL,        /* command ring full, nothing posted */
  MOE_TRANSPORT_ERR_TIMEOUT,          /* a wait ran out of time */
  MOE_TRANSPORT_ERR_PEER_LOST,        /* a peer died or fell silent */
  MOE_TRANSPORT_ERR_BOOTSTRAP,        /* address exchange failed */
  MOE_TRANSPORT_ERR_FABRIC,           /* libfabric reported an error */
  MOE_TRANSPORT_ERR_STATE,     /* call out of order (e.g. not connected) */
  MOE_TRANSPORT_ERR_NO_MEMORY, /* an allocation failed */
} moe_transport_status_t;

/* Per (source peer, counter) arrival counts; immediates carry the counter. */
#define MOE_TRANSPORT_NUM_COUNTERS 8
/* Counters the all-to-all uses; the others are free for raw writes. */
#define MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS 0
#define MOE_TRANSPORT_COUNTER_ALLTOALL_PAYLOAD 1
#define MOE_TRANSPORT_MAX_RANKS 4096
#define MOE_TRANSPORT_MAX_ADDRESS 256

/* ---- host-mapped memory shared by producer and proxy ---------------------
 * In production this lives in cudaHostAlloc'd mapped memory so a kernel can
 * post and wait directly; the C functions below are the host-side producer.
 * Fields written by one side and read by the other are accessed atomically
 * (acquire/release). */

typedef enum moe_transport_command_kind {
  MOE_TRANSPORT_CMD_WRITE = 1, /* send buffer -> peer's receive buffer */
  /* zero-length write to every peer (and to itself), counted under the
   * command's counter: wait for it with moe_transport_wait_arrivals. It is
   * not moe_transport_barrier's, which counts apart. */
  MOE_TRANSPORT_CMD_BARRIER = 2,
} moe_transport_command_kind_t;

typedef struct moe_transport_command {
  uint32_t kind;          /* moe_transport_command_kind_t */
  uint32_t peer;          /* destination rank (WRITE) */
  uint64_t src_offset;    /* in this rank's send buffer */
  uint64_t length;        /* bytes; 0 is a pure signal */
  uint64_t remote_offset; /* in the peer's receive buffer */
  uint32_t counter;       /* the peer counts this write under this counter */
  uint32_t reserved;
} moe_transport_command_t;

/* Single producer, single consumer (the proxy). head and tail are free-running
 * counts; a slot is at index & (capacity - 1). */
typedef struct moe_transport_ring {
  uint64_t head; /* commands published by the producer */
  uint8_t pad0[56];
  uint64_t tail; /* commands consumed by the proxy */
  uint8_t pad1[56];
  uint64_t capacity; /* power of two */
  moe_transport_command_t *slots;
} moe_transport_ring_t;

/* ---- configuration and lifetime ------------------------------------------ */

typedef struct moe_transport_config {
  int rank;
  int world_size;
  /* libfabric provider, e.g. "tcp;ofi_rxm", "shm", "efa". NULL: FI_PROVIDER
   * if set, else the first of efa, verbs;ofi_rxm, tcp;ofi_rxm, shm found. */
  const char *provider;
  /* libfabric domain (e.g. "lo" for tcp on loopback); NULL: the first. */
  const char *domain;
  /* Buffers; NULL means the library allocates (page aligned, zeroed). */
  void *send_buffer;
  size_t send_bytes;
  void *recv_buffer;
  size_t recv_bytes;
  uint32_t ring_capacity; /* commands; power of two up to 2^20; 0: 1024 */
  /* Wait timeout used where a call passes a negative one. 0: 30000 ms. */
  int timeout_ms;
  /* How long a silent peer is tolerated before it is declared lost; proxies
   * send heartbeats well within it. 0: 10000 ms. */
  int peer_timeout_ms;
} moe_transport_config_t;

typedef struct moe_transport moe_transport_t;

/* What a rank tells its peers: endpoint address and receive-buffer key. */
typedef struct moe_transport_peer_info {
  uint32_t rank;
  uint32_t address_length;
  uint64_t recv_base; /* remote address of offset 0 (0 unless virtual) */
  uint64_t recv_key;
  uint64_t recv_bytes;
  uint64_t control_base; /* the library's own region (all-to-all counts) */
  uint64_t control_key;
  uint64_t host_id; /* same host_id: pid tells whether the process lives */
  uint32_t pid;
  uint32_t reserved;
  uint8_t address[MOE_TRANSPORT_MAX_ADDRESS];
} moe_transport_peer_info_t;

void moe_transport_config_init(moe_transport_config_t *config);

/* Opens fabric, domain, endpoint, AV and CQ and registers the buffers. */
moe_transport_status_t moe_transport_open(const moe_transport_config_t *config,
                                          moe_transport_t **out);
/* Stops the proxy and releases everything; safe on NULL, after errors and on
 * a handle already closed (a second close does nothing; an address reused by
 * a later open is that open's handle, so close each handle once). */
void moe_transport_close(moe_transport_t *transport);

/* Either exchange addresses through rank 0 at host:port (rank 0 listens, or
 * uses listen_fd if >= 0, see moe_transport_bootstrap_listen)... */
moe_transport_status_t moe_transport_bootstrap(moe_transport_t *transport,
                                               const char *host, int port,
                                               int listen_fd);
/* ...or hand in every rank's info (indexed by rank) gathered some other way. */
moe_transport_status_t moe_transport_local_info(moe_transport_t *transport,
                                                moe_transport_peer_info_t *out);
moe_transport_status_t
moe_transport_connect(moe_transport_t *transport,
                      const moe_transport_peer_info_t *peers);

/* Binds and listens on host:port (port 0: any) for rank 0's bootstrap, so a
 * launcher can learn the port before starting the ranks. */
moe_transport_status_t moe_transport_bootstrap_listen(const char *host,
                                                      int port, int *listen_fd,
                                                      int *bound_port);

/* ---- queries ----------------------------------------------------------- */

int moe_transport_rank(const moe_transport_t *transport);
int moe_transport_world_size(const moe_transport_t *transport);
const char *moe_transport_provider(const moe_transport_t *transport);
/* The libfabric domain the endpoint was opened in (e.g. "lo"). */
const char *moe_transport_domain(const moe_transport_t *transport);
/* Whether the provider offers FI_HMEM (device memory registration). */
int moe_transport_hmem_supported(const moe_transport_t *transport);
void *moe_transport_send_buffer(moe_transport_t *transport);
void *moe_transport_recv_buffer(moe_transport_t *transport);
moe_transport_ring_t *moe_transport_command_ring(moe_transport_t *transport);

/* ---- producer side: post commands and wait on counters --------------------
 * Only one thread may post. Commands are checked (peer, bounds, counter,
 * ring space) before they enter the ring. A negative timeout_ms means the
 * config's timeout_ms. */

/* Posts one command; waits up to timeout_ms for ring space (0: no wait).
 * Counters 0 and 1 belong to the all-to-all: raw commands use the others. */
moe_transport_status_t
moe_transport_post(moe_transport_t *transport,
                   const moe_transport_command_t *command, int timeout_ms);
/* Convenience for a WRITE command. */
moe_transport_status_t moe_transport_write(moe_transport_t *transport, int peer,
                                           uint64_t src_offset, uint64_t length,
                                           uint64_t remote_offset,
                                           uint32_t counter, int timeout_ms);
/* Writes from peer counted under counter since connect. */
uint64_t moe_transport_arrivals(moe_transport_t *transport, int peer,
                                uint32_t counter);
/* Waits until arrivals(peer, counter) >= target. */
moe_transport_status_t moe_transport_wait_arrivals(moe_transport_t *transport,
                                                   int peer, uint32_t counter,
                                                   uint64_t target,
                                                   int timeout_ms);
/* Waits until every command posted so far completed locally (send buffer
 * may be reused). */
moe_transport_status_t moe_transport_flush(moe_transport_t *transport,
                                           int timeout_ms);
/* Zero-length write to every peer, then waits for every peer's. */
moe_transport_status_t moe_transport_barrier(moe_transport_t *transport,
                                             int timeout_ms);

/* ---- all-to-all with a size per peer (MoE dispatch) -----------------------
 * Step 1 sends each peer this rank's row of byte counts; step 2 writes
 * send_bytes[p] bytes at send_offsets[p] of the send buffer to peer p, packed
 * by source rank at the start of p's receive buffer. On return
 * recv_offsets[q] / recv_bytes[q] say where rank q's bytes landed here, and
 * the send buffer may be reused. Collective: every rank calls it. */
moe_transport_status_t moe_transport_alltoallv(moe_transport_t *transport,
                                               const uint64_t *send_offsets,
                                               const uint64_t *send_bytes,
                                               uint64_t *recv_offsets,
                                               uint64_t *recv_bytes,
                                               int timeout_ms);

/* ---- errors -------------------------------------------------------------- */

/* Message of the last failed call on this thread ("" if none). */
const char *moe_transport_last_error(void);
const char *moe_transport_status_name(moe_transport_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* MOE_TRANSPORT_H */
