"""The ``posexp`` command line: the Typer app (:mod:`posexp.cli.app`), what a user types to the Hydra apps
checked before Hydra runs (:mod:`posexp.cli.arguments`), the run or sweep folder claimed on the config Hydra
composed (:mod:`posexp.cli.folders`), one job inside Hydra (:mod:`posexp.cli.jobs`), ``posexp list``
(:mod:`posexp.cli.listing`), tab completion (:mod:`posexp.cli.completion`, :mod:`posexp.cli.shell`), and Hydra's
private API behind one adapter (:mod:`posexp.cli.hydra_adapter`).

The only package that touches Hydra's argv; the recipes it starts live in :mod:`posexp.commands`.
"""


def main() -> None:
    """The ``posexp`` command. A TAB in the shell is answered at once, before the app (Hydra, torch) is loaded."""
    from posexp.cli import shell

    if shell.requested():
        shell.answer()
        return
    from posexp.cli.app import main as run_app

    run_app()
