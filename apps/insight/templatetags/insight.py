"""The cost page's template filters: dollars, counts and shares as an operator reads them."""

from django import template

from .. import format

register = template.Library()


@register.filter
def dollars(value, estimated=False):
    return format.dollars(value, estimated=bool(estimated))


@register.filter
def count(value):
    return format.count(value)


@register.filter
def share(value):
    return format.share(value)
