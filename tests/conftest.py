"""Shared fixtures: described hosts, real subprocess clusters on loopback (the
``gpudask.testing.plugin`` pytest plugin, as a third-party plugin's tests use it), GPU detection."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import subprocess
import sys

# Every dask process the suite starts (and this one) without distributed's two sampling threads:
# the worker profiler (every 10 ms) and the GIL-contention monitor (every 1 ms) burnt about 6 % of
# a core in each idle worker, and the suite keeps two clusters alive at a time on CI's two cores.
# Nothing here measures them; a user's setting of either still wins.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False")
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__GIL__ENABLED", "False")

import distributed  # noqa: E402,F401 - its config defaults must exist before any test snapshots dask.config
import pytest  # noqa: E402

# the process-cluster fixtures (gpudask_cluster, gpudask_cluster_factory): docs/testing.md.
# Imported here too (for Cluster), so rewrite its asserts before the import does.
pytest_plugins = ["gpudask.testing.plugin"]
pytest.register_assert_rewrite("gpudask.testing.plugin")

# Under pytest-xdist each test process gets its own temporary directory, so its own gpudask
# state directory: two tests starting workers on the same described host at once must not
# claim each other's GPU slots.  Set before anything reads tempfile.gettempdir(); the dask
# processes the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    _own_tmp = pathlib.Path("/tmp") / f"gpudask-tests-{os.getuid()}-{os.environ['PYTEST_XDIST_WORKER']}"
    _own_tmp.mkdir(mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = str(_own_tmp)
    os.environ.pop("XDG_RUNTIME_DIR", None)
    tempfile.tempdir = None
    # an xdist test process is handed COLUMNS=80 / LINES=24: the width tests set their own
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

from gpudask.testing.plugin import Cluster  # noqa: E402
from gpudask.testing.processes import clean_env  # noqa: E402

# the bench's tests skip, saying this, where the gpudask-bench distribution is not installed
# (the README's test command installs it)
BENCH_MISSING = "gpudask-bench is not installed: python -m pip install -e ./contrib/gpudask-bench"
HOSTS = pathlib.Path(__file__).parent / "hosts"
_BEFORE = pytest.StashKey["set[str] | None"]()
BIN = pathlib.Path(sys.executable).parent


@functools.cache
def real_gpu_count() -> int:
    """GPUs NVML sees on this machine (0 without a driver). Never creates a CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def _checkout_files() -> set[str] | None:
    """Untracked and ignored files in the checkout (bytecode and pytest's cache aside), or
    None when this is not a git checkout."""
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "."],
                             cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {line for line in out.stdout.splitlines() if "__pycache__/" not in line and ".pytest_cache/" not in line}


def _compile_checkout() -> None:
    """Bytecode for gpudask's sources, as a pip install writes it.  The suite starts about a
    thousand dask processes that import gpudask; an editable install under
    PYTHONDONTWRITEBYTECODE=1 (this CI machine's setting) left every one of them compiling its ~80
    modules from source (1.6 ms each).  ``compileall`` skips what is up to date."""
    import compileall

    root = pathlib.Path(__file__).resolve().parents[1]
    for name in ("gpudask", "plugins", "contrib", "gpudask_forkserver.py", "gpudask_dask_cli.py"):
        path = root / name
        if path.is_dir():
            compileall.compile_dir(path, quiet=1, rx=re.compile(r"[/\\](tests|build)[/\\]"))
        elif path.is_file():
            compileall.compile_file(path, quiet=1)


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = _checkout_files()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once, in the controller, before any test starts
        _compile_checkout()


def pytest_sessionfinish(session, exitstatus):
    """Tests build, install and write under tmp_path only: anything new in the checkout fails the run."""
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    after = _checkout_files() or set()
    new = sorted(after - before)
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "tests wrote into the checkout (build under tmp_path instead):\n  " + "\n  ".join(new)
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:  # pragma: no cover
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one test process per core, at most 4 -- each test
    starts several dask processes of its own."""
    return max(1, min(4, os.cpu_count() or 1))


# A test marked ``ucx_client`` opens UCX in the test process itself (a Client or a server on a
# ucx:// address).  UCX, once initialised, stays in that process for the rest of the run (its
# context, progress thread and memory hooks): a pytest-xdist test process that had done so
# segfaulted later in pure-Python code (psutil, in another test's teardown), and xdist then lost
# the run.  So under xdist each such test runs in a fresh pytest process of its own, whose outcome
# is reported as the test's: UCX ends with it, and a crash there is that test's failure alone.
# (pytest-forked would fork instead; its 1.7.5 fails every test under pytest 9 with "EXITED with
# status 3", and its earlier releases need the retired ``py`` library.)  Without xdist (the device
# scripts run one process, -o addopts=) such tests run in place.
IN_ISOLATED_CHILD = "PYTEST_GPUDASK_ISOLATED_CHILD"  # not GPUDASK_*: the child's autouse fixture clears those
ISOLATE_UCX_CLIENTS = bool(os.environ.get("PYTEST_XDIST_WORKER")) and not os.environ.get(IN_ISOLATED_CHILD)
ISOLATED_TIMEOUT_S = 280  # below pytest-timeout's 300 s in this process, so the child's own fires first


def _ucx_initialised() -> bool:
    """Has UCX been initialised in this process (distributed-ucxx's init_once ran)?"""
    comm = sys.modules.get("distributed_ucxx.ucxx")
    return comm is not None and getattr(comm, "ucxx", None) is not None


def _report(item: pytest.Item, when: str, outcome: str, longrepr: object = None,
            duration: float = 0.0) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome,  # type: ignore[arg-type]
                             longrepr, when, duration=duration)


