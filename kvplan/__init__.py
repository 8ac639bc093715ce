"""kvplan: a KV-cache capacity planner for LLM serving."""

import os as _os

__version__ = "0.1.0"

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
