"""kvplan: a KV-cache capacity planner for LLM serving.

From Python: `kvplan.estimate`, `kvplan.solve`, `kvplan.compare`, `kvplan.check_log`, `kvplan.simulate`
(kvplan/api.py),
with the CLI's flag names and units. They load on first use, so `import kvplan` stays cheap.
"""

import os as _os
import sys as _sys
import types as _types
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

__version__ = "0.1.0"

__all__ = ["__version__", "check_log", "compare", "estimate", "simulate", "solve"]

if _TYPE_CHECKING:
    from kvplan.api import check_log, compare, estimate, simulate, solve


_API = ("estimate", "solve", "compare", "check_log", "simulate")


def __getattr__(name: str) -> _Any:
    if name in _API:
        from kvplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'kvplan' has no attribute {name!r}")


class _Package(_types.ModuleType):
    """kvplan.solve and kvplan.compare are also modules: importing them must not replace the functions
    (their code stays reachable as `from kvplan.solve import ...` or importlib.import_module)."""

    def __setattr__(self, name: str, value: _Any) -> None:
        if name in _API and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

# pyproject installs the top-level folders model_specs/ and kernels/ as kvplan.model_specs and
# kvplan.kernels. Imported from a source checkout instead (python -m kvplan from the repository
# root, even with a plain `pip install .` elsewhere), this package has no such subfolders: let
# it find them beside it. An installed package has them and is left alone.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "model_specs")) and _os.path.isfile(
    _os.path.join(_root, "model_specs", "__init__.py")
):
    __path__.append(_root)
del _here, _root
