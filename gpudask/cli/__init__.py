"""``gpudask`` command line (also ``dask gpudask ...`` through dask's ``dask_cli`` entry point)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpudask.errors import ConfigError, GpudaskError


class _CleanErrors(click.Group):
    """GpudaskError -> one line on stderr and exit 2; never a traceback.  Besides its own, the
    commands that other distributions add through the ``gpudask.commands`` entry point group."""

    def get_command(self, ctx: click.Context, name: str) -> Any:
        command = super().get_command(ctx, name)
        ep = _entry_point_commands().get(name) if command is None else None
        if ep is not None:
            try:
                command = ep.load()
            except Exception as e:  # noqa: BLE001 - `gpudask --help` lists the others; running it says why
                dist = getattr(ep.dist, "name", None) or "its distribution"
                _LOAD_ERRORS[name] = (f"`gpudask {name}` ({ep.value}, from {dist}) cannot be loaded: "
                                      f"{type(e).__name__}: {e}; reinstall {dist}")
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_entry_point_commands()))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        # click's own answer to an unknown command is its usage text and an error line; a
        # command that comes with another distribution gets the line that says how to get it
        if args and not ctx.resilient_parsing and not args[0].startswith("-") \
                and self.get_command(ctx, args[0]) is None:
            raise GpudaskError(_unknown_command(ctx, args[0]))
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        _printable_output()
        try:
            return super().invoke(ctx)
        except GpudaskError as e:
            from gpudask.printable import printable

            click.echo(f"gpudask: error: {printable(e)}", err=True)  # one line, whatever the text holds
            sys.exit(2)


# Commands that other distributions of this project add: name -> (distribution, where it is
# in gpudask's source tree)
OPTIONAL_COMMANDS = {"bench": ("gpudask-bench", "./contrib/gpudask-bench")}
_LOAD_ERRORS: dict[str, str] = {}  # entry point commands that failed to load: name -> why


def _entry_point_commands() -> dict[str, Any]:
    import importlib.metadata

    return {ep.name: ep for ep in importlib.metadata.entry_points(group="gpudask.commands")}


def _unknown_command(ctx: click.Context, name: str) -> str:
    if name in _LOAD_ERRORS:
        return _LOAD_ERRORS[name]
    if name in OPTIONAL_COMMANDS:
        dist, source = OPTIONAL_COMMANDS[name]
        return (f"`gpudask {name}` comes with the {dist} distribution, which is not installed: "
                f"python -m pip install {source} (in gpudask's source tree)")
    return f"no command {name!r}; accepted: {', '.join(main.list_commands(ctx))}"


def _printable_output() -> None:
    """A character the terminal's encoding cannot show (LANG=C) is escaped, not a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError, TypeError):  # not a text stream we can change: leave it
                pass


# help follows the terminal (or COLUMNS) up to 100 columns; click's own limit is 80
@click.group(cls=_CleanErrors, name="gpudask", context_settings={"max_content_width": 100})
@click.version_option(package_name="gpudask")
def main() -> None:
    """gpudask: stock dask scheduler/worker, set up for GPUs by plugins."""


