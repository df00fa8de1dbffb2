"""The real ``pynvml`` over the simulated C library.

``bindings_over(lib)`` executes the installed nvidia-ml-py's ``pynvml.py`` again as a private
module (its own function-pointer cache, reference count and error classes) and sets its
``nvmlLib`` — the ``CDLL("libnvidia-ml.so.1")`` it would load — to ``lib``. Every argument list,
struct layout, version suffix and error class is then nvidia-ml-py's own, for whichever version is
installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from types import ModuleType
from typing import Any

_serial = itertools.count()


def bindings_over(library: Any) -> ModuleType:
    import pynvml

    name = f"_gpud_sim_pynvml_{next(_serial)}"
    spec = importlib.util.spec_from_file_location(name, pynvml.__file__)
    if spec is None or spec.loader is None:  # pragma: no cover - the installed module is a plain file
        raise ImportError(f"cannot load {pynvml.__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml builds its NVMLError_* classes through sys.modules[__name__]
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    setattr(module, "nvmlLib", library)  # noqa: B010 - _LoadNvmlLibrary() leaves a loaded library alone
    return module