def _isolated_reports(item: pytest.Item) -> list[pytest.TestReport]:
    """Run ``item`` alone in a fresh pytest process; its outcome as this process's reports."""
    import tempfile
    import time
    import xml.etree.ElementTree as ET

    report = functools.partial(_report, item)
    env = {**os.environ, IN_ISOLATED_CHILD: "1"}
    with tempfile.TemporaryDirectory() as tmp:
        junit = pathlib.Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-o", "addopts=", "-o", f"timeout={ISOLATED_TIMEOUT_S}", "-p",
                "no:cacheprovider", "-q", f"--junitxml={junit}", item.nodeid]
        start = time.monotonic()
        try:
            out = subprocess.run(argv, cwd=item.config.rootpath, env=env, capture_output=True, text=True,
                                 timeout=ISOLATED_TIMEOUT_S + 15)
            output, rc = out.stdout + out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:
            output, rc = f"{e.stdout or ''}{e.stderr or ''}", None
        took = time.monotonic() - start
        cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else iter(())
        case = next(cases, None)
    where = f"run alone in a fresh pytest process (ucx_client, tests/conftest.py): exit status {rc}"
    tail = "\n".join(output.splitlines()[-80:])
    if case is None:
        return [report("setup", "failed", f"{where}, no result\n{tail}", took)]
    skipped = case.find("skipped")
    failed = [e for e in case if e.tag in ("failure", "error")]
    if failed or (rc not in (0, None) and skipped is None):  # a failure, or an exit status it does not explain
        return [report("setup", "passed"), report("call", "failed", f"{where}\n{tail}", took),
                report("teardown", "passed")]
    if skipped is not None:
        path, line, _ = item.location
        return [report("setup", "skipped", (str(path), (line or 0) + 1, skipped.get("message", "skipped")), took)]
    return [report("setup", "passed"), report("call", "passed", None, took), report("teardown", "passed")]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if not ISOLATE_UCX_CLIENTS or "ucx_client" not in item.keywords:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = _isolated_reports(item)
    # this process never set the item up, but the previous item's teardown kept the module (and
    # session) fixtures this item would share: end those the next item does not, as pytest's own
    # teardown would (else the next item's setup finds them and stops: "previous item was not torn
    # down properly")
    try:
        item.session._setupstate.teardown_exact(nextitem)
    except Exception as e:  # noqa: BLE001 - a fixture's teardown error is this item's teardown report
        failed = _report(item, "teardown", "failed", f"teardown of the fixtures before the next test: {e!r}")
        reports = [r for r in reports if r.when != "teardown"] + [failed]
    for rep in reports:
        item.ihook.pytest_runtest_logreport(report=rep)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


