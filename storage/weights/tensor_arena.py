"""A version's tensors in one shared-memory file, which coder processes map by its path.

The publisher's coder processes (storage/weights/coder_processes.py) read the version being
published and its base where they are, without a copy through a pipe: both live in arenas,
files in /dev/shm (the temp directory where there is none) mapped shared by the publisher and
each coder. A tensor's slot is (offset, dtype, shape) in its arena. The trainer takes its bf16
snapshot straight into one (`TensorArena.of`), so the publisher copies nothing; tensors from
anywhere else are copied into one. Once no tensor of an arena is left in this process its file
goes back to a pool (FREE_PER_LAYOUT per layout, the rest unlinked) and the next arena of the
same layout reuses it: its memory is already backed (a fresh GB faults in at ~0.6 s on this
VM, a reused one at ~0.06) and the coders keep it mapped. Pooled and live files are unlinked
at exit; a coder unmaps a file once it is gone.

A new file's memory is reserved when it is made (posix_fallocate): a tmpfs too small for it
(a container's /dev/shm is 64 MB unless given more) would otherwise kill the process with
SIGBUS at the first write past its room. Where it does not fit, `arena_copy` says so once
in the log and gives None: its caller keeps the tensors its usual way, and the publisher,
finding no arena, codes on its threads.
"""
from __future__ import annotations

import atexit
import errno
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable

import torch

from storage.weights.arena_files import arena_dir, arena_path, sweep_dead
from storage.weights.payloads import DTYPES

log = logging.getLogger(__name__)
Slot = tuple[int, str, tuple[int, ...]]  # offset in bytes, dtype name, shape
ArenaSlots = tuple[str, dict[str, Slot]]  # an arena's path and its slots
_ALIGN = 64  # a cache line: no two slots share one
_DTYPES = {n: d for n, d in DTYPES.items() if d is not torch.bool}  # bool: held as a clone
_live: dict[int, tuple[str, dict[str, Slot]]] = {}  # mapping address -> (path, slots)
_free: dict[tuple, list[str]] = {}  # layout -> files no tensor uses, to reuse
FREE_PER_LAYOUT = 2  # a version being published and its base's: what a trainer cycles through
_lock = threading.Lock()
_said_no_room: set[str] = set()  # directories whose lack of room was logged


class ArenaSpaceError(OSError):
    """Shared memory has no room for an arena."""


class TensorArena:
    """Slots for `tensors` (their dtypes and shapes, not their values: `write` copies them)."""

    def __init__(self, tensors: dict[str, torch.Tensor], directory: str | None = None) -> None:
        self.slots, self.nbytes = layout(tensors)
        key = _key(self.slots)
        _sweep_once(directory or arena_dir())
        with _lock:
            pooled = _free.get(key)
            path = pooled.pop() if pooled else None
        self.path = path or str(arena_path(directory))
        # its file goes back to the pool once its mapping goes, with the last view of it
        base = map_file(self.path, self.nbytes, create=path is None,
                        gone=lambda address, path: _release(address, path, key))
        self.tensors = {name: slot_view(base, slot) for name, slot in self.slots.items()}
        with _lock:
            _live[base.data_ptr()] = (self.path, self.slots)

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor],
           dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """A copy of `tensors` (converted to `dtype` on the way, if given) in a new arena, in
        their order (a tensor of a dtype it does not carry: a clone): what coder processes
        read without another copy."""
        arena = cls(tensors if dtype is None else
                    {n: torch.empty(t.shape, dtype=dtype, device="meta") for n, t in tensors.items()})
        for name in arena.slots:
            arena.write(name, tensors[name])
        return {n: arena.tensors[n] if n in arena.slots else
                t.detach().to(dtype or t.dtype).clone() for n, t in tensors.items()}

    def write(self, name: str, tensor: torch.Tensor, span: tuple[int, int] | None = None) -> None:
        """Copy `tensor` (whole, or only its flattened elements [start, end)) into its slot."""
        held = self.tensors[name]
        if span is None:
            held.copy_(tensor)
        else:
            held.view(-1)[span[0]:span[1]].copy_(tensor.reshape(-1)[span[0]:span[1]])


def arena_copy(tensors: dict[str, torch.Tensor],
               dtype: torch.dtype | None = None) -> dict[str, torch.Tensor] | None:
    """`TensorArena.of(tensors, dtype)` where shared memory has room for it; else None, said
    once per directory in the log (the caller keeps the tensors its usual way; coder
    processes read only arenas, so the publisher codes on its own threads)."""
    try:
        return TensorArena.of(tensors, dtype)
    except ArenaSpaceError as e:
        with _lock:
            first = e.filename not in _said_no_room
            _said_no_room.add(e.filename)
        if first:
            log.warning("%s; the publisher codes on its own threads", e.strerror)
        return None


