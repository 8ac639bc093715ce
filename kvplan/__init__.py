"""kvplan: a KV-cache capacity planner for LLM serving.

From Python: `kvplan.estimate`, `kvplan.solve`, `kvplan.compare`, `kvplan.check_log`, `kvplan.simulate`
(kvplan/api.py),
with the CLI's flag names and units. They load on first use, so `import kvplan` stays cheap.

The package is a pipeline of stages. A module may import modules of its own stage and of the
stages listed before it, never of a stage listed after it, and no import circle may form
(tests/test_architecture.py reads this table and checks every import, those inside functions
and under TYPE_CHECKING too). Each package's __init__ says what it owns.

    stage      modules (a name covers its submodules)
    base       kvplan.errors kvplan.limits kvplan.units kvplan.formats kvplan.userdata kvplan.model_specs
    specs      kvplan.specs
    model      kvplan.model
    calibrate  kvplan.calibrate kvplan.kernels
    request    kvplan.request
    engines    kvplan.engines
    speed      kvplan.speed
    plan       kvplan.plan
    simulator  kvplan.simulator
    search     kvplan.search
    logs       kvplan.logs
    commands   kvplan.commands
    render     kvplan.render
    api        kvplan kvplan.api
    cli        kvplan.cli kvplan.__main__
"""

import os as _os
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
