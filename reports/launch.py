"""How to launch a scenario's split with the training stack it names: Megatron-LM's
arguments, Megatron-DeepSpeed's with a DeepSpeed configuration, or torchtitan's options
(``training.framework``). ``plan`` prints the best plan's, ``plan --json`` every plan's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clustersim.simulator.inputs.scenario import Scenario

from .deepspeed_args import CONFIG_FILE, deepspeed_args, deepspeed_config
from .megatron import megatron_args
from .torchtitan_args import torchtitan_args


@dataclass(frozen=True)
class Launch:
    """A stack's command-line arguments for a split (``#`` lines are comments: what the
    stack has no flag for) and, for DeepSpeed, its configuration file."""

    stack: str  # the program that takes the arguments
    args: list[str]
    config: dict[str, Any] | None = field(default=None)

    def command_line(self) -> str:
        """The flags on one line, comments dropped."""
        return " ".join(a for a in self.args if not a.startswith("#"))

    def notes(self) -> list[str]:
        return [a for a in self.args if a.startswith("#")]

    def lines(self, title: str) -> list[str]:
        """What ``plan`` prints: the flags, the configuration file, the notes."""
        out = [f"{self.stack} arguments of {title}: {self.command_line()}"]
        if self.config is not None:
            out.append(f"  {CONFIG_FILE}: {json.dumps(self.config)}")
        return out + [f"  {note}" for note in self.notes()]

    def as_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "args": self.args, "config": self.config}


def launch(s: Scenario) -> Launch:
    """The split as the scenario's training stack takes it."""
    stack = s.training.framework
    if stack == "deepspeed":
        return Launch("Megatron-DeepSpeed", deepspeed_args(s), deepspeed_config(s))
    if stack == "fsdp":
        return Launch("torchtitan", torchtitan_args(s))
    return Launch("Megatron-LM", megatron_args(s))
