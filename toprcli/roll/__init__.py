"""Importing alibaba/ROLL RLVR configs (`topr config import-roll`); docs/from-roll.md.

- :mod:`~toprcli.roll.importer` — the entry point: ROLL YAML mapping in, topr config + key table out
- :mod:`~toprcli.roll.rules` and :mod:`~toprcli.roll.loss_rules` — what each ROLL key becomes
- :mod:`~toprcli.roll.keys` — the catalogue of ROLL's keys (to tell them from typos) and why some have no counterpart
- :mod:`~toprcli.roll.interp` — Hydra ``${...}`` interpolation without OmegaConf
"""
