"""The admin's number, time and id formats (pidispatch_site/admin_display.py) for templates."""

from django import template

from pidispatch_site import admin_display

register = template.Library()


@register.filter
def money(value):
    return admin_display.money(value)


@register.filter
def count(value):
    return admin_display.count(value)


@register.filter
def instant_of(value):
    """A datetime with seconds and its zone (the fleet panel's own `instant` takes unix seconds)."""
    return admin_display.instant(value)


@register.filter
def short_id(value):
    return admin_display.short_id(value)


@register.filter
def target_link(target, kind):
    """`{{ run.target|target_link:run.kind }}`: the forge's own page of the issue or pull request."""
    return admin_display.target_link(kind, target)


@register.filter
def published_url(run):
    """`{{ p|published_url }}` of a run's values (kind, target, pull_request, publish_url, publish_outcome): the
    pull/merge request's page on the forge as this deployment is configured."""
    return admin_display.published_url(run["kind"], run["target"], run["pull_request"], run["publish_url"],
                                       run.get("publish_outcome", ""))
