"""Every variable pidispatch reads is documented: in the settings catalog (pidispatch_site/settings_catalog.py) with
settings.py's own default, in contrib/pidispatch.env.example (generated from the catalog) and in the README's
settings table. A variable added to settings.py without the three fails here, naming what to do."""

import json
import re

from devtools import env_example
from pidispatch_site.settings_catalog import all_settings
from tests.settings_source import COMPUTED, ROOT, environment_reads

TEST_ONLY = {"PIDISPATCH_TEST_STACK"}  # the test stack's switch, never a deployment's
GUNICORN_CONF = ROOT / "contrib" / "gunicorn.conf.py"
CATALOG = {setting.name: setting for setting in all_settings()}
HOW = ("add it to pidispatch_site/settings_catalog.py, run `python -m devtools.env_example`, and give it a row in "
       "the README's settings table")


def read_variables() -> dict[str, object]:
    reads = {**environment_reads(GUNICORN_CONF), **environment_reads()}
    return {name: default for name, default in reads.items() if name not in TEST_ONLY}


def readme_table_variables() -> set[str]:
    """The names in the Variable column of the README's settings table."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| Variable | Default | Meaning |")
    rows = readme[start:readme.index("\n\n", start)].splitlines()[2:]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1])}


def as_env_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_variable_read_is_in_the_catalog():
    missing = sorted(set(read_variables()) - set(CATALOG))
    assert not missing, f"not in the settings catalog: {', '.join(missing)}: {HOW}"


def test_the_catalogs_defaults_are_the_code_s():
    for name, default in read_variables().items():
        entry = CATALOG[name]
        if default is COMPUTED:
            assert entry.default is None and entry.note, f"{name}: its default is worked out at start; say how (note)"
        elif default is None:
            assert entry.default in ("", None), f"{name} has no default in the code"
        else:
            assert entry.default == as_env_value(default), f"{name}: the code's default is {default!r}"
    for entry in CATALOG.values():
        assert entry.default is not None or entry.note, f"{entry.name}: a default or a note"


def test_every_catalog_entry_is_read_somewhere():
    """No entry outlives the variable: each is read by pidispatch's code, its gunicorn file or the Docker client."""
    sources = [path for folder in ("apps", "pidispatch_site", "contrib") for path in (ROOT / folder).rglob("*")
               if path.suffix in (".py", ".json") and path.name != "settings_catalog.py"]
    text = "\n".join(path.read_text() for path in sources)
    stale = [name for name in CATALOG if name != "DOCKER_HOST" and f'"{name}"' not in text]
    assert not stale, f"in the catalog, read nowhere: {stale}"


def test_the_example_environment_file_is_the_catalog_s():
    example = env_example.EXAMPLE.read_text()
    assert example == env_example.render(), "contrib/pidispatch.env.example is stale: python -m devtools.env_example"
    listed = re.findall(r"^#([A-Z][A-Z0-9_]*)=", example, re.MULTILINE)
    assert sorted(listed) == sorted(CATALOG) and len(listed) == len(set(listed))
    assert env_example.main(["--check"]) == 0


def test_the_readme_table_lists_every_variable():
    table = readme_table_variables()
    missing = sorted(set(CATALOG) - table)
    assert not missing, f"not in the README's settings table (its Variable column): {', '.join(missing)}"
    registry = json.loads((ROOT / "apps" / "worker" / "sandbox" / "pi_registry.json").read_text())["providers"]
    provider_keys = {provider.get("keyVariable") for provider in registry.values()}
    unknown = sorted(table - set(CATALOG) - provider_keys)
    assert not unknown, f"in the README's table but read by nothing: {', '.join(unknown)}"
