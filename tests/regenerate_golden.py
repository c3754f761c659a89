"""The golden recipe: write the golden plans again, then say what changed.

    python tests/regenerate_golden.py            # rewrite every golden plan, list what changed
    python tests/regenerate_golden.py --check    # write nothing, list what would change

A golden plan is ``gpudask info --facts tests/hosts/H.json --protocol P [--nworkers N] --json``
from the repository root, kept per plugin where it can be: ``tests/golden/H--P--N.json`` is the
plan without its ``plugins`` list, and each loaded plugin's entry of that list (its name,
priority, source and hooks -- the same for every host) is ``tests/golden/plugins/NAME.json``,
so a new built-in plugin or hook changes its own file (:func:`assemble` puts them together).
Each is made with the built-in plugins only: autoload off
(``GPUDASK_DISABLE_PLUGIN_AUTOLOAD=1``, so no installed third-party plugin gets into a
golden plan), no ``GPUDASK_*``, ``DASK_*``, ``UCX_*``, ``CUDA_VISIBLE_DEVICES`` exported.
What changed is listed as key paths, so a regeneration that should only add a hook to a
plugin's ``hooks`` list can be checked to change nothing else (no value, no reason).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
STRIPPED = ("GPUDASK_", "DASK_", "UCX_", "UCXPY_", "RAPIDS_")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(STRIPPED) and k not in ("CUDA_VISIBLE_DEVICES", "CUDF_SPILL")}
    env["GPUDASK_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def plan(case: str) -> Any:
    host, protocol, nworkers = case.split("--")
    args = [sys.executable, "-m", "gpudask.cli", "info", "--facts", f"tests/hosts/{host}.json", "--protocol", protocol,
            "--json"]
    if nworkers != "default":
        args += ["--nworkers", nworkers]
    out = subprocess.run(args, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


PLUGINS = GOLDEN / "plugins"


def assemble(path: pathlib.Path) -> Any:
    """A golden plan as ``gpudask info --json`` prints it: the case's file, with the plugins'
    entries (in the plan's order: priority, then name)."""
    plan = json.loads(path.read_text())
    entries = [json.loads(p.read_text()) for p in sorted(PLUGINS.glob("*.json"))]
    plugins = sorted(entries, key=lambda e: (e["priority"], e["name"]))
    return {**{k: v for k, v in plan.items() if k in ("facts", "facts_origin", "protocol", "nworkers")},
            "plugins": plugins, **{k: v for k, v in plan.items() if k not in ("facts", "facts_origin", "protocol",
                                                                                 "nworkers")}}


def split(plan: Any) -> tuple[Any, dict[str, Any]]:
    """A plan as printed -> (the case's file, {plugin: its entry})."""
    return {k: v for k, v in plan.items() if k != "plugins"}, {e["name"]: e for e in plan["plugins"]}


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Key paths where ``new`` differs from ``old`` (lists of plugins keyed by name)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{where}: added")
            elif key not in new:
                out.append(f"{where}: removed")
            else:
                out += differences(old[key], new[key], where)
        return out
    if isinstance(old, list) and isinstance(new, list) and all(isinstance(x, dict) and "name" in x for x in old + new):
        return differences({x["name"]: x for x in old}, {x["name"]: x for x in new}, path)
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {json.dumps(old)[:80]} -> {json.dumps(new)[:80]}"]


def main(check: bool) -> int:
    changed: dict[str, list[str]] = {}
    entries: dict[str, Any] = {}
    for path in sorted(GOLDEN.glob("*.json")):
        new = plan(path.stem)
        diff = differences(assemble(path), new)
        case, plugins = split(new)
        if entries and plugins != entries:
            raise SystemExit(f"{path.stem}: the loaded plugins differ between hosts: {sorted(plugins)}")
        entries = plugins
        if diff:
            changed[path.stem] = diff
            if not check:
                path.write_text(json.dumps(case, indent=1) + "\n")
    if not check:
        for old in PLUGINS.glob("*.json"):
            if old.stem not in entries:
                old.unlink()
        for name, entry in entries.items():
            (PLUGINS / f"{name}.json").write_text(json.dumps(entry, indent=1) + "\n")
    kinds: dict[str, int] = {}
    for diff in changed.values():
        for line in diff:
            kinds[line] = kinds.get(line, 0) + 1
    for line, count in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"{count:4d} file(s)  {line}")
    print(f"{len(changed)} of {len(list(GOLDEN.glob('*.json')))} golden plan(s) {'would change' if check else 'changed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
