"""python manage.py api_token create <username> --scope read|operate|admin [--name N] [--expires ISO]
   python manage.py api_token revoke <prefix>
   python manage.py api_token list"""

from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.access import tokens
from apps.access.models import ApiToken, Scope


class Command(BaseCommand):
    help = "Make (printed once), revoke or list API tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="make a token for a user; it is printed once")
        create.add_argument("username")
        create.add_argument("--scope", choices=Scope.values, required=True)
        create.add_argument("--name", default="", help="what uses it")
        create.add_argument("--expires", help="ISO 8601 instant with a zone, e.g. 2027-01-01T00:00:00Z")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix (as `list` shows it)")
        revoke.add_argument("prefix")
        sub.add_parser("list", help="every token: prefix, user, scope, state, last use")

    def handle(self, *args, action, **options):
        if action == "create":
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"no user {options['username']!r}")
            expires = _instant(options["expires"]) if options.get("expires") else None
            try:
                row, token = tokens.issue(user, name=options["name"] or "cli", scope=options["scope"],
                                          expires_at=expires)
            except ValueError as error:
                raise CommandError(str(error)) from None
            self.stdout.write(token)
            self.stderr.write(f"made token {row.prefix}… for {user.get_username()} ({row.scope}); it is not shown "
                              "again")
        elif action == "revoke":
            count = tokens.revoke(ApiToken.objects.filter(prefix=options["prefix"]))
            if not count:
                raise CommandError(f"no active token with prefix {options['prefix']!r}")
            self.stdout.write(f"revoked {count} token(s)")
        else:
            for row in ApiToken.objects.select_related("user"):
                used = row.last_used_at.isoformat() if row.last_used_at else "never"
                self.stdout.write(f"{row.prefix}…  {row.user.get_username():20} {row.scope:8} {row.state:8} "
                                  f"last used {used}  {row.name}")


def _instant(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CommandError("--expires: an ISO 8601 instant with a zone, e.g. 2027-01-01T00:00:00Z")
    return moment
