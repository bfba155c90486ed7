"""`manage.py check` (and every worker start) names what is wrong with the forge credentials the worker
acts with, before a job finds out."""

from django.core.checks import Error, register

from .forges import github_app_problem


@register()
def github_app_settings(app_configs, **kwargs):
    problem = github_app_problem()
    if not problem:
        return []
    return [Error(f"GitHub App: {problem}.", hint="Complete GITHUB_APP_ID, GITHUB_APP_INSTALLATION_ID and "
                  "GITHUB_APP_PRIVATE_KEY (or GITHUB_APP_PRIVATE_KEY_PATH), or unset GITHUB_APP_ID to use "
                  "GITHUB_TOKEN.", id="worker.E001")]
