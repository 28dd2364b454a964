"""Starting an expert-parallel layer's ranks (runtime/moe_ep.h) from Python.

Every rank calls the layer's init with the same rank 0 address; rank 0
listens there. Where that address comes from:

  * a torch.distributed process group (`ep_group=group`): rank 0 of the
    group binds a free port and shares its address over the group, so no
    port is picked by hand;
  * the environment torchrun sets (`ep_group="env"`): RANK, WORLD_SIZE and
    MASTER_ADDR; the port is MOE_EP_PORT, else MASTER_PORT + 1 (torchrun's
    own store holds MASTER_PORT). This path needs no torch.

Ranks on one host talk over libfabric's shm provider unless FI_PROVIDER
says otherwise; across hosts the transport picks efa, verbs or tcp.
"""
import ctypes
import os
import socket

from .layer import LayerError


class EpConfig(ctypes.Structure):
    """moe_ep_config_t."""
    _fields_ = [("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("bootstrap_host", ctypes.c_char_p),
                ("bootstrap_port", ctypes.c_int32),
                ("listen_fd", ctypes.c_int32),
                ("max_tokens", ctypes.c_int64),
                ("provider", ctypes.c_char_p), ("domain", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int32), ("proxy", ctypes.c_int32)]


class Rendezvous:
    """Where this rank stands: rank, world size, rank 0's address, and for
    rank 0 the socket it listens on (handed to init, which closes it)."""

    def __init__(self, rank, world_size, host, port, listen_fd, same_host):
        self.rank, self.world_size = rank, world_size
        self.host, self.port, self.listen_fd = host, port, listen_fd
        self.same_host = same_host

    def close(self):
        """Closes rank 0's listening socket where init never took it."""
        if self.listen_fd >= 0:
            os.close(self.listen_fd)
            self.listen_fd = -1

    def config(self, max_tokens, timeout_ms=0, proxy=False):
        provider = None
        if self.same_host and not os.environ.get("FI_PROVIDER"):
            provider = b"shm"
        self._host = self.host.encode()  # kept alive for the call
        return EpConfig(rank=self.rank, world_size=self.world_size,
                        bootstrap_host=self._host,
                        bootstrap_port=self.port,
                        listen_fd=self.listen_fd if self.rank == 0 else -1,
                        max_tokens=max_tokens, provider=provider, domain=None,
                        timeout_ms=timeout_ms, proxy=int(bool(proxy)))


def _listen(host):
    """A socket listening on `host` at a port the system picks: (fd, port)."""
    try:
        sock = socket.create_server((host, 0), backlog=256)
    except OSError as e:
        raise LayerError(f"expert parallel: rank 0 cannot listen on {host}: "
                         f"{e}") from None
    port = sock.getsockname()[1]
    return sock.detach(), port


def _env_int(name):
    value = os.environ.get(name)
    if value is None:
        raise LayerError(f"expert parallel from the environment: {name} is "
                         f"not set (torchrun sets RANK, WORLD_SIZE, "
                         f"MASTER_ADDR and MASTER_PORT)")
    try:
        return int(value)
    except ValueError:
        raise LayerError(f"expert parallel from the environment: {name}="
                         f"{value!r} is not an integer") from None


def from_environment():
    """torchrun's conventions, without torch."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if not 0 <= rank < world:
        raise LayerError(f"expert parallel from the environment: RANK {rank}"
                         f" is not in [0, WORLD_SIZE {world})")
    host = os.environ.get("MASTER_ADDR")
    if not host:
        raise LayerError("expert parallel from the environment: MASTER_ADDR "
                         "is not set")
    if os.environ.get("MOE_EP_PORT"):
        port = _env_int("MOE_EP_PORT")
    else:
        port = _env_int("MASTER_PORT") + 1
    if not 0 < port < 65536:
        raise LayerError(f"expert parallel from the environment: port {port}"
                         f" is not a TCP port")
    local = host in ("localhost", "127.0.0.1", "::1") or \
        os.environ.get("LOCAL_WORLD_SIZE") == str(world)
    # Rank 0 of the transport binds host:port itself (listen_fd -1).
    return Rendezvous(rank, world, host, port, -1, local)


def _default_host():
    """An address of this host the other ranks can reach: the one its
    route to MASTER_ADDR leaves from, else its name's."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, 9))  # no packet is sent
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def from_process_group(group):
    """Rank 0 of `group` listens on a free port; its address goes to every
    rank over the group (any backend: broadcast_object_list)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise LayerError("expert parallel: torch.distributed is not "
                         "initialized (call init_process_group first)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    names = [None] * world
    dist.all_gather_object(names, socket.gethostname(), group=group)
    same_host = all(n == names[0] for n in names)
    listen_fd, address = -1, [None, None]
    if rank == 0:
        # A failure here reaches every rank, which would wait otherwise.
        try:
            host = "127.0.0.1" if same_host else _default_host()
            listen_fd, port = _listen("127.0.0.1" if same_host else "0.0.0.0")
            address = [host, port]
        except LayerError as e:
            address = [None, str(e)]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    try:
        dist.broadcast_object_list(address, src=src, group=group)
    except Exception:
        if listen_fd >= 0:
            os.close(listen_fd)
        raise
    if address[0] is None:
        raise LayerError(address[1] if rank == 0 else
                         f"expert parallel: rank 0 could not start the group:"
                         f" {address[1]}")
    return Rendezvous(rank, world, address[0], address[1], listen_fd,
                      same_host)


def rendezvous(ep_group):
    """A Rendezvous for `ep_group`: a torch.distributed group, or "env"."""
    if isinstance(ep_group, str):
        if ep_group != "env":
            raise LayerError(f"ep_group={ep_group!r}: give a torch.distributed"
                             f" process group or \"env\"")
        return from_environment()
    return from_process_group(ep_group)
