"""The ``posexp`` command line: the Typer app (:mod:`posexp.cli.app`), whose ``train``, ``finetune``, ``analyze``
and ``eval hf:MODEL`` are Hydra's own applications, run on the arguments typed (no ``sys.argv`` swapped:
:mod:`posexp.cli.hydra_flags`); what Hydra lacks around them: one-line errors (:mod:`posexp.cli.arguments`), each
job checked and its folder claimed (:mod:`posexp.cli.folders`), sweep jobs that fail counted (:mod:`posexp.cli.jobs`),
the user's encoder folders (:mod:`posexp.cli.hydra_flags`), ``posexp list`` (:mod:`posexp.commands.listing`) and tab
completion (:mod:`posexp.cli.completion`, :mod:`posexp.cli.shell`).

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
