"""The core (``gpudask/``) holds no plugin's key names: every setting, legacy key, dask-cuda
argument, plan-section key, config key and fact a built-in plugin owns is named in ``plugins/`` only.

Facts: the built-in plugins' facts sections (their names: ``nvlink``, ``infiniband``, ``rmm``,
``ucx_info``) and the names their facts had as keys of the core's before the sections
(``nvlink_peers``, ``ib_devices``, ``memory_free``, ``ucx_transports``) appear
in no string, name or data file of the core, in any case or spelling (``IBDevice``,
``_probe_nvlink``, ``probe_ucx_info``), docstrings excluded.  A moved key that is also a field
of the core's plan (``ProcessPlan.ucx_transports``: what the transport plugins compose into
``UCX_TLS``) may be named as the plan's, never read off the facts (``facts.ucx_transports``).

The keys are collected from the plugins themselves -- their ``gpudask_config_options`` and the
plans they make for every described host in ``tests/hosts`` -- so the test follows a new
plugin or a new key.  Each module of ``gpudask/`` is parsed with ``ast``; its string
constants (docstrings excluded: they may say what a plugin does) and its names (variables,
attributes, arguments, functions) are searched.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpudask"
HOSTS = sorted((ROOT / "tests" / "hosts").glob("*.json"))

# The registries of which built-ins exist and which are essential name plugins by module path
# and name, never their keys: the one place the core lists them.
REGISTRIES = {"gpudask/plugin/registration.py"}
# A built-in plugin's name that is also a word of another project, where the core uses it as
# that word: (module or "*", name) -> why that is no plugin knowledge.
NOT_PLUGIN_WORDS = {
    ("*", "tcp"): "distributed's protocol name (tcp://), which the core parses and defaults to",
    ("*", "forkserver"): "multiprocessing's start method, a core field of the plan (multiprocessing_method)",
}
# (module, fact word) -> why that text is no knowledge of a plugin's facts
NOT_PLUGIN_FACTS = {
    ("gpudask/config_files.py", "rmm"): "DASK_GPUDASK__RMM__POOL_SIZE: how a setting is spelled in the environment",
}
# a moved fact's word (as matched: no plural s) that is also a field of the core's plan -> what
# the plan's field is; it is a hit only where it is read off the facts (facts.x, facts["x"])
PLAN_FIELDS = {
    "ucx_transport": "ProcessPlan.ucx_transports / add_ucx_transport: the UCX transports the transport plugins "
                     "contribute to a process's plan, composed into UCX_TLS by the core",
}


@functools.lru_cache(maxsize=1)
def _plugin_knowledge() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(dotted keys, identifier keys, plugin names) the built-in plugins own."""
    import os

    from gpudask.bootstrap import plan_host
    from gpudask.config import CORE_OPTIONS
    from gpudask.errors import GpudaskError
    from gpudask.plugin.manager import PluginManager
    from gpudask.plugin.registration import BUILTIN_PLUGINS

    options = PluginManager.from_environment().config_options()
    core = {o.key for o in CORE_OPTIONS}
    plugin_options = [o for o in options if o.key not in core]
    core_sections = {".".join(k.split(".")[:2]) for k in core}
    dotted = {o.key for o in plugin_options} | {k for o in plugin_options for k in o.legacy}
    dotted |= {".".join(o.key.split(".")[:2]) for o in plugin_options} - core_sections  # gpudask.rmm, ...
    words = {o.dask_cuda_kwarg for o in plugin_options if o.dask_cuda_kwarg}
    # dask-cuda's worker options (--rmm-pool-size, --enable-nvlink, --disable-nvlink) as declared
    dotted |= {name for o in plugin_options if o.dask_cuda_option for name in o.dask_cuda_option.split("/")}
    sections: set[str] = set()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("UCX_", "DASK_", "GPUDASK_"))
             or k == "CUDA_VISIBLE_DEVICES"}
    try:
        for facts in HOSTS:
            for protocol in ("tcp", "ucx"):
                try:
                    host = plan_host(protocol, 2, facts_path=str(facts))
                except GpudaskError:
                    continue  # a host described without what the protocol needs (ucx-missing.json)
                for plan in host.processes():
                    dotted |= set(plan.config)  # distributed-ucxx.*, array.rechunk.method, ...
                    for owner, values in plan.sections.items():
                        sections.add(owner)
                        words |= set(values)
    finally:
        os.environ.update(saved)
    # the prefix of a plugin's legacy keys: distributed.rmm (its config_read_at_start says so too)
    dotted |= {"distributed.rmm"}
    # a section key of one plain word (gpu, allocator, libraries) is an ordinary word: only
    # compound ones (initial_pool_size, device_memory_limit) are a plugin's
    words = {w for w in words if "_" in w}
    names = {name for name, _ in BUILTIN_PLUGINS} | sections
    return frozenset(dotted), frozenset(words), frozenset(names)


