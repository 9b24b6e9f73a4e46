"""The ``fedsbdt`` command line, composed at the package's top from every layer's commands.

Each command module owns its commands and adds them with a ``register(subparsers)`` function; this module
is the only place that knows them all, so the layers below never load one another (``common/`` neither
imports nor names ``server/`` or ``client/``; tests/test_layers.py).  The console script ``fedsbdt``
(pyproject.toml), ``python -m fedsbdt`` and ``python -m fedsbdt.cli`` run :func:`main`.

``--json`` prints exactly one JSON object on stdout and nothing else there; human-readable output and progress
go to stderr.  Expected failures (bad input, impossible privacy parameters) exit with status 2 and one clear
line (:func:`fedsbdt.common.cli.run`; design.md "Command line").
"""
from __future__ import annotations

import argparse
import sys

from fedsbdt.client import cli as client_cli
from fedsbdt.common import cli as common_cli
from fedsbdt.common import cli_audit, cli_explain, cli_tools, cli_tune, ledger_cli
from fedsbdt.common.logging_setup import quiet_grpc_core
from fedsbdt.server import cli as server_cli

from . import demo, federated_audit

#: every command module's ``register``, in the order ``fedsbdt --help`` lists their commands
REGISTER = (common_cli.register, cli_tools.register, cli_explain.register, cli_audit.register, cli_tune.register,
            ledger_cli.register, server_cli.register, demo.register, client_cli.register,
            federated_audit.register)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``fedsbdt`` parser: common's options, then each module's commands (:data:`REGISTER`)."""
    parser, sub = common_cli.base_parser()
    for register in REGISTER:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    quiet_grpc_core()  # before any command imports grpc (no module imported above does)
    return common_cli.run(build_parser(), argv)


if __name__ == "__main__":
    # Run the main() of the importable module fedsbdt.cli, not of this __main__ copy (one set of command
    # modules, one CliError class that main() catches).
    from fedsbdt.cli import main as _main

    sys.exit(_main())
