"""Which address a worker binds and which one it tells its peers, so ranks on other hosts reach it.

    bind, advertised = worker_addresses(conductor, host, advertise)

`host` is the bind address (`mstar-run worker --host`; a wildcard binds every interface),
`advertise` the address peers dial (`--advertise`). Left out, the worker advertises `host`
when it names one interface, else the address of the interface that routes to the conductor
(a UDP socket `connect()` asks the kernel for the route; no packet is sent), and binds that
same address: a worker whose conductor is on 127.0.0.1 stays on loopback, one that joins
`tcp://10.0.0.1:5555` binds and advertises its own 10.0.0.x address.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import socket
import struct
import time
from pathlib import Path

WILDCARDS = frozenset({"0.0.0.0", "*", "::", ""})
_SIOCGIFADDR = 0x8915   # Linux ioctl: an interface's IPv4 address


class NoRouteError(OSError):
    """This host has no route to the conductor's address."""


def endpoint_host(endpoint: str) -> str:
    """'10.0.0.1' of 'tcp://10.0.0.1:5555'."""
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")


def route_address(peer_host: str) -> str:
    """The local address the kernel would send from to reach `peer_host`."""
    if peer_host in WILDCARDS:
        peer_host = "127.0.0.1"   # a conductor bound to every interface is reached locally at loopback
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer_host, 9))
        except OSError as exc:
            raise NoRouteError(f"no route from this host to the conductor at {peer_host} ({exc}); "
                          f"give `--host`/`--advertise` an address of this host that it can reach") from None
        return s.getsockname()[0]


def worker_addresses(conductor: str, host: str | None, advertise: str | None) -> tuple[str, str]:
    """(bind address, advertised address) of a worker's inbox."""
    if advertise is None:
        advertise = host if host is not None and host not in WILDCARDS else route_address(endpoint_host(conductor))
    bind = advertise if host is None else ("*" if host in WILDCARDS else host)
    return bind, advertise


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds IPv4 `address` (None: none here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:   # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def pin_collectives_to(address: str) -> None:
    """Make gloo/NCCL open their sockets on the interface of `address` (they otherwise pick the
    one the machine's hostname resolves to, which in another network namespace or on a
    multi-homed host may be one the peers cannot reach). A user's own setting wins."""
    name = interface_of(address)
    if name is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)


PORT_FLOOR = 20000    # free_port looks from here up to the kernel's ephemeral range (Linux: 32768 by default)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768    # Linux's default low end


_pick = random.Random()


def free_port(host: str) -> int:
    """A port free on `host` now, for a rendezvous another process binds moments later. Not one the kernel
    hands out (bind to port 0): any process's outgoing connection may take such a port between this check and
    that bind (seen as a TP group failing to start at random); one below the ephemeral range (and ZeroMQ's
    random ports, 49152 up) is taken only by an explicit bind."""
    low, high = PORT_FLOOR, max(PORT_FLOOR + 1000, min(_ephemeral_low(), 49152))
    for _ in range(1000):
        port = _pick.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} in {low}..{high - 1}")


def probe(endpoint: str, timeout_s: float = 2.0) -> str | None:
    """Why a TCP connection to `endpoint` cannot be opened (None: it can), and after how long. Only the
    TCP handshake: the inbox's ZMTP/CURVE layer sees a connection that closes before its greeting."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    start = time.monotonic()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{exc.strerror or type(exc).__name__} after {time.monotonic() - start:.1f} s"
