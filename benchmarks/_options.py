"""A benchmark's command line: its integer options and their defaults in one call."""

from __future__ import annotations

import argparse


def integer_options(doc: str | None, **defaults: int) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--<name>`` (underscores written as dashes)
    taking an integer, for each of ``defaults``; the caller adds its other options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser
