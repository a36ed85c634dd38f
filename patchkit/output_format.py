"""The report format options ``patchkit status`` and ``patchkit doctor`` share: ``--json`` and ``--format``."""

from __future__ import annotations

import argparse

from .runtime.errors import ConfigError

FORMATS = ("text", "json", "markdown")


def add_options(parser: argparse.ArgumentParser, json_help: str) -> None:
    """``--json`` (a shorthand, helped by ``json_help``) and ``--format`` on ``parser``."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (default), json, or markdown to paste into an issue")


def chosen(args: argparse.Namespace) -> str:
    """The format ``args`` ask for; ``ConfigError`` when ``--json`` and another ``--format`` are both given."""
    if args.json and args.format not in (None, "json"):
        raise ConfigError("--format", args.format, "json alone, or leave out --json", problem="in conflict with --json")
    return "json" if args.json else (args.format or "text")
