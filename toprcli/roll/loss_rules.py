"""The loss part of the ROLL → topr mapping: pg_variant, its knobs, and the loss-wide settings.

ROLL (alibaba/ROLL, Apache-2.0, commit 8eb27cc) selects the loss with
``actor_train.pg_variant`` in ``ActorPGWorker`` (``vanilla``, ``ppo``, ``tis``,
``topr``, ``cispo``, ``kimi15``) and trains with ``ActorWorker``'s PPO-clip loss
otherwise. The mapper ``m`` is :class:`toprcli.roll.importer._Mapper`.
"""

from __future__ import annotations

from typing import Any

from toprcli.errors import UserError
from toprcli.roll import keys as K

# -- the loss ---------------------------------------------------------------------------------


def _knob(m: Any, name: str) -> str | None:
    """Where a loss knob is given: ROLL reads actor_train's; its docs show them at the top level."""
    for key in (f"actor_train.{name}", name):
        if m.has(key):
            return key
    return None


def select_loss(m: Any) -> str:
    own, top = m.get("actor_train.pg_variant"), m.get("pg_variant")
    variant = own if own is not None else top
    worker = m.get("actor_train.worker_cls")
    pg_worker = isinstance(worker, str) and worker.endswith("ActorPGWorker")
    if variant is not None and (not isinstance(variant, str) or variant not in K.PG_VARIANTS):
        where = "actor_train.pg_variant" if own is not None else "pg_variant"
        raise UserError(f"{where}: {variant!r} is not a ROLL pg_variant — choose one of: {', '.join(K.PG_VARIANTS)}")
    if variant is None:
        if pg_worker:
            raise UserError(
                "actor_train.worker_cls is ActorPGWorker but no actor_train.pg_variant is set — ROLL itself refuses "
                "this file ('Unsupported pg_variant'); set actor_train.pg_variant (topr, vanilla, ppo, tis, cispo, kimi15)"
            )
        loss = "ppo"
        m.mapped("actor_train.worker_cls", ("train.loss", loss), note="ROLL's ActorWorker trains with PPO-clip")
        m.set("train.loss", loss)
        m.callout(
            "no pg_variant: ROLL trains this file with ActorWorker's PPO-clip loss, never TOPR (TOPR is "
            f"actor_train.pg_variant: topr with actor_train.worker_cls: {K.PG_WORKER}) — imported as train.loss: ppo; "
            "set train.loss: topr to train with TOPR here"
        )
    else:
        loss = K.PG_VARIANTS[variant]
        key = "actor_train.pg_variant" if own is not None else "pg_variant"
        targets: list[tuple[str, Any]] = [("train.loss", loss)]
        note = "vanilla: −A·log π, no ratio" if variant == "vanilla" else ""
        if loss in ("topr", "tis"):
            targets.append(("train.loss_options.ratio_level", "token"))
            note = "ROLL's ratio is per token; topr's default (the paper's) is per sequence"
        if loss == "cispo":  # ROLL's defaults differ from topr's (no lower bound, 0.28)
            for roll_name, opt in (("cispo_epsilon_low", "clip_low"), ("cispo_epsilon_high", "clip_high")):
                if _knob(m, roll_name) is None:
                    targets.append((f"train.loss_options.{opt}", K.PG_KNOBS[roll_name]))
            note = "ROLL's default epsilons 0.1 where the file sets none"
        m.mapped(key, *targets, note=note)
        if own is None:
            m.callout(
                f"pg_variant: {variant} is set only at the top level, which ROLL merely interpolates — ROLL reads "
                "actor_train.pg_variant, so ROLL would not run this loss; imported as asked"
            )
        elif top is not None:
            m.left_out("pg_variant", "ROLL only interpolates the top-level pg_variant; the loss is actor_train.pg_variant")
            if top != own:
                m.callout(f"pg_variant: {top} (top level) differs from actor_train.pg_variant: {own} — ROLL uses the latter")
        if worker is not None:
            m.mapped("actor_train.worker_cls", note="selects ROLL's pg_variant losses" if pg_worker else "see call-outs")
        if not pg_worker:
            m.callout(
                f"actor_train.pg_variant is {variant} but actor_train.worker_cls is {worker or 'not set'}: ROLL reads "
                f"pg_variant only in ActorPGWorker and otherwise trains with PPO-clip — imported as {loss}, as asked"
            )
    _loss_options(m, loss, variant)
    return loss


