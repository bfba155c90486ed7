"""The trigger form: the type first, then only its fields, in words a person uses; lists as comma-separated text;
one clear error per mistake. The rule's validation is still validation.py's (the importer and the API share it)."""

import html
import re

import pytest

from apps.receiver.models import Trigger

pytestmark = pytest.mark.django_db

ADD = "/admin/receiver/trigger/add/"


def errors_of(page: str) -> list[str]:
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)


def test_adding_starts_by_choosing_the_type(admin_client):
    page = admin_client.get(ADD).content.decode()
    for value, name in (("label", "Label"), ("comment", "Comment"), ("pull_request", "Pull request"),
                        ("issue", "Issue closed"), ("cron", "Schedule")):
        assert f'href="?on_type={value}"' in page and f">{name}</a>" in page
    assert 'name="flow"' not in page  # no form yet


def test_a_label_trigger_shows_only_its_fields_with_plain_names(admin_client):
    page = admin_client.get(ADD + "?on_type=label").content.decode()
    assert "Labels, any of" in page and "e.g. pi, urgent" in page
    assert 'name="label_any"' in page and 'name="flow"' in page
    for other in ('name="cron_pattern"', 'name="phrase"', 'name="folder"', 'name="actions"'):
        assert other not in page
    assert "On.any" not in page and "Run.waitFor" not in page and "ancestor" not in page
    assert ">[]<" not in page and 'value="[]"' not in page  # lists are not prefilled with JSON


def test_comma_separated_labels_are_saved_as_a_list_and_shown_as_text(admin_client):
    response = admin_client.post(ADD + "?on_type=label", {
        "on_type": "label", "enabled": "on", "position": 1, "label_any": "pi, urgent", "label_none": "wontfix",
        "kind": "github", "flow": "fix-bug"})
    assert response.status_code == 302, errors_of(response.content.decode())
    rule = Trigger.objects.get()
    assert rule.label_any == ["pi", "urgent"] and rule.label_none == ["wontfix"] and rule.label_all == []

    page = admin_client.get(f"/admin/receiver/trigger/{rule.pk}/change/").content.decode()
    assert 'value="pi, urgent"' in page
    # JSON still works, for whoever pastes from triggers.json.
    admin_client.post(f"/admin/receiver/trigger/{rule.pk}/change/", {
        "on_type": "label", "enabled": "on", "position": 1, "label_any": '["pi", "later"]', "kind": "github",
        "flow": "fix-bug"})
    rule.refresh_from_db()
    assert rule.label_any == ["pi", "later"]


def test_one_mistake_gives_one_error_naming_the_field_with_an_example(admin_client):
    page = admin_client.post(ADD + "?on_type=label", {
        "on_type": "label", "position": 1, "label_any": '["pi", ', "kind": "github", "flow": "fix-bug",
    }).content.decode()

    errors = errors_of(page)
    assert len(errors) == 1, errors
    assert "Labels, any of" in errors[0] and "e.g. pi, urgent" in errors[0]
    assert "Enter a valid JSON" not in page and "positive selector" not in page
    assert not Trigger.objects.exists()


def test_validation_messages_use_the_forms_names(admin_client):
    page = admin_client.post(ADD + "?on_type=label", {
        "on_type": "label", "position": 1, "label_none": "x", "kind": "github", "flow": "Not A Flow",
    }).content.decode()
    assert "“Flow” must be 1-64 lowercase letters" in page
    assert "positive selector" in page and "“Labels, any of”" in page
    assert "run.flow" not in page and "on.any" not in page


def test_a_schedule_runs_in_a_folder_and_needs_no_forge(admin_client):
    page = admin_client.get(ADD + "?on_type=cron").content.decode()
    assert "Schedule name" in page and "Folder on the worker host" in page and 'name="label_any"' not in page

    response = admin_client.post(ADD + "?on_type=cron", {
        "on_type": "cron", "enabled": "on", "position": 1, "cron_id": "nightly", "cron_pattern": "0 6 * * 1-5",
        "kind": "local", "folder": "/srv/code/app", "flow": "upgrade", "task": "Upgrade the linter config."})
    assert response.status_code == 302, errors_of(response.content.decode())
    assert Trigger.objects.get().folder == "/srv/code/app"


def test_changing_the_type_drops_the_old_types_fields(admin_client, label_trigger):
    chooser = admin_client.get(f"/admin/receiver/trigger/{label_trigger.pk}/change/?choose_type=1").content.decode()
    assert 'href="?on_type=comment"' in chooser and "its type now" in chooser

    response = admin_client.post(f"/admin/receiver/trigger/{label_trigger.pk}/change/?on_type=comment", {
        "on_type": "comment", "enabled": "on", "position": 0, "phrase": "@pi", "kind": "github", "flow": "fix-bug"})
    assert response.status_code == 302, errors_of(response.content.decode())
    label_trigger.refresh_from_db()
    assert label_trigger.on_type == "comment" and label_trigger.label_any == []


