"""argparse types shared by the scripts (plain Python: the GPU machine's entry points import it without Hydra)."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """A count (batches, budgets, tokens, rounds, workers, ...): an integer >= 1, else argparse's one-line error."""
    value = int(text)  # argparse reports a ValueError as "invalid positive_int value: 'x'"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """A limit where 0 means off: an integer >= 0, else argparse's one-line error."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A temperature, a tolerance: a float >= 0, else argparse's one-line error."""
    value = float(text)  # argparse reports a ValueError as "invalid non_negative_float value: 'x'"
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def proxy_recipe(text: str) -> str:
    """A proxy recipe trained on use: a name under conf/proxy/ or a YAML file, checked at parse time."""
    from specpilot.training.spec import available  # no JAX, no Hydra

    if Path(text).suffix:
        return existing_file(text)
    if text not in available():
        raise argparse.ArgumentTypeError(f"no recipe {text!r} (available: {', '.join(available())})")
    return text


def existing_file(text: str) -> str:
    """A file read later (a τ profile, prompts, configs): checked at parse time, not after the work it follows."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def existing_dir(text: str) -> str:
    """A checkpoint folder: checked at parse time."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    return text


def model_name(text: str) -> str:
    """Synthetic target shapes: a conf/model/ name or a path to such a YAML file (`costmodel.measure.model_config`)."""
    names = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "model").glob("*.yaml"))
    if text in names or (text.endswith(".yaml") and Path(text).is_file()):
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(names)}, or a .yaml file)")
