"""A tool's password flag among one-letter options written as one word (`curl -sfu user:pass`,
`ldapsearch -xwPASS`, `mysql -vpPASS`): getopt reads them as the flag, so redaction does too;
a word whose letters end at an option that takes a value (`curl -XPUT`) holds no password."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from samai.console.core.redact import MASK, redact

# (the command, its password flag's letter, where the password is in the value, letters that are
# options without a value for that tool)
TOOLS = (
    ("curl", "u", ":", "sSfLvkiI"),
    ("curl", "U", ":", "sSfLvkiI"),
    ("mysql", "p", "attached", "vBsNtr"),
    ("sshpass", "p", "all", "ev"),
    ("ldapsearch", "w", "all", "xZnvLMAtuCN"),
    ("smbclient", "U", "%", "NkgqPeEB"),
    ("http", "a", ":", "vhbjfFSdc"),
    ("redis-cli", "a", "all", "cx"),
    ("sqlcmd", "P", "all", "EXbeI"),
)
PASSWORD = st.text(st.sampled_from("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789!#*+./=?@^_~"),
                   min_size=6, max_size=24).filter(lambda p: p[0] not in "-=.")
USER = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_"), min_size=1, max_size=12)


@given(st.sampled_from(TOOLS), st.data(), PASSWORD, USER, st.booleans())
@settings(max_examples=400, deadline=None)
def test_a_password_flag_among_combined_letters_is_masked(tool, data, password: str, user: str,
                                                          attached: bool) -> None:
    command, letter, where, plain = tool
    assume(password not in user)
    before = data.draw(st.text(st.sampled_from(plain), min_size=1, max_size=4), label="letters before")
    value = {":": f"{user}:{password}", "%": f"{user}%{password}"}.get(where, password)
    if where == "attached":
        attached = True  # mysql's `-p X` asks at the terminal: X is the database
    cluster = f"-{before}{letter}"
    text = f"{command} {cluster}{value} https://h.example/x" if attached \
        else f"{command} {cluster} {value} https://h.example/x"
    shown = redact(text)
    assert password not in shown, (text, shown)
    assert shown.startswith(f"{command} {cluster}") and shown.endswith(" https://h.example/x"), shown
    if where in ":%":
        assert f"{user}{where}{MASK}" in shown, shown  # the user stays readable


# (a flag's name ending in one of these is a secret's flag by its shape: `-XKEY x` masks x)
SECRET_ENDINGS = ("KEY", "TOKEN", "SECRET", "PASS", "AUTH", "PASSWORD", "PASSWD", "PASSPHRASE", "PASSIN", "PASSOUT")


@given(st.text(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), min_size=1, max_size=8)
       .filter(lambda m: not m.endswith(SECRET_ENDINGS)))
@settings(max_examples=100, deadline=None)
def test_letters_after_an_option_that_takes_a_value_are_its_value(method: str) -> None:
    """curl -XPUT: PUT is the request method (X takes a value), not -P, -U and -T."""
    assert redact(f"curl -sX{method} https://h.example/x") == f"curl -sX{method} https://h.example/x"


def test_the_examples_of_the_finding() -> None:
    assert redact("curl -sfu user:s3cret https://h") == "curl -sfu user:*** https://h"
    assert redact("curl -sfuuser:s3cret https://h") == "curl -sfuuser:*** https://h"
    assert redact("curl -uUSER:s3cret https://h") == "curl -uUSER:*** https://h"
    assert redact("curl --user=u:s3cret https://h") == "curl --user=u:*** https://h"
    assert redact("mysql -pS3CRET shop") == "mysql -p*** shop"
    assert redact("mysql -vp shop") == "mysql -vp shop"  # asked at the terminal: shop is the database
    assert redact("openssl enc -pbkdf2 -k pw") == "openssl enc -pbkdf2 -k ***"  # one-dash long options
