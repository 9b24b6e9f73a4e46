"""``njit`` that imports numba at a kernel's first call, not when its module is imported.

Importing numba costs a process about 80 MB and half a second; loading the
first compiled kernel another 60 MB.  Many modules import a kernel module
only for a constant or for a code path a given process never runs (a site
daemon runs its per-round kernels in numpy, :mod:`fedsbdt.common.kernels_numpy`).
With ``from .numba_lazy import njit`` such modules stay cheap to import.

On the first call (or attribute access) of any lazy kernel of a module, every
lazy kernel of that module is replaced in the module's namespace by its real
numba dispatcher — so kernels calling each other compile exactly as with
``numba.njit`` (same options, same on-disk cache) — and the call goes on to
it.  A reference taken before that (``from m import kernel``) keeps working:
it forwards to the dispatcher.
"""
from __future__ import annotations

import sys
import threading

_lock = threading.Lock()


class LazyKernel:
    """A function to be compiled with ``numba.njit(**options)`` when first used."""

    def __init__(self, py_func, options: dict) -> None:
        self.py_func = py_func
        self.options = options
        self.dispatcher = None
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__doc__ = py_func.__doc__
        self.__module__ = py_func.__module__

    def compile_module(self):
        """Create the dispatchers of every lazy kernel in this kernel's module; returns this one's."""
        if self.dispatcher is None:
            with _lock:
                if self.dispatcher is None:
                    import numba

                    namespace = sys.modules[self.__module__].__dict__
                    for name, obj in list(namespace.items()):
                        if obj is prange:
                            namespace[name] = numba.prange
                    for name, obj in list(namespace.items()):
                        if isinstance(obj, LazyKernel) and obj.dispatcher is None:
                            obj.dispatcher = numba.njit(**obj.options)(obj.py_func)
                            namespace[name] = obj.dispatcher
        return self.dispatcher

    def __call__(self, *args, **kwargs):
        return self.compile_module()(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.compile_module(), name)


class _Prange:
    """Stands for ``numba.prange`` in a module of lazy kernels (``from .numba_lazy import njit, prange``) until
    they compile: then the module's name is bound to ``numba.prange`` itself.  Called from Python, it is
    ``range``."""

    def __call__(self, *args):
        return range(*args)


prange = _Prange()


def njit(*args, **options):
    """``numba.njit`` with the import of numba deferred to the kernel's first use (``@njit`` or ``@njit(...)``)."""
    if args and callable(args[0]) and not options:
        return LazyKernel(args[0], {})

    def wrap(func):
        return LazyKernel(func, options)

    return wrap
