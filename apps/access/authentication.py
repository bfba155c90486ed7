"""`Authorization: Bearer pid_…` for the API (session authentication stays for the browsable API)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from . import tokens


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, presented = header.partition(" ")
        if scheme != self.keyword:
            return None
        presented = presented.strip()
        if not presented:
            raise exceptions.AuthenticationFailed("the Bearer token is missing")
        row = tokens.find(presented)
        if row is None:
            raise exceptions.AuthenticationFailed("this token is unknown, revoked or expired")
        return row.user, row

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The schema's security scheme for these tokens (drf-spectacular)."""

    target_class = "apps.access.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API token (`pid_…`), made in the admin or "
                "with `manage.py api_token create`; its scope and its user's permissions decide what it may do."}
