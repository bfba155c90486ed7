"""The admin's pause window form: the weekdays as checkboxes (the model keeps them as a list of `mon`..`sun`)."""

from __future__ import annotations

from django import forms

from apps.worker.gates.quiet_hours import WEEKDAYS
from apps.worker.models import PauseWindow

DAY_NAMES = dict(zip(WEEKDAYS, ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
                     strict=True))


class PauseWindowForm(forms.ModelForm):
    days = forms.MultipleChoiceField(
        choices=list(DAY_NAMES.items()), required=False, widget=forms.CheckboxSelectMultiple,
        help_text="The weekdays an occurrence may start on; none ticked means every day.",
    )

    class Meta:
        model = PauseWindow
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.is_bound and isinstance(self.instance.days, list):
            # Stored as the trigger file writes them; older rows may say "Monday" or "MON".
            self.initial["days"] = [day.lower()[:3] for day in self.instance.days if isinstance(day, str)]

    def clean_days(self) -> list[str]:
        chosen = set(self.cleaned_data["days"])
        return [day for day in WEEKDAYS if day in chosen]  # week order, whatever order they were ticked in
