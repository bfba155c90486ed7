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
