# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test check lint image install clean help

run: $(INSTALLED)
	$(PY) -m devtools.stack run

# PART=<folder> runs one part of the suite (tests/<part>/; `make help` lists them). DB=postgres starts a private
# PostgreSQL and runs the tests marked `database` (those it answers differently, and the fleet drills), as .ci/run's
# second pass does.
test: $(INSTALLED)
	$(PY) -m devtools.stack test $(if $(DB),--db $(DB)) -- $(if $(PART),tests/$(PART)) $(PYTEST_ARGS)

# The loop of a minute or two: lint, migrations in step with the models, and the tests that need no service.
check: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(PY) manage.py makemigrations --check --dry-run -v 1
	$(PY) -m devtools.stack check -- $(PYTEST_ARGS)

help:
	@echo "make run                  the platform and one demo delivery, until Ctrl-C"
	@echo "make test                 the whole suite (SQLite), private Redis and Docker engines"
	@echo "make test DB=postgres     a private PostgreSQL: the database-sensitive tests and the fleet drills"
	@echo "make test PART=<folder>   one part; what its code is:"
	@echo "    receiver   apps/receiver: webhooks of the four forges, triggers, the inbox, cron, the poller"
	@echo "    worker     apps/worker: the gates, the job container, egress, publishing, sessions, doctor"
	@echo "    fleet      apps/fleet: the host registry, pauses, drains, cancel, routing, the fleet panel"
	@echo "    hosts      the fleet drills: three hosts in network namespaces (DB=postgres; root)"
	@echo "    api        the DRF API and its schema (apps/*/api.py)"
	@echo "    admin      the Django admin pages, in Chromium too"
	@echo "    site       pidispatch_site, devtools (make run, make test), deploy units, settings, metrics"
	@echo "    (a change in apps/worker reaches worker, fleet, hosts and site too)"
	@echo "make check                lint, makemigrations --check, the service-free tests (no service started)"
	@echo "make lint                 ruff"
	@echo "make image                the production job image"
	@echo "PYTEST_ARGS='-k name'     passed on to pytest; PI_TEST_PROCESSES=N pytest processes"

# ruff (pyflakes, pycodestyle at 120 columns, import order, pyupgrade, bugbear, return, simplify, complexity at
# most 25; pyproject.toml says which rules).
lint: $(INSTALLED)
	$(VENV)/bin/ruff check .

# The production job image on this worker host (docker build where a registry answers, else from packages).
image: $(INSTALLED)
	$(PY) -m devtools.jobimage

install: $(INSTALLED)

# Reinstalled whenever pyproject.toml changes.
$(INSTALLED): pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		{ echo "==> installing python3-venv (apt-get)"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) var/static
