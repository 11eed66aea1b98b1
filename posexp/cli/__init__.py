"""The ``posexp`` command line: the Typer app (:mod:`posexp.cli.app`), whose ``train``, ``finetune``, ``analyze`` and
``eval hf:MODEL`` are Hydra's own applications; Hydra's flags read and its apps run (:mod:`posexp.cli.hydra_flags`);
what a user types and Hydra's errors about it, each in one line (:mod:`posexp.cli.arguments`); each job's config
checked and its run or sweep folder claimed on the config Hydra composed (:mod:`posexp.cli.folders`); one job inside
Hydra (:mod:`posexp.cli.jobs`); ``posexp list`` (:mod:`posexp.commands.listing`); tab completion
(:mod:`posexp.cli.completion`, :mod:`posexp.cli.shell`). Of Hydra's private API, only its parser and runner are
used, where ``@hydra.main`` would read ``sys.argv`` (:mod:`posexp.cli.hydra_flags`).

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
