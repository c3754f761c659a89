"""``dask gpudask ...``: registered in dask's ``dask_cli`` entry point group, which dask loads
whenever ``dask`` runs (``dask worker --preload gpudask`` too).  Outside the ``gpudask`` package:
gpudask must be imported by the preload itself, when it can tell which process it is in.
"""

import click

# gpudask's own commands (gpudask.cli; tests/test_cli_commands.py holds the two lists together);
# other distributions add theirs through the `gpudask.commands` entry point group
BUILTIN_COMMANDS = ("check", "config", "demo", "info", "plugins", "status")


def command_names() -> list:
    """The commands `dask gpudask` has here: the built-in ones and those of the installed
    distributions (``gpudask bench`` only with gpudask-bench)."""
    import importlib.metadata

    return sorted(set(BUILTIN_COMMANDS) | {ep.name for ep in importlib.metadata.entry_points(group="gpudask.commands")})


class _Gpudask(click.Command):
    """Its line in ``dask --help`` names the commands installed, read only when help is shown
    (not at every ``dask`` start)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return "GPU plugins for stock dask: " + ", ".join(command_names())


@click.command(name="gpudask", cls=_Gpudask, context_settings={"ignore_unknown_options": True,
                                                               "allow_extra_args": True, "help_option_names": []})
@click.pass_context
def main(ctx: click.Context) -> None:
    """GPU plugins for stock dask (`dask gpudask --help` lists the commands)."""
    from gpudask.cli import main as gpudask_main

    gpudask_main.main(args=ctx.args, prog_name="dask gpudask")