_KNOBS = {  # ROLL knob → (the topr loss it belongs to, its option there)
    "topr_positive_weight": ("topr", "positive_weight"),
    "topr_negative_weight": ("topr", "negative_weight"),
    "tis_lower_bound": ("tis", "lower"),
    "tis_upper_bound": ("tis", "upper"),
    "cispo_epsilon_low": ("cispo", "clip_low"),
    "cispo_epsilon_high": ("cispo", "clip_high"),
    "kimi15_tau": ("kimi15", "tau"),
}
_PPO_KEYS = ("pg_clip", "use_pg_clip_range", "pg_clip_low", "pg_clip_high", "dual_clip_loss", "importance_sampling")


def _loss_options(m: Any, loss: str, variant: str | None) -> None:
    for name, (owner, option) in _KNOBS.items():
        for key in (f"actor_train.{name}", name):
            if not m.has(key):
                continue
            if owner != loss:
                m.left_out(key, f"only ROLL's {owner} loss reads it; the loss here is {loss}")
                continue
            if key == name and m.has(f"actor_train.{name}"):
                m.left_out(key, f"actor_train.{name} is set too, and that is what ROLL reads")
                continue
            note = "ROLL reads it from actor_train only, so ROLL ignores this top-level value" if key == name else ""
            if name in K.PG_KNOBS:
                note = (
                    "not a WorkerConfig field: ROLL's loader drops it and ROLL runs with its default "
                    f"{K.PG_KNOBS[name]}; imported as written"
                )
            m.mapped(key, (f"train.loss_options.{option}", m.number(key)), note=note)
    unified = _knob(m, "cispo_use_unified_mask")
    if unified is not None:
        if loss != "cispo":
            m.left_out(unified, f"only ROLL's cispo loss reads it; the loss here is {loss}")
        elif m.flag(unified):
            m.left_out(unified, "topr's cispo has no unified mask (it would mask tokens as PPO clipping does; see train.loss: ppo)")
        else:
            m.mapped(unified, note="off, as topr's cispo")
    if loss != "ppo":
        for key in _PPO_KEYS:
            if m.has(key):
                m.left_out(key, f"only ROLL's ppo loss reads it; the loss here is {loss}")
        return
    clip = m.number("pg_clip", 0.2)
    if clip is None:  # pg_clip: null — ROLL's ppo needs a number
        raise UserError("pg_clip: null is not a number — ROLL's ppo loss clips at pg_clip: give one (e.g. 0.2)")
    m.mapped("pg_clip", ("train.loss_options.clip_ratio", clip))
    if m.flag("use_pg_clip_range"):
        m.mapped("use_pg_clip_range", note="asymmetric clip range")
        m.mapped("pg_clip_low", ("train.loss_options.clip_low", m.number("pg_clip_low", 0.2)))
        m.mapped("pg_clip_high", ("train.loss_options.clip_high", m.number("pg_clip_high", 0.2)))
    else:
        for key in ("pg_clip_low", "pg_clip_high"):
            if m.has(key):
                m.left_out(key, "use_pg_clip_range is off: ROLL clips with pg_clip")
        if m.has("use_pg_clip_range"):
            m.mapped("use_pg_clip_range", note="off: one clip range, pg_clip")
    if m.flag("dual_clip_loss"):
        if clip > 0:
            m.mapped("dual_clip_loss", ("train.loss_options.dual_clip", 1 + 2 * clip), note="ROLL's dual-clip constant is 1 + 2·pg_clip")
        else:
            m.left_out("dual_clip_loss", "pg_clip is 0, so ROLL's dual-clip constant 1 + 2·pg_clip is 1: no dual clip")
    elif m.has("dual_clip_loss"):
        m.mapped("dual_clip_loss", note="off, as topr's ppo")
    if m.has("importance_sampling"):
        level = m.get("importance_sampling")
        if variant is not None:
            m.left_out("importance_sampling", "only ROLL's ActorWorker reads it; ActorPGWorker's ppo ratio is per token, as here")
        elif level == "token":
            m.mapped("importance_sampling", note="per-token ratio, as topr's ppo")
        else:
            m.left_out("importance_sampling", f"{level!r}: ROLL's seq ratio is exp(mean token log-ratio); topr's ppo ratio is per token")