def _texts(tree: ast.AST):
    """(line, text, exact) for every string constant but docstrings, and every name."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.lineno, node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name


def _pattern(words: frozenset[str], before: str, after: str) -> re.Pattern[str]:
    alternatives = "|".join(map(re.escape, sorted(words, key=len, reverse=True)))
    return re.compile(rf"(?<!{before})({alternatives})(?!{after})")


def hits(package: pathlib.Path = PACKAGE) -> list[str]:
    dotted, words, names = _plugin_knowledge()
    find_dotted = _pattern(dotted, r"[\w.-]", r"[\w-]")  # a prefix ("distributed.rmm.") counts
    find_word = _pattern(words, r"[\w-]", r"[\w-]")
    out = []
    for path in sorted(package.rglob("*.py")):
        module = str(path.relative_to(package.parent))
        if module in REGISTRIES:
            continue
        for line, text in _texts(ast.parse(path.read_text(), module)):
            found = [m.group(1) for m in find_dotted.finditer(text)] + [m.group(1) for m in find_word.finditer(text)]
            if text in names and (module, text) not in NOT_PLUGIN_WORDS and ("*", text) not in NOT_PLUGIN_WORDS:
                found.append(text)
            out += [f"{module}:{line}: {key!r}" for key in found]
    return out


def test_the_core_names_no_key_of_a_builtin_plugin():
    assert hits() == []


@functools.lru_cache(maxsize=1)
def _fact_words() -> frozenset[str]:
    """The built-in plugins' facts sections, and the names their facts had as the core's keys."""
    from gpudask.plugin.manager import PluginManager

    moved = {"nvlink_peers", "ib_devices", "memory_free", "ucx_transports"}
    sections = {section.name for _, section in PluginManager.from_environment().facts_sections()}
    return frozenset(moved | sections)


def _fact_pattern(words: frozenset[str]) -> re.Pattern[str]:
    """Any spelling: ib_devices, IBDevice, ib-device; nvlink_peers, NvLinkPeers."""
    def spelled(word: str) -> str:
        parts = [re.escape(p) for p in re.split(r"[_-]", word.removesuffix("s"))]
        return "[_-]?".join(parts)
    return re.compile("|".join(spelled(w) for w in sorted(words, key=len, reverse=True)), re.IGNORECASE)


def _facts_reads(tree: ast.AST) -> set[tuple[int, str]]:
    """(line, key) of every attribute or constant key read off an expression naming facts
    (``facts.ucx_transports``, ``ctx.facts["ucx_transports"]``, ``facts_dict.get("x")``)."""
    def on_facts(node: ast.AST) -> bool:
        return "facts" in ast.unparse(node).lower()

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and on_facts(node.value):
            out.add((node.lineno, node.attr))
        elif isinstance(node, ast.Subscript) and on_facts(node.value) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            out.add((node.lineno, node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and on_facts(node.func.value) \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.add((node.lineno, node.args[0].value))
    return out


def fact_hits(package: pathlib.Path = PACKAGE) -> list[str]:
    find = _fact_pattern(_fact_words())
    out = []
    for path in sorted(package.rglob("*.py")):
        module = str(path.relative_to(package.parent))
        if module in REGISTRIES:
            continue
        tree = ast.parse(path.read_text(), module)
        reads = _facts_reads(tree)
        for line, text in _texts(tree):
            out += [f"{module}:{line}: {m.group(0)!r}" for m in find.finditer(text)
                    if (module, m.group(0).lower()) not in NOT_PLUGIN_FACTS
                    and (m.group(0).lower() not in PLAN_FIELDS or (line, text) in reads)]
    for path in sorted(package.rglob("*.json")):
        module = str(path.relative_to(package.parent))
        # the example hosts: whole described hosts, the plugins' sections included
        if path.parent.name == "hosts":
            continue
        out += [f"{module}: {m.group(0)!r}" for m in find.finditer(path.read_text())]
    return out


def test_the_core_names_no_fact_of_a_builtin_plugin():
    assert fact_hits() == []


def test_the_fact_guard_finds_a_plugin_fact_where_the_core_would_name_one(tmp_path):
    assert {"nvlink", "infiniband", "rmm", "ucx_info", "nvlink_peers", "ib_devices", "memory_free",
            "ucx_transports"} <= _fact_words()
    (tmp_path / "gpudask").mkdir()
    (tmp_path / "gpudask" / "_guard_probe_tmp.py").write_text(
        '"""NVLink and InfiniBand in a docstring are fine."""\n'
        'class IBDevice: pass\n'
        'def _probe_nvlink(gpu): return gpu["memory_free"]\n'
        'KEY = "ib_devices"\n'
        'def probe_ucx_info(facts): return facts.ucx_transports\n'
        'def planned(plan): return plan.ucx_transports\n'
        'def load(data): return data["facts"]["ucx_transports"]\n'
        'def add_ucx_transport(plan, name): plan.ucx_transports.append(name)\n')
    (tmp_path / "gpudask" / "schema.json").write_text('{"nvlink_peers": []}')
    found = sorted(h.split(": ", 1)[1] for h in fact_hits(tmp_path / "gpudask"))
    # matched without a plural s: ib_device, nvlink_peer
    # the plan's ucx_transports is no hit; the facts' is
    assert found == sorted(["'IBDevice'", "'nvlink'", "'memory_free'", "'ib_device'", "'nvlink_peer'",
                            "'ucx_info'", "'ucx_transport'", "'ucx_transport'"]), found


def test_the_facts_model_has_no_field_of_a_builtin_plugin():
    import dataclasses

    from gpudask.facts.model import GPU, Facts

    find = _fact_pattern(_fact_words())
    fields = [f.name for cls in (Facts, GPU) for f in dataclasses.fields(cls)]
    assert [f for f in fields if find.search(f)] == []


def test_the_guard_finds_a_plugin_key_where_the_core_would_name_one(tmp_path):
    """The collected keys are the real ones: a module naming them is caught."""
    dotted, words, names = _plugin_knowledge()
    assert {"gpudask.rmm.pool-size", "distributed.rmm.pool-size", "distributed.rmm", "gpudask.spill",
            "distributed-ucxx.create-cuda-context", "--rmm-pool-size", "--disable-nvlink"} <= dotted
    assert {"initial_pool_size", "device_memory_limit", "rmm_pool_size", "context_gpu"} <= words
    assert {"cuda-context", "rmm", "spill"} <= names
    (tmp_path / "gpudask").mkdir()
    module = tmp_path / "gpudask" / "_guard_probe_tmp.py"
    module.write_text('"""gpudask.rmm.pool-size in a docstring is fine."""\n'
                      'KEY = "gpudask.rmm.pool-size"\nPREFIX = ("distributed.rmm.",)\nNAME = "cuda-context"\n'
                      'def f(initial_pool_size): return f"{initial_pool_size} of spill"\n')
    found = hits(tmp_path / "gpudask")
    # the docstring and the f-string's words are not hits; the argument and its use are
    assert sorted(h.split(": ", 1)[1] for h in found) == sorted([
        "'gpudask.rmm.pool-size'", "'distributed.rmm'", "'cuda-context'", "'initial_pool_size'",
        "'initial_pool_size'"]), found


@pytest.mark.parametrize("word", sorted({w for _, w in NOT_PLUGIN_WORDS}))
def test_every_exception_is_a_builtin_plugin_name(word):
    from gpudask.plugin.registration import BUILTIN_PLUGINS

    assert word in {name for name, _ in BUILTIN_PLUGINS}
