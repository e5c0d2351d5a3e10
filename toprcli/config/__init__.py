"""Typed configs for every stage, YAML loading and command-line values, in one place.

Each stage has a dataclass (``schema.py``) whose fields declare their default, help, flag and
check once (``fields.opt``). A YAML file holds one stage's keys, or a pipeline (iterate) config
with a section per stage, of which a stage command reads its own. Validation is strict and
happens once, here: a :class:`ConfigError` (one line, exit 2) names every unknown or moved key.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from pathlib import Path
from typing import Any

from toprcli.config.fields import ConfigError, alternatives, config_to_dict, config_yaml, describe, from_dict, leaf_paths, validated
from toprcli.config.schema import BASELINES, STAGES, CurateConfig, DatasetSpec, EngineConfig, EvalConfig, GenerateConfig
from toprcli.config.schema import IterateConfig, SamplingConfig, ScoreConfig, TrackingConfig, TrainConfig, VerifierDataConfig

__all__ = ["BASELINES", "STAGES", "ConfigError", "as_now", "CurateConfig", "DatasetSpec", "EngineConfig", "EvalConfig", "GenerateConfig",
           "IterateConfig", "SamplingConfig", "ScoreConfig", "TrackingConfig", "TrainConfig", "VerifierDataConfig", "config_to_dict", "config_yaml",
           "default_config", "from_dict", "stage_class", "load_config", "parse_override", "parse_value", "read_yaml", "split_override", "validated"]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for p in parents:
        if node.get(p) is None:  # absent, or a section left empty in YAML (`sampling:`): its defaults
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set '{dotted}': '{p}' is not a mapping")
    node[leaf] = value


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config file as a mapping; a key written twice is refused (YAML's last one silently won: a whole section lost)."""
    import yaml

    class Strict(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                plain = isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge"  # not <<: *anchor
                key = self.construct_object(key_node, deep=True) if plain else None
                if key is not None and key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice (also on line {seen[key]}): merge them",
                                                            key_node.start_mark)
                seen.setdefault(key, key_node.start_mark.line + 1)
            return super().construct_mapping(node, deep)

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a directory — pass a YAML config file")
    if not p.is_file():
        raise ConfigError(f"config file not found: {p} — check the path")
    try:
        data = yaml.load(p.read_text(), Loader=Strict)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError:
        raise ConfigError(f"{p} is not a text file — pass a YAML config") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror or e} — check its permissions") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}:{where} is not valid YAML ({getattr(e, 'problem', e)}) — fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config file must be a mapping of keys to values, got {type(data).__name__}")
    return data


def stage_section(data: dict[str, Any], stage: str) -> dict[str, Any]:
    """The part of a YAML document that configures ``stage``: its section of a pipeline config, or the whole file."""
    is_pipeline = any(k in data for k in STAGES if k != "iterate") or "warm_start" in data
    if stage != "iterate" and is_pipeline:
        section = {} if data.get(stage) is None else data[stage]  # `generate:` left empty is its defaults
        if not isinstance(section, dict):
            raise ConfigError(f"config section '{stage}' must be a mapping, got {section!r}")
        if stage in ("generate", "train", "eval") and "model" in data:  # the pipeline's starting policy, unless the section names one
            section = {"model": data["model"], **section}
        if stage in ("train", "eval") and "tracking" in data:  # the pipeline's trackers, for its stage commands too
            return {"tracking": data["tracking"], **section}
        return dict(section)
    return dict(data)


def resolve_key(cls: type, key: str, stage: str) -> tuple[str, str | None]:
    """A ``--set`` key as a full dotted path of ``cls`` (the config of ``stage``), and the mapping field it is inside
    (None if none): ``train.lr`` and ``lr`` both name TrainConfig.lr; a key that is the tail of exactly one path
    (``top_p`` → ``sampling.top_p``) names that path; ``loss_options.ratio_level`` is inside ``loss_options``."""
    if stage != "iterate" and key.startswith(f"{stage}."):
        key = key[len(stage) + 1:]
    paths = leaf_paths(cls)
    inside = next((p for p in paths if key.startswith(p + ".")), None)
    if inside is not None and _field_type(cls, inside) is not dict:
        raise ConfigError(f"--set {key}: '{inside}' is {describe(_field_type(cls, inside, plain=False))}, not a mapping — write --set {inside}=VALUE")
    if key in paths or inside is not None:
        return key, inside
    matches = [p for p in paths if p.endswith("." + key)]
    if len(matches) > 1:
        raise ConfigError(f"--set {key}: ambiguous, it could be {' or '.join(matches)} — write the whole key")
    return (matches[0] if matches else key), None


