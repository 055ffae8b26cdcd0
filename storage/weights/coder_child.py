"""A coder process (storage/weights/coder_processes.py): codes the pieces its publisher hands out.

    python -m storage.weights.coder_child <socket path> <auth key, hex> <queue fd>

From the publisher: ("publish", jobs, link, base_version, target_version), a publish's table of
pieces, each (name, (new arena, slot), (base arena, slot), span); then the coder takes piece
numbers from the queue (4 bytes each, shared by every coder) until an END, answering each
("piece", i, encoding, checksum, changed, seconds, has payload) and the payload's bytes, or ("error",
i, why), and at the END ("done",). It keeps the arenas it mapped (the publisher reuses their
files, storage/weights/tensor_arena.py) until their files are gone, and exits when its
publisher's end closes.
"""
from __future__ import annotations

import os
import struct
import sys
from multiprocessing.connection import Client

import torch

from storage.delta import kernels
from storage.weights.coder_processes import END
from storage.weights.piece_coder import code_piece
from storage.weights.spans import flat_range
from storage.weights.tensor_arena import map_file, slot_view


def _next(queue: int) -> int:
    data = os.read(queue, 4)  # a pipe hands each 4-byte number to one reader whole
    if len(data) != 4:
        raise EOFError("the piece queue closed")
    return struct.unpack("<I", data)[0]


def serve(address: str, authkey: bytes, queue: int) -> None:
    torch.set_num_threads(1)  # one core per coder: the publisher starts as many as it has
    conn = Client(address, "AF_UNIX", authkey=authkey)
    kernels.warm_up()
    conn.send(("ready",))
    arenas: dict[str, torch.Tensor] = {}

    def tensor(path: str, slot) -> torch.Tensor:
        if path not in arenas:
            arenas[path] = map_file(path, os.stat(path).st_size)
        return slot_view(arenas[path], slot)

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the publisher is gone
        _, jobs, link, base_version, target_version = message
        for path in [p for p in arenas if not os.path.exists(p)]:
            del arenas[path]  # unlinked by the publisher: no version of it is left
        while (index := _next(queue)) != END:
            name, (new_path, new_slot), (base_path, base_slot), span = jobs[index]
            try:
                new, old = tensor(new_path, new_slot), tensor(base_path, base_slot)
                if span is not None:
                    new, old = flat_range(new, span), flat_range(old, span)
                piece = code_piece(name, new, old, link, base_version, target_version)
            except Exception as exc:  # noqa: BLE001 - the publisher codes it itself
                conn.send(("error", index, f"{type(exc).__name__}: {exc}"))
                continue
            conn.send(("piece", index, piece.encoding, piece.checksum, piece.changed,
                       piece.seconds, piece.payload is not None))
            if piece.payload is not None:
                conn.send_bytes(piece.payload)
        conn.send(("done",))


if __name__ == "__main__":
    serve(sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]))
