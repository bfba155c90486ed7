from django.conf import settings
from django.contrib import admin
from django.urls import path, re_path

from apps.receiver import views as receiver_views

from .health import healthz

urlpatterns = [
    re_path(r"^hooks/github/?$", receiver_views.github_hook, name="hook-github"),
    path("healthz", healthz, name="healthz"),
]

if not settings.PI_PUBLIC_EDGE:
    urlpatterns += [path("admin/", admin.site.urls)]
