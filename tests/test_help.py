"""Every subcommand's --help (issue 25): every default shown (never "(default: None)"), one placeholder style
(every option that takes a value names an explicit upper-case placeholder, or lists its choices), and the
hyperparameter defaults the same wherever they appear."""
from __future__ import annotations

import argparse
import re

import pytest

from fedsbdt.cli import build_parser

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(=[A-Za-z_.]+)?$")


def _parsers(parser: argparse.ArgumentParser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = dict((" ".join(path) or "fedsbdt", p) for path, p in _parsers(build_parser()))


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_shows_every_default_in_one_placeholder_style(command):
    parser = PARSERS[command]
    text = parser.format_help()  # renders (a bad % in a help text raises here)
    assert "(default: None)" not in text and "default: None" not in text
    problems = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            continue
        flag = a.option_strings[-1]
        if a.nargs == 0 or isinstance(a, argparse.BooleanOptionalAction):
            continue  # a switch: off unless given (BooleanOptionalAction: --x / --no-x)
        if a.choices is None and not (isinstance(a.metavar, str) and PLACEHOLDER.match(a.metavar)):
            problems.append(f"{flag}: placeholder {a.metavar!r} (give an upper-case metavar)")
        if not a.required and "default" not in (a.help or "") and "required" not in (a.help or ""):
            problems.append(f"{flag}: help does not say its default")
    assert not problems, f"fedsbdt {command} --help:\n" + "\n".join(problems)


def test_demo_and_train_share_the_hyperparameter_defaults():
    from fedsbdt.common.config import Hyperparameters

    demo = {a.dest: a.default for a in PARSERS["demo"]._actions}
    train = {a.dest: a.default for a in PARSERS["train"]._actions}
    plan = {a.dest: a.default for a in PARSERS["plan"]._actions}
    # trees and depth follow --settings (auto by default) in demo, train and plan alike
    assert demo["trees"] is demo["depth"] is train["trees"] is plan["trees"] is None
    assert demo["settings"] == train["settings"] == plan["settings"] == "auto"
    assert demo["epsilon"] == Hyperparameters().epsilon
    text = PARSERS["client"].format_help()
    assert re.search(r"--max-epsilon X\s+refuse .*\(default:\s+no\s+limit\)", text, re.S)
