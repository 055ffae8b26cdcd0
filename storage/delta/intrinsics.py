"""LLVM bit scans for the codec's numba kernels (kernels.py, probe_kernels.py)."""
from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.core.extending import intrinsic


def _bit_scan(op: str):
    """An intrinsic calling the builder's `op` ("cttz" or "ctlz") on a non-zero uint64."""
    def scan(typingctx, word):  # noqa: ARG001 (numba's intrinsic signature)
        def codegen(context, builder, signature, args):  # noqa: ARG001
            return getattr(builder, op)(args[0], ir.Constant(ir.IntType(1), 1))
        return types.uint64(types.uint64), codegen
    scan.__name__ = op
    return intrinsic(scan)


cttz = _bit_scan("cttz")  # index of the lowest set bit
ctlz = _bit_scan("ctlz")  # leading zero bits
