"""Database URLs in messages: the password in every form libpq accepts, redacted.

Also what a libpq keyword/value string is (:func:`is_keyword_string`).

A PostgreSQL URL can carry its password as userinfo (``user:pw@host``), as a
query parameter (``?password=pw``), percent-encoded or not, and libpq reads
an unescaped ``/``, ``?`` or ``@`` in it in ways that scatter pieces of it
over other fields (``user:pa/ss@host`` is host ``user``, port ``pa``, database
``ss@host``). A URL psycopg cannot parse at all is echoed in psycopg's own
error message.

So a :class:`Redactor` does not try to rebuild a clean URL: it collects every
text that may be (part of) the password (what psycopg's ``conninfo`` parser
finds, what a plain reading of the text finds, percent-decoded and not) and
replaces each wherever it occurs, in the URL shown and in every message.
Nothing here imports psycopg until a URL is actually parsed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
#: A URL's scheme and ``://``, of any scheme (``postgresql+psycopg://`` too): where
#: ``open_store`` refuses a URL it does not take, and where output masks a password.
URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: libpq's connection keywords (PostgreSQL 17, ``libpq-connect.html``): a text of
#: ``name=value`` pairs with one of them is a keyword string, never a file name.
LIBPQ_KEYWORDS = frozenset(
    """host hostaddr port dbname user password passfile require_auth channel_binding
    connect_timeout client_encoding options application_name fallback_application_name
    keepalives keepalives_idle keepalives_interval keepalives_count tcp_user_timeout
    replication gssencmode sslmode sslnegotiation requiressl sslcompression sslcert sslkey
    sslpassword sslcertmode sslrootcert sslcrl sslcrldir sslsni requirepeer
    ssl_min_protocol_version ssl_max_protocol_version krbsrvname gsslib gssdelegation
    service target_session_attrs load_balance_hosts""".split()
)
_KEYWORD_START = re.compile(r"\s*[A-Za-z_]+\s*=")
_KEYWORD = re.compile(r"(?:^|\s)([A-Za-z_]+)\s*=")
#: Pieces of a password split by libpq's URL syntax are secrets too, down to this length.
_MIN_PIECE = 3
#: A URL's ``password=`` value ends at the next ``&name=``: an unescaped ``&`` inside
#: it (``password=a&b``) leaves a piece libpq names in its error ("b"), and libpq
#: has no fragment or spaces, so a ``#`` or a space is part of it.
_QUERY_PASSWORD = re.compile(
    r"(?:^|[?&\s])password\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^&]|&(?![A-Za-z_]+=))*)", re.I
)
#: In a keyword string a value ends at its closing quote (a quote left open runs
#: to the end), else at white space. Both readings are taken, and the second also
#: takes the words after the value up to the next ``name=``: libpq names such a
#: stray word of a password with a space (or after ``''``) in its error.
_KEYWORD_PASSWORDS = (
    re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*(?:'|$))", re.I),
    re.compile(r"(?:^|\s)password\s*=\s*(\S*(?:\s+(?![A-Za-z_]+\s*=)\S+)*)", re.I),
)


def is_keyword_string(text: str) -> bool:
    """True when ``text`` is a libpq keyword/value connection string: it starts
    with ``name=`` and one of its ``name=`` pairs is a libpq keyword
    (``host=db dbname=x``, ``dbname = x``, ``bogus=1 password=pw``).

    libpq itself takes any text with an ``=`` for one; a SQLite file name may
    hold ``=`` too, so only a known keyword counts (``my=file.db`` is a file; a
    file that must be named like a keyword string is written ``./host=x.db``)."""
    if _KEYWORD_START.match(text) is None:
        return False
    return any(m.group(1).lower() in LIBPQ_KEYWORDS for m in _KEYWORD.finditer(text))


def _parsed_password(url: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    try:
        value = conninfo_to_dict(url).get("password")
    except Exception:  # psycopg.ProgrammingError and whatever else it raises on bad text
        return None
    return str(value) if value else None


def _userinfo_password(url: str) -> str | None:
    rest = url.split("://", 1)[1] if "://" in url else ""
    before_query = rest.split("?", 1)[0]
    for text in (before_query, rest):  # the second for a password with an unescaped "?"
        at = text.rfind("@")
        if at > 0 and ":" in text[:at]:
            return text[:at].split(":", 1)[1]
    return None


def secrets_of(url: str) -> list[str]:
    """Every text in ``url`` that is, or may be part of, its password (longest first)."""
    found: set[str] = set()
    candidates = [_parsed_password(url), _userinfo_password(url)]
    patterns = (_QUERY_PASSWORD,) if "://" in url else _KEYWORD_PASSWORDS
    candidates += [m.group(1).strip("'") for p in patterns for m in p.finditer(url)]
    for secret in candidates:
        if not secret:
            continue
        for form in (secret, unquote(secret)):
            found.add(form)
            found.update(p for p in re.split(r"[/?#@&:'\s]", form) if len(p) >= _MIN_PIECE)
    return sorted(found, key=lambda s: (-len(s), s))


class Redactor:
    """Removes the passwords of some database URLs from any text."""

    def __init__(self, urls: Iterable[str]) -> None:
        found: set[str] = set()
        for url in urls:
            found.update(secrets_of(url))
        self._secrets = sorted(found, key=lambda s: (-len(s), s))

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __call__(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


def redact_url(url: str) -> str:
    """``url`` as it may be shown: every password form replaced by ``***``."""
    return Redactor([url])(url)
