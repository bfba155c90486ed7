"""The deployment's spend caps as they apply now (DB settings row over environment over defaults)."""

from dataclasses import dataclass

from apps.worker.gates import runtime_settings


@dataclass(frozen=True)
class DeploymentCaps:
    day: int | None
    week: int | None
    month: int | None
    soft_hold_pct: int | None
    daily_tokens: int | None


def deployment_caps() -> DeploymentCaps:
    """Raises runtime_settings.SettingsInvalid when the overlay cannot be used (jobs are refused then too)."""
    current = runtime_settings.current()
    return DeploymentCaps(
        day=current.daily_cap,
        week=current.weekly_cap,
        month=current.monthly_cap,
        soft_hold_pct=current.soft_hold_pct,
        daily_tokens=current.daily_token_cap,
    )
