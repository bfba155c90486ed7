"""The migration step that moves a model from Django's four model permissions to view plus one permission
of its own for every change (pidispatch_site/admin_mixins.py, ManagedChangesAdmin)."""

from django.db import migrations

RETIRED_ACTIONS = ("add", "change", "delete")


def retire_change_permissions(app_label: str, *model_names: str) -> migrations.RunPython:
    """Deletes the models' add/change/delete permissions, so that none is left to grant that does nothing.
    Whoever held one keeps the view permission: they saw the rows before and still do, read-only. A fresh
    database has none yet (Django creates permissions after migrating), and nothing happens."""

    def forwards(apps, schema_editor):
        ContentType = apps.get_model("contenttypes", "ContentType")
        Permission = apps.get_model("auth", "Permission")
        for model_name in model_names:
            content_type = ContentType.objects.filter(app_label=app_label, model=model_name).first()
            if content_type is None:
                continue
            retired = Permission.objects.filter(
                content_type=content_type, codename__in=[f"{action}_{model_name}" for action in RETIRED_ACTIONS])
            if not retired.exists():
                continue
            view, _ = Permission.objects.get_or_create(
                content_type=content_type, codename=f"view_{model_name}",
                defaults={"name": f"Can view {apps.get_model(app_label, model_name)._meta.verbose_name}"})
            for permission in retired:
                view.user_set.add(*permission.user_set.all())
                view.group_set.add(*permission.group_set.all())
            retired.delete()

    return migrations.RunPython(forwards, migrations.RunPython.noop)