def arena_of(tensors: dict[str, torch.Tensor]) -> ArenaSlots | None:
    """(path, slots) of the arena `tensors` are the slots of, or None when they are not all
    in one (some copied elsewhere, another order, another set)."""
    first = next(iter(tensors.values()), None)
    if first is None or first.device.type != "cpu":
        return None
    with _lock:
        found = _live.get(first.untyped_storage().data_ptr())
    if found is None:
        return None
    path, slots = found
    base = first.untyped_storage().data_ptr()
    if not slots.keys() <= tensors.keys():
        return None
    for name, t in tensors.items():
        if name not in slots:
            if str(t.dtype).removeprefix("torch.") in _DTYPES:
                return None  # one an arena would hold, held elsewhere
            continue
        offset, dtype, shape = slots[name]
        if (t.numel() and t.data_ptr() != base + offset) or tuple(t.shape) != shape or \
                str(t.dtype).removeprefix("torch.") != dtype or not t.is_contiguous():
            return None
    return path, slots


def layout(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, Slot], int]:
    """(slot per tensor of a dtype an arena carries, bytes in all)."""
    slots, at = {}, 0
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype in _DTYPES:
            slots[name] = (at, dtype, tuple(t.shape))
            at += max(_ALIGN, -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN)
    return slots, at


def map_file(path: str, nbytes: int, create: bool = False,
             gone: Callable[[int, str], None] | None = None) -> torch.Tensor:
    """The file's bytes as a uint8 tensor over a shared mapping (created at `nbytes` with
    `create`, readable and writable by this user only); `gone(address, path)` is called once
    the mapping is unmapped (every tensor on it freed)."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            _reserve(fd, path, max(nbytes, _ALIGN))
        mapped = mmap.mmap(fd, max(nbytes, _ALIGN))
    except BaseException:
        if create:
            _unlink(path)
        raise
    finally:
        os.close(fd)
    tensor = torch.frombuffer(mapped, dtype=torch.uint8)
    if gone is not None:  # the tensor's storage holds the mmap, not the tensor object
        weakref.finalize(mapped, gone, tensor.data_ptr(), path)
    return tensor


def _reserve(fd: int, path: str, nbytes: int) -> None:
    """Size the new file at `nbytes` with its memory reserved; ArenaSpaceError (naming the
    directory, its free and the needed MiB) where it has no room."""
    directory = os.path.dirname(path)
    vfs = os.statvfs(directory)
    free = vfs.f_bavail * vfs.f_frsize
    if free >= nbytes:
        try:
            os.posix_fallocate(fd, 0, nbytes)
            return
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there: size alone
                os.ftruncate(fd, nbytes)
                return
            if e.errno != errno.ENOSPC:
                raise
    raise ArenaSpaceError(
        errno.ENOSPC, f"{directory} has {_mib(free)} MiB free, an arena of "
        f"{_mib(nbytes)} MiB does not fit (coder processes read a version and its "
        f"base from shared memory: give {directory} more room, e.g. docker run "
        f"--shm-size, or set publish.coder_processes: 0)", directory)


def _mib(nbytes: int) -> str:
    mib = nbytes / 2**20
    return f"{mib:.1f}" if mib < 10 else f"{mib:.0f}"


def slot_view(arena: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The tensor in `slot` of a mapped arena (a view)."""
    offset, dtype, shape = slot
    torch_dtype = _DTYPES[dtype]
    n = 1
    for d in shape:
        n *= d
    return arena[offset:offset + n * torch_dtype.itemsize].view(torch_dtype).view(shape)


_swept: set[str] = set()


def _sweep_once(directory: str) -> None:
    """Files left by processes that are gone, swept once per directory per process."""
    if directory not in _swept:
        _swept.add(directory)
        sweep_dead(directory)


def _key(slots: dict[str, Slot]) -> tuple:
    return tuple(slots.items())


def _release(address: int, path: str, key: tuple) -> None:
    """The mapping at `address` is gone: its file back to the pool, or unlinked."""
    with _lock:
        _live.pop(address, None)
        pooled = _free.setdefault(key, [])
        if len(pooled) < FREE_PER_LAYOUT and os.path.exists(path):
            pooled.append(path)
            return
    _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@atexit.register
def _unlink_all() -> None:  # views still alive at exit: their files must not outlive us
    with _lock:
        paths = [path for path, _ in _live.values()] + [p for ps in _free.values() for p in ps]
        _free.clear()
    for path in paths:
        _unlink(path)
