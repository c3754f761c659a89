"""``dask gpudask ...``: registered in dask's ``dask_cli`` entry point group.

dask loads every ``dask_cli`` entry point whenever ``dask`` runs, including
``dask worker --preload gpudask``.  This module lives outside the ``gpudask`` package
so that loading it does not import gpudask early: gpudask must be imported by the
preload itself, when it can tell which process it is in.
"""

import click


@click.command(name="gpudask", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                 "help_option_names": []})
@click.pass_context
def main(ctx: click.Context) -> None:
    """GPU plugins for stock dask: info, plugins, config, demo, check, bench."""
    from gpudask.cli import main as gpudask_main

    gpudask_main.main(args=ctx.args, prog_name="dask gpudask")
