"""A small data-parallel training job timed by guardctl's probe (numpy, no GPU, no torch).

Every step each rank computes its gradient on its own batch, then all ranks average their
gradients (an all-reduce through rank 0 over TCP: what NCCL or gloo do in a real job) before the
update. The all-reduce waits for the slowest rank, so every rank's step time is the same and a
slow rank shows only in its own compute time: what guardctl's analyzer compares across ranks.

    srun python3 train.py --seconds 120 [--slow-node node3 --slow-factor 3]

``--slow-node`` makes this program's ranks on that node compute that many times longer: a
stand-in for a grey GPU, in the user's own program. Rank and world come from Slurm
(SLURM_PROCID, SLURM_NTASKS); the rendezvous from MASTER_ADDR and MASTER_PORT; the store from
GUARDCTL_STORE.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import time

import numpy as np

from guardctl import identity, probe

DIM = 64


def connect(rank: int, world: int, addr: str, port: int) -> list[socket.socket]:
    """Rank 0: a socket to each other rank, in rank order; another rank: one to rank 0."""
    if rank == 0:
        server = socket.create_server((addr, port), reuse_port=False)
        peers: dict[int, socket.socket] = {}
        while len(peers) < world - 1:
            conn, _ = server.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            (other,) = struct.unpack("!i", recv_exact(conn, 4))
            peers[other] = conn
        server.close()
        return [peers[r] for r in sorted(peers)]
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(struct.pack("!i", rank))
    return [conn]


def recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("a rank went away")
        data += chunk
    return data


def allreduce_mean(
    grad: np.ndarray, rank: int, links: list[socket.socket], stop: bool
) -> tuple[np.ndarray, bool]:
    """The mean of every rank's *grad*, and rank 0's *stop* (so that all ranks stop at the same
    step); returns when all ranks have sent theirs."""
    size = grad.nbytes
    if rank == 0:
        total = grad.copy()
        for conn in links:
            total += np.frombuffer(recv_exact(conn, size), dtype=grad.dtype)
        total /= len(links) + 1
        reply = np.append(total, 1.0 if stop else 0.0).tobytes()
        for conn in links:
            conn.sendall(reply)
        return total, stop
    links[0].sendall(grad.tobytes())
    got = np.frombuffer(recv_exact(links[0], size + grad.itemsize), dtype=grad.dtype)
    return got[:-1].copy(), bool(got[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to train")
    parser.add_argument("--compute-ms", type=float, default=50.0, help="one step's compute")
    parser.add_argument("--slow-node", default="", help="this node's ranks compute slower")
    parser.add_argument("--slow-factor", type=float, default=3.0)
    args = parser.parse_args()

    who = identity.from_env()
    slow = who.node == args.slow_node
    links = connect(
        who.rank,
        who.world,
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ.get("MASTER_PORT", "29500")),
    )
    rng = np.random.default_rng(who.rank)
    target = np.linspace(-1.0, 1.0, DIM)
    weights = np.zeros(DIM)
    compute_s = args.compute_ms / 1000.0 * (args.slow_factor if slow else 1.0)
    end = time.monotonic() + args.seconds  # rank 0's clock decides when all stop
    step, stop = 0, False
    while not stop:
        with probe.step(samples=32):
            batch = rng.normal(size=(32, DIM))
            grad = 2 * batch.T @ (batch @ (weights - target)) / len(batch)
            time.sleep(compute_s)  # the model's forward and backward on a real device
            probe.comm_begin()  # from here this rank waits for the others
            mean, stop = allreduce_mean(grad, who.rank, links, time.monotonic() >= end)
            weights -= 0.01 * mean
        step += 1
    probe.flush()
    print(
        f"rank {who.rank} on {who.node}: {step} steps, loss "
        f"{float(np.mean((weights - target) ** 2)):.4f}, slowed={slow}",
        flush=True,
    )


if __name__ == "__main__":
    main()