# The modules holding the suite's longest tests (30-80 s each on a 2-core VM), run first under
# xdist: in collection order they came late, and one test process ran them alone at the end while
# the other had finished.  Each module stays contiguous (its module fixtures are set up once).
SLOW_FIRST = ("test_workloads.py", "test_bench.py", "test_cli_stdout_over_ucx.py", "test_wheel.py", "test_probe.py",
              "test_cli_status.py", "test_scheduler_relay.py", "test_plugins_transport_cluster.py",
              "test_apply_ways_in.py", "test_checks.py", "test_contrib.py")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every test process sorts alike: xdist requires one order
        rank = {name: i for i, name in enumerate(SLOW_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: files keep their order
    if real_gpu_count():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_ucx_left_in_the_test_process(request):
    """Under xdist, a test not marked ``ucx_client`` must not leave UCX initialised in the test
    process (why: ISOLATE_UCX_CLIENTS above)."""
    before = _ucx_initialised()
    yield
    if ISOLATE_UCX_CLIENTS and not before and _ucx_initialised():
        pytest.fail("this test initialised UCX in the pytest process (a Client or server on ucx://): "
                    "mark it @pytest.mark.ucx_client, so that it runs in a fresh pytest process of its own",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _clean_gpudask_env(monkeypatch, tmp_path):
    """Tests start from the user's view: no gpudask bookkeeping from a parent, no cached facts
    or plan inputs."""
    for name in list(os.environ):
        if name.startswith("GPUDASK_") or name.startswith("DASK_GPUDASK__"):
            monkeypatch.delenv(name)
    # hermetic: third-party plugins installed beside gpudask do not load (a test that installs
    # one loads it by name, GPUDASK_LOAD_PLUGINS: third_party_plugin below); carried to the
    # processes the tests start (gpudask.testing.processes.clean_env keeps it)
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.chdir(tmp_path)  # no stray gpudask.toml
    import copy

    import dask.config

    from gpudask import bootstrap, facts

    saved_config, saved_defaults = copy.deepcopy(dask.config.config), copy.deepcopy(dask.config.defaults)
    facts.clear_cache()
    bootstrap.reset()
    yield
    facts.clear_cache()
    bootstrap.reset()
    # planning registers plugin defaults and applies plans: each test starts from the same config
    dask.config.config.clear()
    dask.config.config.update(saved_config)
    dask.config.defaults[:] = saved_defaults


@pytest.fixture
def own_state_dir(tmp_path, monkeypatch) -> pathlib.Path:
    """A gpudask state directory of this test alone (what it remembers, e.g. validated data,
    is not another test's): the path it will have."""
    import tempfile

    from gpudask.facts import statedir

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return statedir.location()


def host(name: str) -> str:
    return str(HOSTS / name)


def described(tmp_path: pathlib.Path, base: str, **changes) -> str:
    """A described host derived from one in tests/hosts (a new file each time: facts are cached by path)."""
    data = json.loads((HOSTS / base).read_text())
    data.update(changes)
    path = tmp_path / f"host-{len(list(tmp_path.glob('host-*.json')))}.json"
    path.write_text(json.dumps(data))
    return str(path)


def sections_with(base: str, **changed: object) -> dict:
    """The plugins' facts sections of tests/hosts/<base>, some of them replaced (a described
    host's ``sections`` for ``described(..., sections=...)``)."""
    return {**json.loads((HOSTS / base).read_text())["sections"], **changed}


def plan_on(facts: str, protocol: str, nworkers: int | None = None, **config):
    """``gpudask info`` in-process: the host plan for a facts file, with dask config set."""
    import dask.config

    from gpudask.apply.process import plan_host

    with dask.config.set(config):
        return plan_host(protocol, nworkers, facts_path=facts)



def third_party_plugin(tmp_path: pathlib.Path, body: str, name: str = "bad") -> dict[str, str]:
    """An installed third-party plugin: a module and its entry point on PYTHONPATH (the
    environment to pass to the processes that should load it)."""
    import textwrap

    site = tmp_path / "site"
    info = site / f"{name}plug-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}plug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[gpudask]\n{name} = {name}plug\n")
    (site / f"{name}plug.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "GPUDASK_LOAD_PLUGINS": name}

def tracebacks_but_ucx_registration_close(log: str) -> list[str]:
    """The tracebacks in a process log, less one distributed-ucxx race that is not gpudask's.

    A nanny writes ``{"status": "ok"}`` at the end of ``register_nanny`` and closes the comm at
    once; over UCX the close can cancel the scheduler's pending receive, and the scheduler's
    ``add_nanny`` logs ``CommClosedError`` with a traceback although the nanny registered (seen
    once in CI, 2026-12-02).  Every other traceback is returned, whole.
    """
    blocks, current = [], None
    for line in log.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            current = [line] if current is None else current + [line]  # chained ("direct cause")
        elif current is not None and (line.startswith((" ", "\t")) or not line.strip()
                                      or line.startswith(("The above exception", "During handling"))
                                      or re.match(r"^[A-Za-z_][\w.]*(: |$)", line)):
            current.append(line)
        elif current is not None:
            blocks.append("\n".join(current))
            current = None
    if current is not None:
        blocks.append("\n".join(current))
    race = ("in add_nanny", "CommClosedError: Connection closed by writer", "UCXXCanceledError: Request canceled")
    return [b for b in blocks if not all(mark in b for mark in race)]


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a process under test: this one's without gpudask's bookkeeping
    and settings (:func:`gpudask.testing.processes.clean_env`), then ``extra``."""
    return clean_env(**extra)


@pytest.fixture
def cluster(gpudask_cluster: Cluster) -> Cluster:
    """Real `dask scheduler` / `dask worker` processes on 127.0.0.1, logs and scheduler file
    in ``tmp_path``, the tests' environment (:func:`base_env` at start time) unless a test
    gives its own; stopped after the test (``gpudask_cluster`` of gpudask.testing.plugin;
    ``GPUDASK_TEST_LOGS=DIR`` keeps every log)."""
    return gpudask_cluster
