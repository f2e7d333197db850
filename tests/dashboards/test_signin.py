"""The pages' session cookie (dashboards/pages.py): only the exact HMAC of the token signs
a browser in; what an attacker can send in a Cookie header cannot."""

from __future__ import annotations

import pytest

from cmdare.dashboards.pages import COOKIE, cookie_ok, session_value

TOKEN = "s3cret-token"


def test_the_exact_session_value_signs_in() -> None:
    v = session_value(TOKEN)
    assert cookie_ok({b"cookie": f"{COOKIE}={v}".encode()}, TOKEN)
    assert cookie_ok({b"cookie": f"theme=dark; {COOKIE}={v}; x=1".encode()}, TOKEN)


@pytest.mark.parametrize("cookie", [
    "",  # no cookie
    f"{COOKIE}=",  # empty value: a prefix of everything
    f"{COOKIE}={session_value(TOKEN)[:1]}",  # a prefix
    f"{COOKIE}={session_value(TOKEN)[:-1]}",  # all but the last character
    f"{COOKIE}={session_value(TOKEN)}0",  # the value and more
    f"{COOKIE}={session_value(TOKEN).upper()}",
    f"{COOKIE}={TOKEN}",  # the token itself is not the session
    f"{COOKIE}={session_value('other-token')}",  # another collector's session
    f"{COOKIE.upper()}={session_value(TOKEN)}",  # another cookie's name
    f"x{COOKIE}={session_value(TOKEN)}",
    f"{COOKIE}",  # a name alone
])
def test_anything_but_the_exact_value_is_refused(cookie: str) -> None:
    assert not cookie_ok({b"cookie": cookie.encode()}, TOKEN)
