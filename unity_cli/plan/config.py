"""The cost configuration a plan was made with (``plan.json``'s ``config``), read back."""
from __future__ import annotations

from ..cost.model import CostConfig, Optimizer
from ..cost.profile import Profile, load_profile
from ..errors import ProfileError
from ..ir.dtypes import DType
from .plan import Plan


def plan_config(plan: Plan, profile: Profile | None = None) -> CostConfig:
    """The cost config a plan was made with. Its profile, if it names one, is used when the
    file is still there with the same content (``plan_profile``; pass it when already
    loaded); otherwise operators cost the roofline."""
    c = plan.config
    if profile is None:
        profile = plan_profile(plan)[0]
    return CostConfig(DType(c["dtype"]), Optimizer(c["optimizer"]), c.get("memory_limit_bytes"), profile,
                      c.get("loss", "auto"), sync_bucket=plan.sync_bucket_bytes, training=plan.training)


def plan_profile(plan: Plan) -> tuple[Profile | None, str | None]:
    """The profile the plan was made with, or None and why it is not available."""
    ref = plan.config.get("profile")
    if not isinstance(ref, dict) or not isinstance(ref.get("path"), str):
        return None, None
    try:
        prof = load_profile(ref["path"])
    except ProfileError as e:
        return None, f"the plan's profile cannot be used ({e}); operator times are roofline estimates"
    if prof.sha256 != ref.get("sha256"):
        return None, (f"the plan's profile {ref['path']} has changed since the plan was made; "
                      "operator times are roofline estimates")
    return prof, None
