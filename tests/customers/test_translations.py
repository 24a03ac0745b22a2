"""The customer pages' translations: every string they mark is translated, and the
committed catalogue (.mo) is the one its source (.po) compiles to."""

from __future__ import annotations

import gettext
import io
import re
from pathlib import Path

import pytest
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "customers" / "locale"
MARKED_IN = [
    *(ROOT / "templates" / "customers").glob("*.html"),
    *(ROOT / "customers").rglob("*.py"),
]
LANGUAGES = [code for code, _ in settings.LANGUAGES if code != "en"]


def _marked() -> set[str]:
    """The strings the customer pages mark for translation, as their msgids."""
    found: set[str] = set()
    for path in MARKED_IN:
        text = path.read_text()
        found |= set(re.findall(r"""{% translate ["'](.+?)["'] %}""", text))
        found |= set(re.findall(r"""\b_\(\s*"(.+?)"\s*\)""", text, re.S))
        for block in re.findall(
            r"{% blocktranslate[^%]*%}(.+?){% endblocktranslate %}", text, re.S
        ):
            found.add(re.sub(r"{{ (\w+) }}", r"%(\1)s", block))
    return found


def _po(language: str):
    with open(LOCALE / language / "LC_MESSAGES" / "django.po", "rb") as source:
        return read_po(source, locale=language)


def test_at_least_one_language_besides_english_is_shipped():
    assert LANGUAGES and all((LOCALE / code / "LC_MESSAGES").is_dir() for code in LANGUAGES)


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_marked_string_is_translated(language):
    catalog = _po(language)
    translated = {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}
    marked = _marked()
    assert len(marked) > 20
    assert sorted(marked - set(translated)) == []


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_committed_mo_is_the_po_compiled(language):
    compiled = io.BytesIO()
    write_mo(compiled, _po(language))
    compiled.seek(0)
    expected = gettext.GNUTranslations(compiled)._catalog  # type: ignore[attr-defined]
    with open(LOCALE / language / "LC_MESSAGES" / "django.mo", "rb") as committed:
        shipped = gettext.GNUTranslations(committed)._catalog  # type: ignore[attr-defined]
    strip = {key: value for key, value in expected.items() if key}
    assert {key: value for key, value in shipped.items() if key} == strip
