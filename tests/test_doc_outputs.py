"""Every command output the README and docs/ print is what the command prints today.

Blocks marked ``<!-- output -->`` are rerun by benchmarks/doc_outputs.py (in a scratch folder
for shipped scripts, so that no plot is rewritten); a stale one names the file and the command
and says how to regenerate it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("doc_outputs", ROOT / "benchmarks" /
                                                  "doc_outputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_marked_blocks_print_what_their_commands_print(tmp_path):
    script = load_script()
    assert script.marked_files(), "no <!-- output --> block found"
    stale = script.stale_blocks(tmp_path)
    assert not stale, "stale: " + "; ".join(
        f"{b.path.relative_to(ROOT)}: {', '.join(b.commands())}" for b, _ in stale) + (
        " -- run python3 benchmarks/doc_outputs.py --write")


def test_a_changed_output_is_found_and_rewritten(tmp_path, monkeypatch):
    """The oracle: a block edited by hand is reported stale, and --write restores it."""
    script = load_script()
    doc = tmp_path / "README.md"
    doc.write_text("<!-- output -->\n```\n$ clustersim presets --json\n{}\n```\n",
                   encoding="utf-8")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "run", lambda command, scratch=None: '{"a": 1}\n')
    stale = script.stale_blocks()
    assert [b.commands() for b, _ in stale] == [["clustersim presets --json"]]
    script.write(stale)
    assert doc.read_text(encoding="utf-8") == (
        '<!-- output -->\n```\n$ clustersim presets --json\n{"a": 1}\n```\n')
    assert script.stale_blocks() == []


def test_deepseek_gpu_hours_in_presets_follow_the_step_printed_above_them():
    """docs/presets.md turns the printed DeepSeek-V3 step into H800 GPU hours per trillion
    tokens against the report's 180K (2664K GPU hours for 14.8T tokens): the prose must use
    the step the block prints, 2048 GPUs and 120 x 4096 x 128 tokens a step."""
    import re
    text = (ROOT / "docs" / "presets.md").read_text(encoding="utf-8")
    printed = float(re.search(r"deepseek-v3-h800[\s\S]*?step time\s+│\s+([\d.]+) s", text)[1])
    said = re.search(r"clustersim predicts ([\d.]+) s per 62\.9M-token step on 2048 GPUs:\s*"
                     r"\*\*(\d+)K GPU hours, ([+-][\d.]+)%\*\*", text)
    assert said, "the GPU-hours sentence is missing from docs/presets.md"
    hours = printed * 2048 / 3600 / (120 * 4096 * 128) * 1e12
    assert float(said[1]) == printed
    assert int(said[2]) == round(hours / 1000)
    assert float(said[3]) == round(100 * (hours / 180e3 - 1), 1)
