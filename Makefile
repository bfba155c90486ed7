# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test lint image install clean

run: $(INSTALLED)
	$(PY) -m devtools.stack run

# PART=receiver|worker|fleet|api|admin|site|hosts runs one part of the suite (tests/<part>/).
test: $(INSTALLED)
	$(PY) -m devtools.stack test -- $(if $(PART),tests/$(PART)) $(PYTEST_ARGS)

# ruff (pyflakes, pycodestyle at 120 columns, import order, pyupgrade, bugbear, return, simplify; pyproject.toml
# says which rules).
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
