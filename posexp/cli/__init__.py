"""The ``posexp`` command line: the Typer app (:mod:`posexp.cli.app`), what a user types to the Hydra apps
checked before Hydra runs (:mod:`posexp.cli.arguments`), and ``posexp list`` (:mod:`posexp.cli.listing`).

The only package that touches Hydra's argv; the recipes it starts live in :mod:`posexp.commands`.
"""
