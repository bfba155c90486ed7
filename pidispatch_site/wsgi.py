"""The WSGI entry point: the application, its start gates (forge configuration, dollar caps), every view imported."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")

application = get_wsgi_application()

# A receiver that cannot verify a forge it serves must not start (DESIGN section 9).
from apps.receiver.forge_config import forge_config  # noqa: E402

forge_config()

# Nor one whose dollar caps could not bound a run (a window without PI_MAX_COST_USD).
from apps.worker.gates.checks import require_dollar_settings  # noqa: E402

require_dollar_settings()

# Import every view now: a view that cannot be imported stops the start, not the first delivery it serves.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018 (the attribute's lookup imports every view)
