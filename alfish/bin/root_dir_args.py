"""The flags of the commands that read a results directory (play, export; evaluate and collect take --allow_import
from here): which run, which of its checkpoints, and which modules its stored config may use. Defined once, so their
names, defaults and help read the same in each.

Each command adds them where they belong among its own flags (``--help`` lists flags in the order they were added).
"""
from __future__ import annotations

import argparse
from typing import Optional

from alfish.config.untrusted import TRUST_ALL


def command_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of command ``prog`` (e.g. 'python -m alfish.bin.play'); ``description`` (its module docstring) is
    printed by ``--help`` as written."""
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_root_dir(parser: argparse.ArgumentParser, help_text: Optional[str] = None) -> None:
    """``--root_dir`` (required): the results directory to read."""
    parser.add_argument("--root_dir", required=True, help=help_text)


def add_checkpoint_choice(parser: argparse.ArgumentParser, best_help: str) -> None:
    """``--checkpoint_step N`` (default: the newest checkpoint that verifies) and ``--best`` (the checkpoint kept
    under ``checkpoints/best``); the command refuses both at once."""
    parser.add_argument("--checkpoint_step", type=int, default=None,
                        help="iteration of the checkpoint (default: newest)")
    parser.add_argument("--best", action="store_true", help=best_help)


def add_allow_import(parser: argparse.ArgumentParser) -> None:
    """``--allow_import PREFIX`` (repeatable, default none): the modules the stored config may use
    (``alfish.config.untrusted``); ``'*'`` trusts the results directory completely."""
    parser.add_argument("--allow_import", action="append", default=[], metavar="PREFIX",
                        help="trust the modules under PREFIX (your own env/network package): the stored config may "
                             "import them, use their configurables and name their 'module:EnvId' envs (repeatable); "
                             f"'{TRUST_ALL}' trusts this root_dir completely, so its config may run any code")
