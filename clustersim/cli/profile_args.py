"""``--profile NAME|FILE`` and ``--force-profile``: the same two options, with the same meaning,
in every command that takes a calibration profile (``simulate``, ``sweep``, ``validate``).

A profile is named by a file path, or by a name looked up in the user's calibrations and then
among the shipped profiles (``validation/profiles.py``); one measured on another device than
the cluster's GPU is refused unless ``--force-profile`` asks for it (``check_device``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clustersim.topologies.profile import FORCE_FLAG, Profile


def add_profile_arguments(cmd: argparse.ArgumentParser, default: str) -> None:
    """Add ``--profile`` and ``--force-profile`` to ``cmd``; ``default`` says what is used
    without ``--profile``."""
    cmd.add_argument("--profile", metavar="NAME|FILE",
                     help="calibration profile: a file, or a name among the user's "
                          "calibrations ('calibrate' prints it) or the shipped profiles "
                          f"(e.g. h100-sxm; default: {default}); refused when measured on "
                          f"another device than the cluster's GPU, unless {FORCE_FLAG}")
    cmd.add_argument(FORCE_FLAG, action="store_true",
                     help="apply --profile even though it was measured on another device "
                          "(its figures then price this GPU as if it were that device)")


def profile_path(name_or_path: str | None) -> Path | None:
    """The file ``--profile`` names (a path, or a calibration or shipped profile's name)."""
    if not name_or_path:
        return None
    from clustersim.validation.profiles import find_profile
    return find_profile(name_or_path)


def chosen_profile(args: argparse.Namespace, cluster=None) -> Profile | None:
    """The profile ``--profile`` names, loaded, or None; with ``cluster``, checked against
    its GPU (unless ``--force-profile``)."""
    if not args.profile:
        return None
    from clustersim.validation.profiles import load_named_profile
    return load_named_profile(args.profile, cluster, args.force_profile)


def note_generic_profile(cluster, profile: Profile | None) -> None:
    """Say so on stderr when no ``--profile`` was given and the generic profile prices one of
    the cluster's GPUs (``generic_profile_note``): its times are a shape, not a prediction."""
    from clustersim.topologies.profile import generic_profile_note

    note = None if profile is not None else generic_profile_note(cluster)
    if note:
        print(note, file=sys.stderr)