def test_wait_conditions_and_secrets_read_as_text(admin_client):
    response = admin_client.post(ADD + "?on_type=label", {
        "on_type": "label", "position": 1, "label_any": "pi", "kind": "github", "flow": "fix-bug",
        "wait_for": "after 2026-12-01T09:00:00Z, profile ci-green", "secrets": "NPM_TOKEN=npm/ci",
        "exclude_tools": "bash, write"})
    assert response.status_code == 302, errors_of(response.content.decode())
    rule = Trigger.objects.get()
    assert rule.wait_for == [{"after": "2026-12-01T09:00:00Z"}, {"profile": "ci-green"}]
    assert rule.secrets == {"NPM_TOKEN": "npm/ci"} and rule.exclude_tools == ["bash", "write"]
    page = admin_client.get(f"/admin/receiver/trigger/{rule.pk}/change/").content.decode()
    assert "after 2026-12-01T09:00:00Z, profile ci-green" in page and 'value="NPM_TOKEN=npm/ci"' in page


def test_a_trigger_has_a_name_the_list_and_its_runs_show(admin_client):
    response = admin_client.post(ADD + "?on_type=label", {
        "on_type": "label", "name": "Fix labelled bugs", "enabled": "on", "position": 1, "label_any": "pi",
        "kind": "github", "flow": "fix-bug"})
    assert response.status_code == 302, errors_of(response.content.decode())
    rule = Trigger.objects.get()
    assert rule.name == "Fix labelled bugs" and str(rule) == "Fix labelled bugs"


def list_columns(page: str) -> list[str]:
    headers = re.findall(r'<th scope="col"[^>]*>.*?<div class="text">(.*?)</div>', page, re.S)
    return [re.sub(r"<[^>]+>", "", header).strip() for header in headers if re.sub(r"<[^>]+>", "", header).strip()]


def test_the_list_says_what_fires_each_trigger_in_words(admin_client):
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from apps.worker.models import Outcome, Run

    named = Trigger.objects.create(position=0, name="Review PRs", kind="github", on_type="label", label_any=["pi"],
                                   flow="review", max_cost_usd=Decimal("0.5"))
    Trigger.objects.create(position=1, kind="azure", on_type="comment", phrase="@pi", flow="triage",
                           repository="web")
    Trigger.objects.create(position=2, kind="local", on_type="cron", cron_id="nightly", cron_pattern="0 6 * * *",
                           folder="/srv/code/app", flow="upgrade", task="Upgrade.")
    fired = timezone.now() - timedelta(hours=2)
    Run.objects.create(job_id="gh-1", attempt=1, kind="github", trigger=named, started_at=fired, ended_at=fired,
                       outcome=Outcome.COMPLETED)

    page = admin_client.get("/admin/receiver/trigger/").content.decode()

    assert list_columns(page) == ["Order", "Name", "Forge", "Type", "Repositories", "Fires on", "Flow", "Max cost",
                                  "Enabled", "Last fired", "Runs", "One-shot"]
    assert "run.kind" not in page.lower() and "on.type" not in page.lower()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "Review PRs" in text and "Comment #1" in text and "Schedule #2" in text  # unnamed: type and order
    assert "$0.50" in text and "the deployment's" in text
    assert "web (in the work item's project)" in text and "/srv/code/app" in text and "every repository" in text
    assert fired.strftime("%Y-%m-%d %H:%M") in text and "never" in text
    filters = admin_client.get("/admin/receiver/trigger/?kind=github").content.decode()
    assert "By forge" in filters and "By type" in filters and "By run.kind" not in filters


def test_order_is_one_word_on_the_form_and_the_list(admin_client, label_trigger):
    form = admin_client.get(f"/admin/receiver/trigger/{label_trigger.pk}/change/").content.decode()
    assert "Order" in form and "Position" not in form
    assert "Position" not in admin_client.get("/admin/receiver/trigger/").content.decode()


def test_a_trigger_an_earlier_one_always_beats_is_named_at_save_on_the_list_and_by_doctor(admin_client):
    """Same order and match as an existing trigger: it would save silently and never fire."""
    from apps.worker import doctor

    first = {"on_type": "label", "enabled": "on", "position": 1, "label_any": "pi", "kind": "github", "flow": "a"}
    assert admin_client.post(ADD + "?on_type=label", {**first, "name": "First"}).status_code == 302
    assert [f.status for f in doctor.check_triggers()] == [doctor.OK]

    saved = admin_client.post(ADD + "?on_type=label", {**first, "name": "Second", "label_any": "pi",
                                                      "flow": "b"}, follow=True)
    said = html.unescape(saved.content.decode())
    assert "“Second” (position 1) never fires: “First” (position 1) comes first" in said
    assert Trigger.objects.count() == 2  # said, not refused
    listed = html.unescape(admin_client.get("/admin/receiver/trigger/").content.decode())
    assert "“Second” (position 1) never fires" in listed
    (finding,) = doctor.check_triggers()
    assert finding.status == doctor.WARN and "“Second” (position 1) never fires" in finding.finding

    # Another label, or another forge, is another match: nothing said.
    Trigger.objects.filter(name="Second").update(label_any=["urgent"])
    assert [f.status for f in doctor.check_triggers()] == [doctor.OK]