@main.command()
@click.option("--facts", "facts", type=click.Path(dir_okay=False),
              help="Describe the host with a facts file (schema 2) instead of probing it.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="A gpudask.toml (or dask YAML) file merged over the config in effect.")
@click.option("--protocol", default="tcp", show_default=True, help="tcp, ucx or ucxx.")
@click.option("--nworkers", type=click.IntRange(min=1), default=None,
              help="Workers on this host (default: one per visible GPU, at least 1).")
@click.option("--interface", default=None,
              help="The --interface you will give `dask worker` (it wins over the detected one).")
@click.option("--reasons", "-v", "reasons", is_flag=True,
              help="Every process's settings and every decision with its reason (default: a summary).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
def info(facts: str | None, config_file: str | None, protocol: str, nworkers: int | None, interface: str | None,
         reasons: bool, as_json: bool) -> None:
    """Print what gpudask would do on this host (or the described one), starting nothing: a summary;
    --reasons for every decision and why, --json for the whole plan."""
    from gpudask.bootstrap import plan_host
    from gpudask.plan import check_protocol

    check_protocol(protocol)
    if "," in protocol:
        # `dask scheduler --protocol tcp,ws` listens on several; a worker connects through one
        raise ConfigError(f"--protocol {protocol!r}: gpudask info plans for the one protocol the workers connect "
                          "through; accepted: one of them (e.g. --protocol ucx)")
    host = plan_host(protocol, nworkers, facts_path=facts, config_file=config_file, user_interface=interface)
    if as_json:
        click.echo(json.dumps(host.to_dict(), indent=1))
    else:
        from gpudask.cli.report import plan_summary, plan_table

        click.echo((plan_table if reasons else plan_summary)(host, interface))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The plugins as JSON: name, priority, source, distribution, hooks.")
def plugins(as_json: bool) -> None:
    """List the plugins in effect: name, priority, source, hooks."""
    from gpudask import bootstrap

    broken: list[Any] = []
    loaded = [p.to_dict() for p in bootstrap.plugins(broken).plugins]
    # a plugin that cannot be imported is listed as broken, with its error; exit 1 then
    loaded += [{"name": e.plugin, "priority": None, "source": "broken", "distribution": e.distribution,
                "hooks": [], "error": str(e)} for e in broken]
    if as_json:
        click.echo(json.dumps(loaded, indent=1))
    else:
        from gpudask.cli.report import table

        rows = [[p["name"], "-" if p["priority"] is None else p["priority"],
                 p["source"] + (f" ({p['distribution']})" if p["source"] != "builtin" else ""),
                 p.get("error") or ", ".join(h.removeprefix("gpudask_") for h in p["hooks"])] for p in loaded]
        click.echo(table(["plugin", "priority", "source", "hooks"], rows))
    if broken:
        sys.exit(1)


@main.command("config")
@click.option("--json", "as_json", is_flag=True, help="Every setting as JSON: key, value, source, default, doc.")
@click.argument("extra", nargs=-1, metavar="")
def config_cmd(as_json: bool, extra: tuple[str, ...]) -> None:
    """List every gpudask setting with its value in effect and where it comes from."""
    from gpudask import bootstrap

    if extra:  # `dask cuda config SCHEDULER`'s habit: that job is gpudask check's
        raise GpudaskError(f"gpudask config takes no argument ({extra[0]!r}): it lists this process's settings; "
                           f"to compare a running cluster's scheduler, workers and client, run: gpudask check "
                           f"{extra[0]}")

    settings = bootstrap.inputs().settings
    rows = [{"key": opt.key, "value": s.value, "given": s.given, "source": s.source, "default": opt.default,
             "doc": opt.doc} for opt in settings.options.values() for s in [settings.get(opt.key)]]
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    from gpudask.cli.report import table

    click.echo(table(["key", "value", "source"], [[r["key"], _as_given(r["value"], r["given"]), r["source"]]
                                                  for r in rows]))
    for warning in settings.unknown_keys():
        click.echo(f"warning: {warning}", err=True)


def _as_given(value: Any, given: Any) -> str:
    """A setting's value as written, and what gpudask made of it when that differs: ``40GiB (42949672960)``."""
    shown = json.dumps(value, default=str)
    if given is None:
        return shown
    spelled = given if isinstance(given, str) else json.dumps(given, default=str)
    return spelled if spelled == shown else f"{spelled} ({shown})"


@main.command()
@click.option("--nworkers", type=click.IntRange(min=1), default=None,
              help="Workers (default: one per GPU, 2 without a GPU).")
@click.option("--protocol", default="tcp", show_default=True,
              help="The cluster's protocol: tcp, ucx or ucxx (UCX needs distributed-ucxx).")
@click.option("--json", "as_json", is_flag=True,
              help="The demo's report as JSON instead of its lines and table.")
@click.option("--keep", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Seconds the cluster stays up after the computation (to look at its pages).")
def demo(nworkers: int | None, protocol: str, as_json: bool, keep: float) -> None:
    """Start a local cluster of stock workers with gpudask preloaded, compute, report."""
    from gpudask.cli.demo import run_demo

    report = run_demo(nworkers=nworkers, protocol=protocol, echo=None if as_json else click.echo, keep=keep)
    if as_json:
        click.echo(json.dumps(report, indent=1, default=str))


def scheduler_options(command: Any) -> Any:
    """The scheduler, for every command that needs one: ADDRESS, --address ADDRESS or --scheduler-file FILE."""
    command = click.option("--scheduler-file", default=None, type=click.Path(dir_okay=False),
                           help="A dask scheduler file (what `dask scheduler --scheduler-file` wrote).")(command)
    command = click.option("--address", "address_option", default=None, metavar="ADDRESS",
                           help="The scheduler's address (the same as the ADDRESS argument).")(command)
    return click.argument("address", required=False)(command)


@main.command()
@scheduler_options
@click.option("--json", "as_json", is_flag=True,
              help="The findings as JSON (with --probe: the paths) instead of the table.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the scheduler.")
@click.option("--probe", is_flag=True,
              help="Send a small array (CuPy with GPU workers) through every path: client -> worker, worker -> "
                   "worker, worker -> client via the scheduler and direct; one line per path (exit 1 on a failure).")
@click.option("--path-timeout", default=10.0, show_default=True, help="With --probe: seconds for each path.")
@click.option("--payload", default="64MiB", show_default=True, metavar="SIZE",
              help="With --probe: the array moved on each path (a rate is judged from 64MiB up).")
@click.option("--workers", default=None, metavar="SOURCE[,DESTINATION]",
              help="With --probe: the workers to probe (default: the first two by address).")
def check(address: str | None, address_option: str | None, scheduler_file: str | None, as_json: bool,
          timeout: float, probe: bool, path_timeout: float, workers: str | None, payload: str) -> None:
    """Compare the scheduler, its workers and this client (exit 1 on an error finding);
    --probe: move data through every path instead.  The scheduler: ADDRESS, --address ADDRESS
    or --scheduler-file FILE."""
    from gpudask.checks.client import format_report, run_check
    from gpudask.cli.connect import check_timeout, deadline, open_client, target
    from gpudask.cli.report import table

    if workers is not None and not probe:
        raise GpudaskError("--workers goes with --probe")
    address = target(address, address_option, scheduler_file, timeout)
    if probe:
        chosen = _probe_workers(workers)
        check_timeout(path_timeout, "--path-timeout")
        nbytes = _payload(payload)
    client = open_client(address, timeout)
    if probe:
        from gpudask.checks.probe import format_probe, run_probe

        try:
            result = run_probe(client, path_timeout, chosen, nbytes)
        finally:
            client.close(timeout=path_timeout)
        click.echo(json.dumps(result, indent=1, default=str) if as_json else format_probe(result))
        sys.exit(0 if result["status"] in ("ok", "slow") else 1)  # slow: a warning, like the check's
    try:
        with deadline(timeout, address):
            report = run_check(client)
    finally:
        client.close()
    click.echo(json.dumps(report, indent=1, default=str) if as_json else format_report(report, table))
    sys.exit(1 if report["status"] == "error" else 0)


def _payload(value: str) -> int:
    """``--payload``: 8 bytes to 4 GiB."""
    from dask.utils import parse_bytes

    try:
        nbytes = int(parse_bytes(value))
    except (ValueError, TypeError, OverflowError):
        nbytes = -1
    if not 8 <= nbytes <= 4 * 2**30:
        raise GpudaskError(f"--payload {value}: accepted: a size from 8 bytes to 4GiB, e.g. 64MiB")
    return nbytes


def _probe_workers(value: str | None) -> list[str] | None:
    """``--workers SOURCE,DESTINATION`` of ``--probe``."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not 1 <= len(items) <= 2:
        raise GpudaskError(f"--workers {value!r}: accepted: SOURCE or SOURCE,DESTINATION (worker addresses)")
    return items


@main.command()
@scheduler_options
@click.option("--json", "as_json", is_flag=True, help="Every worker's planned and actual state as JSON.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the scheduler.")
def status(address: str | None, address_option: str | None, scheduler_file: str | None, as_json: bool,
           timeout: float) -> None:
    """The running cluster, one row per worker: GPU, transports, pool, CPUs, start method, planned
    against actual (exit 1 when a plan did not take effect or a worker published a malformed
    field).  The scheduler: ADDRESS, --address ADDRESS or --scheduler-file FILE."""
    from gpudask.cli.connect import deadline, open_client, target, unreachable
    from gpudask.cli.report import table
    from gpudask.cli.status import cluster_status, format_status

    address = target(address, address_option, scheduler_file, timeout)
    try:
        with open_client(address, timeout) as client, deadline(timeout, address):
            result = cluster_status(client)
    except OSError as e:
        raise unreachable(address, e) from None
    click.echo(json.dumps(result, indent=1, default=str) if as_json else format_status(result, table))
    sys.exit(1 if result["mismatches"] or result["problems"] else 0)
