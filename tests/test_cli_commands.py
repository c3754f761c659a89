"""Commands other distributions add through the ``gpudask.commands`` entry point group
(``gpudask bench`` from contrib/gpudask-bench): listed and run when installed; an unknown,
missing or broken one is one line on stderr and exit 2, never click's usage text or a
traceback.  The bench missing from a real install is in tests/test_wheel.py."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from click.testing import CliRunner

from gpudask.cli import OPTIONAL_COMMANDS, main


def _installed_command(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, name: str, target: str,
                       module: str | None = None) -> None:
    """A distribution on sys.path whose ``gpudask.commands`` entry point ``name`` is ``target``."""
    site = tmp_path / "site"
    info = site / f"cmd_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cmd-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[gpudask.commands]\n{name} = {target}\n")
    if module:
        (site / f"{target.split(':')[0]}.py").write_text(module)
    monkeypatch.syspath_prepend(str(site))


def _one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Usage:" not in result.stderr and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def test_an_unknown_command_is_one_line_naming_the_accepted_ones():
    line = _one_line_error(["nosuch"])
    assert line.startswith("gpudask: error: no command 'nosuch'; accepted: ")
    assert {"info", "check", "status", "demo"} <= set(line.split("accepted: ")[1].split(", "))


def test_an_installed_command_is_listed_and_runs(tmp_path, monkeypatch):
    _installed_command(tmp_path, monkeypatch, "hello", "gpudask_cmd_hello:hello",
                       "import click\n\n@click.command()\n@click.argument('who')\n"
                       "def hello(who):\n    '''Say hello.'''\n    click.echo(f'hello {who}')\n")
    result = CliRunner().invoke(main, ["hello", "gpu"])
    assert (result.exit_code, result.stdout) == (0, "hello gpu\n"), result.output
    assert "Say hello." in CliRunner().invoke(main, ["--help"]).stdout


def test_a_command_that_cannot_be_loaded_is_one_line_and_help_still_lists_the_rest(tmp_path, monkeypatch):
    _installed_command(tmp_path, monkeypatch, "broken", "gpudask_cmd_gone:command")
    line = _one_line_error(["broken"])
    assert line == ("gpudask: error: `gpudask broken` (gpudask_cmd_gone:command, from cmd-broken) cannot be loaded: "
                    "ModuleNotFoundError: No module named 'gpudask_cmd_gone'; reinstall cmd-broken")
    help_text = CliRunner().invoke(main, ["--help"])
    assert help_text.exit_code == 0 and "info" in help_text.stdout and "broken" not in help_text.stdout


def test_the_bench_comes_from_its_own_distribution():
    """Installed (the README's test command installs contrib/gpudask-bench): its entry point
    runs; not installed, the line says how to get it."""
    dist, source = OPTIONAL_COMMANDS["bench"]
    assert (pathlib.Path(__file__).parents[1] / source / "pyproject.toml").is_file()
    if importlib.util.find_spec("gpudask_bench") is None:
        line = _one_line_error(["bench"])
        assert f"python -m pip install {source}" in line and dist in line
    else:
        result = CliRunner().invoke(main, ["bench", "--help"])
        assert result.exit_code == 0 and "Usage: gpudask bench" in result.stdout, result.output


def test_every_option_of_every_builtin_command_says_what_it_does():
    """``--json`` (check, config, plugins, demo) and ``demo --protocol`` had no help text."""
    import click

    missing = [f"{name} {param.opts[0]}" for name, command in main.commands.items()
               for param in command.params if isinstance(param, click.Option) and not param.help]
    assert missing == []


def test_config_given_a_scheduler_address_points_at_gpudask_check():
    """``dask cuda config SCHEDULER``'s habit: one line naming the command that does that job."""
    assert _one_line_error(["config", "tcp://10.0.0.1:8786"]) == (
        "gpudask: error: gpudask config takes no argument ('tcp://10.0.0.1:8786'): it lists this process's "
        "settings; to compare a running cluster's scheduler, workers and client, run: gpudask check "
        "tcp://10.0.0.1:8786")


def test_dask_help_lists_the_commands_installed_here(tmp_path, monkeypatch):
    """`dask --help`'s line for gpudask names gpudask's own commands (status too) and the ones
    installed distributions add, read from the same entry point group `gpudask --help` reads."""
    import gpudask_dask_cli

    assert sorted(gpudask_dask_cli.BUILTIN_COMMANDS) == sorted(main.commands)
    _installed_command(tmp_path, monkeypatch, "hello", "gpudask_cmd_hello:hello")
    line = gpudask_dask_cli.main.get_short_help_str()
    named = line.split(": ", 1)[1].split(", ")
    assert named == sorted(set(main.commands) | {"hello"}
                           | ({"bench"} if importlib.util.find_spec("gpudask_bench") else set()))
    assert "status" in named


@pytest.mark.parametrize("columns", [100, 80, 200])
def test_help_follows_the_terminal_up_to_100_columns(columns, monkeypatch):
    import click

    monkeypatch.setenv("COLUMNS", str(columns))  # (click's CliRunner forces 80 columns: the contexts directly)
    top = main.make_context("gpudask", [], resilient_parsing=True)
    for name in (None, "check", "info"):
        ctx = top if name is None else main.get_command(top, name).make_context(name, [], parent=top,
                                                                                resilient_parsing=True)
        widest = max(map(len, ctx.get_help().splitlines()))
        assert widest <= min(columns, 100)
        if name == "check":
            assert widest > min(columns, 100) - 10  # it uses the width it has (click alone stops at 80)