def loss_generic(m: Any, reference: str | None, sequence_length: int) -> None:
    mode = m.get("loss_agg_mode")
    if mode is not None:
        targets = [("train.aggregation", mode)]
        if mode == "seq-mean-token-sum-norm":  # ROLL's loss mask spans prompt + response, shifted by one
            targets.append(("train.norm_length", sequence_length - 1))
        m.mapped("loss_agg_mode", *targets, note="ROLL divides by its loss mask's width, sequence_length − 1" if len(targets) > 1 else "")
    if m.has("whiten_advantages"):
        m.mapped("whiten_advantages", ("train.whiten_advantages", m.flag("whiten_advantages")),
                 note="ROLL whitens over the rollout batch's tokens, topr over each step's sequences")
    clip = m.number("advantage_clip")
    if clip:
        m.mapped("advantage_clip", ("train.adv_clip", clip))
    elif m.has("advantage_clip"):
        m.mapped("advantage_clip", note="off, as topr's default")
    if m.flag("use_kl_loss"):
        coef = m.number("kl_loss_coef", 0.0)
        targets = [("train.kl_coef", coef), ("train.kl_estimator", "k3")]
        if coef and reference is not None:
            targets.append(("train.ref_model", reference))
        m.mapped("use_kl_loss", *targets[1:], note="ROLL's KL loss is k3 to the reference worker's model")
        m.mapped("kl_loss_coef", ("train.kl_coef", coef))
    elif m.has("use_kl_loss"):
        m.mapped("use_kl_loss", note="off, as topr's default")
        if m.has("kl_loss_coef"):
            m.left_out("kl_loss_coef", "use_kl_loss is off")
    ent = m.number("entropy_loss_coef")
    if ent is not None and ent > 0:
        m.mapped("entropy_loss_coef", ("train.entropy_coef", ent))
    elif m.has("entropy_loss_coef"):  # ROLL adds the term only for a coefficient > 0
        m.mapped("entropy_loss_coef", note="off (ROLL applies it only when > 0), as topr's default")
    if m.has("max_grad_norm"):
        m.mapped("max_grad_norm", ("train.grad_clip", m.number("max_grad_norm")))
    if m.has("ppo_epochs"):
        m.mapped("ppo_epochs", ("train.epochs", float(m.number("ppo_epochs", integer=True))), note="passes over each round's data")
    if m.has("rl_loss_coef"):
        coef = m.number("rl_loss_coef") if not isinstance(m.get("rl_loss_coef"), str) else None
        if coef == 1.0:
            m.mapped("rl_loss_coef", note="1.0 leaves ROLL's loss unscaled")
        else:
            m.left_out("rl_loss_coef", "ROLL multiplies its policy + KL loss by it; topr has no loss scale (see call-outs)")
            m.callout(
                f"rl_loss_coef: {m.get('rl_loss_coef')} — ROLL's TOPR doc lists it as a TOPR knob with default 0.0, but "
                "ROLL's code (actor_pg_worker.py, actor_worker.py) multiplies the policy + KL loss by it (field default "
                "1.0): 0.0 switches the policy loss off. Not imported; TOPR's own knobs are actor_train.topr_positive_weight "
                "and actor_train.topr_negative_weight"
            )


def topr_doc_keys(m: Any) -> None:
    for key, what in K.TOPR_DOC_KEYS.items():
        if m.has(key):
            m.left_out(key, what)
            m.callout(f"{key} (value {m.get(key)!r}): {what}")
