"""Short-lived child Python processes that hand the site daemon numpy arrays.

A site daemon keeps its memory small by doing heavy one-off work (parsing its
data file with pandas, drawing exact noise with numba) in a child process
that imports what that work needs, writes its result as an ``.npz`` stream to
stdout and exits (:mod:`fedsbdt.client.dataload`, :mod:`fedsbdt.client.isolated_noise`).

Child protocol: ``python -P -c <code> ARGS...`` runs ``module.function(*ARGS)``
of the installed ``fedsbdt`` package (``-P``: nothing from the working
directory shadows it) with the request
on stdin; the function returns the exit status.  Exit 0 with the arrays on
stdout (:func:`write_arrays`); a dedicated exit status with a one-line
message on stderr for a rejected request (a user's error); anything else is
a failure of the child itself.
"""
from __future__ import annotations

import io
import subprocess
import sys
from typing import Sequence

import numpy as np

_CODE = "import sys; from {module} import {function}; sys.exit({function}(*sys.argv[1:]))"


def run_child(module: str, function: str, args: Sequence[str], stdin: bytes, *, rejected_exit: int,
              rejected: type[Exception], what: str) -> dict[str, np.ndarray]:
    """Run ``module.function(*args)`` in a child process fed ``stdin``; return the arrays it wrote to stdout.

    Exit ``rejected_exit`` raises ``rejected`` with the child's stderr (its one-line message); any other
    failure raises :class:`RuntimeError` naming ``what`` with the exit status and the last lines of stderr.
    """
    code = _CODE.format(module=module, function=function)
    proc = subprocess.run([sys.executable, "-P", "-c", code, *args], input=stdin,
                          capture_output=True, check=False)
    if proc.returncode == rejected_exit:
        raise rejected(proc.stderr.decode("utf-8", "replace").strip())
    if proc.returncode != 0 or not proc.stdout:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    with np.load(io.BytesIO(proc.stdout), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def write_arrays(**arrays: np.ndarray) -> int:
    """The child's side: write ``arrays`` as an ``.npz`` stream to stdout; returns exit status 0."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    sys.stdout.buffer.write(buf.getvalue())
    sys.stdout.buffer.flush()
    return 0