def load_config(cls: type, path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None,
                *, sets: dict[str, Any] | None = None) -> Any:
    """Build a stage config: defaults ← YAML file ← overrides ← sets.

    ``overrides`` maps dotted keys to typed command-line values; None means "not given"; a mapping adds to
    the file's (or the default) mapping. ``sets``
    are ``--set key=value`` pairs, keys resolved by :func:`resolve_key`; a value given as text is read as YAML
    (``null`` included) unless its field is a string (``split=2023``, ``verifier=regex:(\\d+) # x`` stay as written).
    """
    stage = next(name for name, c in STAGES.items() if c is cls)
    data = stage_section(read_yaml(path), stage) if path is not None else {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, {**_current(cls, data, key), **value} if isinstance(value, dict) else value)
    for key, value in (sets or {}).items():
        path, mapping = resolve_key(cls, key, stage)
        if mapping is not None:  # a key inside a mapping (verifier_by_source.X, dots and all) adds to it, as its flag does
            _set_dotted(data, mapping, {**_current(cls, data, mapping), path[len(mapping) + 1:]: _set_value(cls, path, value)})
        else:
            _set_dotted(data, path, _set_value(cls, path, value))
    return from_dict(cls, data)


def _current(cls: type, data: dict[str, Any], dotted: str) -> dict[str, Any]:
    """A mapping field's value before a flag adds to it (``--verifier-by-source NAME=math`` adds a pair): the
    file's, else the default."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        return node
    return dict(functools.reduce(getattr, dotted.split("."), cls()))


def as_now(cls: type, recorded: dict[str, Any]) -> dict[str, Any]:
    """A config recorded by an earlier run, read through today's schema (a key added since has its default, which is
    how that run behaved); one with a key since removed or renamed, as written."""
    try:
        return config_to_dict(from_dict(cls, recorded))
    except ConfigError:
        return recorded


def stage_class(stage: str, given_as: str = "") -> type:
    """The config class of a stage named as its command is (``verifier-data``) or its section (``verifier_data``)."""
    if stage.replace("-", "_") not in STAGES:
        raise ConfigError(f"{given_as}unknown stage {stage!r} — choose one of: {', '.join(s.replace('_', '-') for s in STAGES)}")
    return STAGES[stage.replace("-", "_")]


def default_config(stage: str) -> Any:
    return stage_class(stage)()


def parse_value(text: str) -> Any:
    """A command-line value read as YAML (numbers, booleans, lists, null); text that is not YAML stays as written."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def split_override(text: str, flag: str = "--set", example: str = "train.lr=1e-6") -> tuple[str, str]:
    """``key.sub=value`` as (key, the value's text)."""
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise ConfigError(f"{flag} {text!r}: write it as KEY=VALUE, e.g. {flag} {example}")
    key, raw = text.split("=", 1)
    return key.strip(), raw


def parse_override(text: str, flag: str = "--set", example: str = "train.lr=1e-6") -> tuple[str, Any]:
    """``key.sub=value`` with the value parsed as YAML (``key=`` is the empty string)."""
    key, raw = split_override(text, flag, example)
    return key, parse_value(raw) if raw else ""


def _set_value(cls: type, dotted: str, value: Any) -> Any:
    """A ``--set`` value for the field at ``dotted``: text read as YAML, except for a string field, which keeps it as
    written (``split=2023``), but where the field may be None, ``null`` (or ``~``) is None."""
    tp = _field_type(cls, dotted, plain=False)
    args = alternatives(tp)
    if isinstance(value, str) and args == [int] and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        return int(value)  # as its flag reads it: YAML 1.1 reads 010 as 8
    if not isinstance(value, str) or value == "" or args != [str]:
        return parse_value(value) if isinstance(value, str) and value != "" else value
    return None if tp is not str and value.strip() in ("null", "~", "Null", "NULL") else value


def _field_type(cls: type, dotted: str, plain: bool = True) -> Any:
    """The declared type of the field at ``dotted`` (None inside a mapping); ``plain``: its origin (``dict``)."""
    tp: Any = cls
    for part in dotted.split("."):
        tp = (typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}).get(part)  # a key inside a mapping has no type of its own
    return (typing.get_origin(tp) or tp) if plain else tp
