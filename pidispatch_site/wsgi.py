import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")

application = get_wsgi_application()

# A receiver that cannot verify a forge it serves must not start (DESIGN section 9).
from apps.receiver.forge_config import forge_config  # noqa: E402

forge_config()
