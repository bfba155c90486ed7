"""The WSGI entry point: the application, checked forge configuration, and a frozen collector."""

import gc
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

# Import every view now rather than on the first request, then take everything loaded so far out of the
# cyclic garbage collector's sight: it lives as long as the process, and a full collection that scans it
# all pauses a request for tens of milliseconds.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns
gc.freeze()
