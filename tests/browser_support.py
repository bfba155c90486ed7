"""A real browser for the admin's pages: Playwright driving Debian's Chromium (never `playwright install`).
Fixtures: `browser_page`, and `operator_page` (the admin, logged in as a superuser); `screenshot` keeps a page's
picture under test-results/."""

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


@pytest.fixture
def operator_page(live_server, browser_page):
    """The admin in the browser, logged in as the superuser `operator`."""
    from django.contrib.auth.models import User

    User.objects.create_superuser("operator", password="a-long-test-password")
    page = browser_page
    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#status-strip")
    return page


def screenshot(folder, page, name: str) -> None:
    """The whole page as `<folder>/<name>.png` (kept for a reviewer), and not a blank one."""
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    assert (folder / f"{name}.png").stat().st_size > 10_000
