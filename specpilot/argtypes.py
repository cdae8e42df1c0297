"""argparse types shared by the scripts (plain Python: the GPU machine's entry points import it without Hydra)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A count (batches, budgets, tokens, rounds, workers, ...): an integer >= 1, else argparse's one-line error."""
    value = int(text)  # argparse reports a ValueError as "invalid positive_int value: 'x'"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
