"""The fleet panel's template filters: ages, instants and wait details as the panel shows them."""

from django import template

from apps.fleet import display

register = template.Library()


@register.filter
def age_since(ts, now):
    """`{{ job.started_at|age_since:taken_at }}` -> 3m"""
    return "-" if ts is None else display.age(now - ts)


@register.filter
def age_until(ts, now):
    return "-" if ts is None else display.age(ts - now)


@register.filter
def instant(ts):
    return display.instant(ts)


@register.filter
def detail_text(detail):
    return display.detail_text(detail)


@register.filter
def get_item(mapping, key):
    return (mapping or {}).get(key, "")


def _mib(value: int) -> str:
    return f"{value / 1024:g}g" if value % 1024 == 0 else f"{value}m"


@register.filter
def budget_line(host, usage_by_host) -> str:
    """`768m of 1g · 1 of 2 CPUs · alpha 512m (1 job), none 256m (1 job) · 2 waiting`: what the host's jobs use of its
    budget, and by which projects."""
    usage = usage_by_host.get(host.name) if usage_by_host else None
    if usage is None:
        return "-"
    memory = host.budget_memory if not host.budget_memory.isdigit() else _mib(int(host.budget_memory))
    cpus = host.budget_cpus if not host.budget_cpus.isdigit() else f"{int(host.budget_cpus) / 100:g}"
    parts = [f"{_mib(usage.memory_mib)} of {memory or '?'}", f"{usage.cpus:g} of {cpus or '?'} CPUs"]
    if usage.by_project:
        parts.append(", ".join(f"{'no project' if project == '-' else project} {_mib(mem)} ({jobs} job"
                               f"{'s' if jobs != 1 else ''})"
                               for project, (mem, _, jobs) in sorted(usage.by_project.items())))
    if usage.waiting:
        parts.append(f"{usage.waiting} waiting")
    return " · ".join(parts)
