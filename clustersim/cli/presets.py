"""``clustersim presets``: the shipped model, GPU and cluster presets, as a table or JSON."""

from __future__ import annotations

import argparse

from .json_output import print_json


def add_presets(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser("presets", help="list model, GPU and cluster presets",
                              description="List the shipped model, GPU and cluster presets.")
    cmd.add_argument("--json", action="store_true", help="print the presets as JSON")
    cmd.set_defaults(run=run_presets)


def run_presets(args: argparse.Namespace) -> int:
    from clustersim.reports.tables import preset_rows, print_presets

    if args.json:
        print_json(preset_rows())
    else:
        print_presets()
    return 0
