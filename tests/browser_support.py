"""A real browser for the admin's pages: Playwright driving Debian's Chromium (never `playwright install`).
Fixture: `browser_page`."""

import os

import pytest
from django.db import connections

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser_page(monkeypatch):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls here are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no browser at {CHROMIUM}: install Debian's chromium (apt-get install chromium); "
                    "`make test` installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu", "--no-first-run",
                  "--disable-component-update", "--disable-sync"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(20_000)
        yield page
        browser.close()
        # The test's ORM calls ran inside Playwright's context, whose database connection Django's own
        # teardown cannot see: close it here, or PostgreSQL refuses to drop the test database.
        connections.close_all()
