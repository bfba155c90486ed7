"""The deployment's spend caps as they apply now (DB settings row over environment over defaults)."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class DeploymentCaps:
    day: int | None
    week: int | None
    month: int | None
    soft_hold_pct: int | None
    daily_tokens: int | None


def deployment_caps() -> DeploymentCaps:
    return DeploymentCaps(
        day=settings.PI_DAILY_CAP,
        week=settings.PI_WEEKLY_CAP,
        month=settings.PI_MONTHLY_CAP,
        soft_hold_pct=settings.PI_SOFT_HOLD_PCT,
        daily_tokens=settings.PI_DAILY_TOKEN_CAP,
    )
