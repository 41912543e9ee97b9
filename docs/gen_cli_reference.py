"""Write the CLI reference page at build time (mkdocs-gen-files): every command's ``--help``, rendered from the
same argparse parsers ``yolotrain`` runs (their options are generated from the typed configurations), so the
page cannot drift from the command line."""

from __future__ import annotations

import argparse
import os

import mkdocs_gen_files
from inplace_doctor.cli import _parser as doctor_parser

from yolotrain.cli import build_parser

PAGE = "reference/cli.md"
HELP_WIDTH = "100"  # argparse wraps at $COLUMNS; a fixed width makes the page the same on every machine


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands of ``parser`` by name, in the order ``--help`` lists them."""
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def help_section(level: int, name: str, parser: argparse.ArgumentParser) -> list[str]:
    """A heading for ``name`` and its ``--help`` text; then its own subcommands, one level down."""
    lines = [f"{'#' * level} {name}", "", "```text", parser.format_help().rstrip(), "```", ""]
    for sub_name, sub_parser in subcommands(parser).items():
        lines += help_section(level + 1, f"{name} {sub_name}", sub_parser)
    return lines


def reference_page() -> str:
    os.environ["COLUMNS"] = HELP_WIDTH
    lines = ["# Command-line reference", "",
             "Generated when the site is built from the parsers `yolotrain` itself runs: each section is that "
             "command's `--help`. Options may also be given as `key=value` ([conventions](../cli.md)).", ""]
    for name, parser in subcommands(build_parser()).items():
        # `doctor` parses its own arguments (everything after SCRIPT belongs to the script).
        command_parser = doctor_parser("yolotrain doctor") if name == "doctor" else parser
        lines += help_section(2, f"yolotrain {name}", command_parser)
    return "\n".join(lines)


with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(reference_page())
mkdocs_gen_files.set_edit_path(PAGE, "gen_cli_reference.py")
