"""The one scrubber of a run's log and of what the worker posts (apps/worker/scrubbing.py): a secret is found and
scrubbed as it is, in base64 at each of its three alignments (either alphabet), in hex (either case), URL-encoded,
and split by whitespace or newlines; ordinary text is left alone. Property tests over random secrets and the text
around them, through run_logs.captured (what a run's log keeps)."""

import base64
import codecs
import json
import urllib.parse

from django.conf import settings as django_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from apps.worker import run_logs
from apps.worker.scrubbing import INVISIBLE, SCRUBBED, Scrubber

set_hypothesis_home_dir(str(django_settings.VAR_DIR / "hypothesis"))  # not a .hypothesis/ folder in the checkout

KEY = "sk-ant-api03-Zq9/Xw+Yv_Tu-8RsQp7oN6mL5kJ4=="
PROPERTY_SETTINGS = hypothesis_settings(max_examples=300, deadline=None, derandomize=True, database=None,
                                        suppress_health_check=[HealthCheck.too_slow])
secrets = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_categories=("Cs",)),
                  min_size=8, max_size=64).filter(lambda secret: secret not in SCRUBBED)  # "[scrubbe" is in it
surroundings = st.text(max_size=40)


def split(text: str, every: int, separator: str) -> str:
    return separator.join(text[index:index + every] for index in range(0, len(text), every))


def forms(secret: str, before: bytes, after: bytes) -> dict[str, str]:
    """The ways a job's output or summary may carry the secret: inside longer encoded text, as an agent writes it."""
    data = before + secret.encode() + after
    encoded = base64.b64encode(data).decode()
    return {
        "as it is": secret,
        "in a JSON string": json.dumps(secret)[1:-1],
        "base64": encoded,
        "url-safe base64": base64.urlsafe_b64encode(data).decode(),
        "base64 wrapped at 76": split(encoded, 76, "\n"),
        "hex": data.hex(),
        "HEX": data.hex().upper(),
        "url-encoded": urllib.parse.quote(secret, safe=""),
        "url-encoded as a form": urllib.parse.quote_plus(secret),
        "split by newlines": split(secret, 5, "\n"),
        "split by spaces": split(secret, 3, " "),
        "split in a JSON string": split(secret, 4, "\\n"),
        "hex split in pairs": " ".join(split(data.hex(), 2, " ").split()),
        "reversed": secret[::-1],
        "rot13": codecs.encode(secret, "rot13"),
        "base32": base64.b32encode(data).decode(),
        "base32 in lower case": base64.b32encode(data).decode().lower(),
    }


@given(secret=secrets, before=st.binary(max_size=5), after=st.binary(max_size=5), head=surroundings,
       tail=surroundings)
@hypothesis_settings(PROPERTY_SETTINGS)
def test_every_form_of_a_secret_is_scrubbed_from_the_log(secret, before, after, head, tail):
    scrubber = Scrubber([secret])
    for name, form in forms(secret, before, after).items():
        text = f"{head} {form} {tail}"
        assert scrubber.finds(text), name
        log = run_logs.captured(text.encode(), f"summary: {text}", [secret])
        assert not scrubber.finds(log.output) and not scrubber.finds(log.summary), (name, log.output)
        assert SCRUBBED in log.output and SCRUBBED in log.summary


def test_the_three_base64_alignments_of_a_key_inside_a_longer_text():
    scrubber = Scrubber([KEY])
    for offset in range(6):
        encoded = base64.b64encode(b"Authorization: Bearer "[:offset] + KEY.encode() + b"\r\n").decode()
        assert scrubber.finds(encoded), offset
        assert scrubber.scrub(encoded).count(SCRUBBED) == 1
    assert not scrubber.finds(base64.b64encode(KEY[:-6].encode()).decode())  # less than the key is not the key


@given(text=st.text(max_size=400))
@hypothesis_settings(PROPERTY_SETTINGS)
def test_ordinary_text_is_left_alone(text):
    assert Scrubber([KEY, "ghp_0123456789abcdefghijABCDEFGHIJ"]).scrub(text) == text or KEY in text


def test_a_short_secret_is_looked_for_only_as_it_is():
    scrubber = Scrubber(["abc", ""])
    assert scrubber.scrub("abc and a b c and 616263") == f"{SCRUBBED} and a b c and 616263"
    assert Scrubber([]).scrub("anything") == "anything" and not Scrubber([""]).finds("anything")


def rendered_forms(secret: str) -> dict[str, str]:
    """What a forge's page shows as the secret itself, though the text as written does not hold it."""
    return {
        "HTML entities": "".join(f"&#{ord(char)};" for char in secret),
        "named and hex entities": "".join("&amp;" if char == "&" else f"&#x{ord(char):x};" for char in secret),
        "markdown escapes": "".join("\\" + char if not char.isalnum() and char.isascii() else char
                                    for char in secret),
        "a comment inside": f"{secret[:4]}<!-- -->{secret[4:]}",
        "a tag inside": f"{secret[:3]}<span>{secret[3:7]}</span>{secret[7:]}",
        "zero-width spaces": "\u200b".join(secret),
        "soft hyphens": "\u00ad".join(secret),
        "word joiners and a BOM": "\u2060".join(secret) + "\ufeff",
        "emphasis inside": f"{secret[:4]}**{secret[4:]}**",
    }


# Not Markdown's or HTML's own characters, no control character (a page shows `&#145;` as the quote Windows-1252
# has there, HTML's rule, not as U+0091, and `&#127;` as nothing), and nothing a page never shows (a soft hyphen
# inside the secret itself: what is shown of it is then another, shorter text).
@given(secret=secrets.filter(lambda secret: not set(secret) & set("*_~`<>&\\;")
                             and not any(0x7F <= ord(char) <= 0x9F for char in secret)
                             and not INVISIBLE.search(secret)),
       head=surroundings, tail=surroundings)
@hypothesis_settings(PROPERTY_SETTINGS)
def test_every_form_a_forges_page_shows_as_the_secret_is_found(secret, head, tail):
    scrubber = Scrubber({"A_SECRET": secret})
    for name, form in rendered_forms(secret).items():
        text = f"{head} {form} {tail}"
        assert scrubber.finds(text), name
        assert scrubber.which(text) == "A_SECRET", name


def test_which_names_the_secret_a_text_holds_never_anothers():
    scrubber = Scrubber({"ANTHROPIC_API_KEY": KEY, "GITHUB_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ"})
    assert scrubber.which("token ghp_0123456789abcdefghijABCDEFGHIJ") == "GITHUB_TOKEN"
    assert scrubber.which(base64.b64encode(KEY.encode()).decode()) == "ANTHROPIC_API_KEY"
    assert scrubber.which("nothing of either") is None
