"""The lab's tests (of the scripts in lab/bench/) run with the product tests' set-up: the same
environment, state directories and fixtures (tests/conftest.py, loaded under another name so
that `from conftest import base_env` here still finds it).  They are outside pytest's
testpaths: `python -m pytest -o addopts= lab/tests` runs them."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_spec = importlib.util.spec_from_file_location("gpudask_tests_conftest",
                                               pathlib.Path(__file__).parents[2] / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_product = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _product
_spec.loader.exec_module(_product)

# its hooks and fixtures (the autouse ones have private names), where pytest looks for them
globals().update({name: value for name, value in vars(_product).items() if not name.startswith("__")})
