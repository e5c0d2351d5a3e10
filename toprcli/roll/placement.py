"""ROLL's device placement: how many data-parallel ranks train (topr's batch size is ROLL's per device × accumulation × ranks).

ROLL evaluates ``device_mapping`` as Python; topr reads the forms ROLL's examples use and calls out any other.
"""

from __future__ import annotations

import re
from typing import Any


def data_parallel(m: Any) -> tuple[int, str]:
    """How many data-parallel ranks ROLL trains on (its devices over the model-parallel split), and how that was found."""
    mapping = m.get("actor_train.device_mapping")
    n = device_count(mapping)
    if n is None and mapping is None:
        return 1, "device_mapping not given: 1 assumed"
    if n is None:  # ROLL evaluates it as Python; topr reads its usual forms only
        m.callout(f"actor_train.device_mapping {mapping!r} is not a form topr reads (a list, list(range(...)), list([...])): one "
                  "data-parallel rank assumed — multiply train.batch_size by ROLL's number of training devices")
        return 1, "device_mapping not read: 1 assumed"
    strategy = str(m.get("actor_train.strategy_args.strategy_name") or "")
    split, config = 1, "actor_train.strategy_args.strategy_config"
    if "megatron" in strategy:
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            split *= m.number(f"{config}.{key}", 1, integer=True) or 1
    elif "fsdp2" in strategy:
        split = m.number("actor_train.model_args.ulysses_size", 1, integer=True) or 1
    return max(n // max(split, 1), 1), f"{n} devices / {split} model-parallel"


_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?)?\)\s*\)\s*$")


def device_count(value: Any) -> int | None:
    """How many devices a ROLL ``device_mapping`` names: a list, "list(range([a, ]b[, s]))", "[0, 1]" or "list([0, 1])"; else None."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str):
        match = _RANGE.match(value)
        if match:
            a, b, s = (int(x) if x is not None else None for x in match.groups())
            a, b = (0, a) if b is None else (a, b)
            return None if s == 0 else len(range(a, b, s or 1))
        text = value.strip()
        if text.startswith("list(") and text.endswith(")"):  # list([0, 1, 2, 3]): the list itself
            text = text[len("list("):-1].strip()
        if text.startswith("[") and text.endswith("]"):
            items = [x.strip() for x in text[1:-1].split(",") if x.strip()]
            if all(x.lstrip("-").isdigit() for x in items):
                return len(items)
    return None
