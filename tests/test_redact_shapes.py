"""Every shape a credential takes on a command line, in a log line or in JSON is redacted, for the
whole class of each shape: hypothesis makes the secrets and the text around them. The secret
never survives; the ordinary words around it do (a port after `-p`, `--max-tokens 8`, a user
name before its password), and redacting again changes nothing."""

from __future__ import annotations

import json
import string
from urllib.parse import quote

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from samai.console.core.redact import redact

FUZZ = settings(max_examples=80, deadline=None, database=None)
B62 = string.ascii_letters + string.digits
B64URL = B62 + "_-"
# A password as a command line carries it unquoted: no blanks, quotes or shell separators.
PASSWORD_CHARS = B62 + "._~+/=-@%:!#^*?"


def _text(chars: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(chars, min_size=low, max_size=high)


passwords = _text(PASSWORD_CHARS, 6, 30).filter(lambda v: not v.startswith(("-", "$")))
users = st.from_regex(r"[a-z][a-z0-9._-]{0,11}", fullmatch=True)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}\.example", fullmatch=True)
quotes = st.sampled_from(["", "'", '"'])

# Where a secret stands: each context keeps words that look like secrets' neighbours but are not.
ORDINARY = ("python train.py --max-tokens 8 --port 8080", "ssh -p 2222 op@gpu-box", "llama-server -p 8080 -c 4096",
            "docker run -p 8080:80 -u 1000:1000 img", "mysql -P 3306 -h db.example -p shop", "python -u eval.py",
            "export PWD=/srv/run", "tests PASS=12", "curl -s -o out.json",
            "gguf set-kv m.gguf tokenizer.ggml.add_bos_token=true --out o.gguf")


@st.composite
def contexts(draw, fragment: str) -> tuple[str, list[str]]:
    """fragment inside a command line, a log line or a JSON record; the words that must stay."""
    before, after = draw(st.sampled_from(ORDINARY)), draw(st.sampled_from(ORDINARY))
    kind = draw(st.sampled_from(["command", "log", "json"]))
    if kind == "command":
        text = f"{before} && {fragment} ; {after}"
    elif kind == "log":
        text = f"2024-05-01 12:00:03 INFO [runner] {before}\nexec: {fragment} (attempt 2)\n{after}"
    else:
        text = json.dumps({"cmd": fragment, "ordinary": before, "then": after, "n": 3})
    return text, [before, after]


def _check(text: str, secrets: list[str], kept: list[str]) -> None:
    for secret in secrets:
        assume(text.count(secret) == 1)  # a secret that is also an ordinary word cannot tell
    out = redact(text)
    assert [s for s in secrets if s in out] == [], out
    assert [k for k in kept if k not in out] == [], out
    assert redact(out) == out


# ------------------------------------------------------------------ the shapes


@st.composite
def presigned_urls(draw) -> tuple[str, list[str], list[str]]:
    """An S3, GCS or Azure pre-signed URL (or an API URL with its key): the signature, credential
    and token parameters are secret, the rest of the URL is not."""
    secret_names = draw(st.lists(st.sampled_from(
        ["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature", "X-Goog-Credential",
         "sig", "Signature", "token", "access_token", "api_key", "apikey", "key", "password", "client_secret"]),
        min_size=1, max_size=4, unique=True))
    public = draw(st.lists(st.sampled_from(
        ["X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Date=20240501T120003Z", "X-Amz-Expires=3600",
         "X-Amz-SignedHeaders=host", "sv=2022-11-02", "se=2024-05-02T00%3A00%3A00Z", "sp=r", "page=2",
         "monkey=banana"]), max_size=4, unique=True))
    values = [draw(_text(B62 + "%-_.~/+", 8, 64)) for _ in secret_names]
    params = [f"{n}={v}" for n, v in zip(secret_names, values, strict=True)] + public
    params = draw(st.permutations(params))
    host = draw(hosts)
    url = f"https://{host}/bucket/model.safetensors?{'&'.join(params)}"
    if draw(st.booleans()):
        return url, values, [host, *public]
    # inside another URL's query, percent-encoded: a redirect's `next=`
    return f"https://login.example/cb?next={quote(url, safe='')}", [quote(v, safe="") for v in values], \
        [quote(p, safe="") for p in public]


@st.composite
def http_headers(draw) -> tuple[str, list[str], list[str]]:
    """A header that is a credential, as curl sends it: the whole value is secret."""
    value = draw(_text(B62 + "+/=_-", 12, 60).filter(lambda v: not v.startswith("-")))  # else it reads as a flag
    header = draw(st.sampled_from([
        "Authorization: Bearer {v}", "Authorization: Basic {v}", "Proxy-Authorization: Basic {v}",
        "Authorization: AWS4-HMAC-SHA256 Credential=AKID/20240501/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature={v}", "Cookie: theme=dark; session={v}", "X-Api-Key: {v}",
        "X-Amz-Security-Token: {v}", "api-key: {v}"]))
    quote_char = draw(st.sampled_from(["'", '"']))
    return f"curl -sS -H {quote_char}{header.format(v=value)}{quote_char} https://api.example/v1", [value], \
        ["https://api.example/v1"]


@st.composite
def curl_users(draw) -> tuple[str, list[str], list[str]]:
    user, password, quote = draw(users), draw(passwords), draw(quotes)
    flag = draw(st.sampled_from(["-u ", "-u", "--user ", "--user=", "-U ", "--proxy-user ", "--proxy-user="]))
    url = draw(st.sampled_from(["https://api.example/v1", "https://api.example/login", "https://api.example/mysql"]))
    credentials = f"{flag}{quote}{user}:{password}{quote}"
    words = [credentials, url] if draw(st.booleans()) else [url, credentials]  # a URL that ends in a tool's name
    return f"curl -sS -X POST {' '.join(words)}", [password], [user, url]


@st.composite
def password_flags_of_tools(draw) -> tuple[str, list[str], list[str]]:
    """A flag that is the password only for that tool: `-p` of sshpass, mysql (attached), docker
    login; `-a` of redis-cli; `-w` of ldapsearch; `-P` of sqlcmd; a `user%password` of smbclient."""
    p, quote, user = draw(passwords), draw(quotes), draw(users)
    q = f"{quote}{p}{quote}"
    line = draw(st.sampled_from([
        f"sshpass -p {q} ssh -p 2222 {user}@gpu-box", f"sshpass -p{q} rsync -e 'ssh -p 2222' a {user}@gpu-box:b",
        f"mysql -h db.example -u {user} -p{q} shop", f"mysqldump -u{user} -p{q} --all-databases",
        f"mariadb -p{q} -P 3306 shop", f"docker login -u {user} -p {q} registry.example",
        f"podman login --username {user} -p{q} registry.example", f"oc login -u {user} -p {q} https://api.example:6443",
        f"docker login --password {q} registry.example", f"redis-cli -h cache.example -p 6379 -a {q} ping",
        f"mongosh --host db.example -u {user} -p {q}", f"ldapsearch -x -D cn={user} -w {q} -H ldap://dir.example",
        f"sqlcmd -S db.example -U {user} -P {q}", f"smbclient //fs.example/share -U {user}%{q}",
        f"wandb login {q}", f"gpg --batch --passphrase {q} -d model.gpg",
        f"openssl enc -d -aes-256-cbc -pass pass:{q} -in a.enc",
        f"printf 'machine hub.example login {user} password {p}' > .netrc"]))
    return line, [p], [user] if user in line.replace(p, "") else []


PREFIXED = {  # a token known by its prefix: the body after it is the secret
    "sk-": B62, "sk-proj-": B64URL, "sk-ant-api03-": B64URL, "sk-svcacct-": B64URL, "sk_live_": B62, "rk_live_": B62,
    "xoxb-": B62 + "-", "xoxp-": B62 + "-", "xoxa-": B62 + "-", "xoxr-": B62 + "-", "xapp-": B62 + "-",
    "glpat-": B64URL, "hf_": B62, "ghp_": B62, "gho_": B62, "ghs_": B62, "github_pat_": B62 + "_",
    "npm_": B62, "gsk_": B62, "r8_": B62,
}


@st.composite
def prefixed_tokens(draw) -> tuple[str, list[str], list[str]]:
    prefix = draw(st.sampled_from(sorted(PREFIXED)))
    body = draw(_text(PREFIXED[prefix], 24, 60))
    if prefix.startswith("sk-"):  # a key is random: it has a digit (an all-lowercase `sk-…` is a word)
        body += draw(st.sampled_from(string.digits))
    where = draw(st.sampled_from(["OPENAI_BASE={t}", "using {t} for the upload", "--header=X:{t}", "({t})", "'{t}'"]))
    return where.format(t=prefix + body), [body], []


@st.composite
def cloud_key_ids(draw) -> tuple[str, list[str], list[str]]:
    """An AWS access key id or a Google API key: recognisable wherever they stand."""
    kind = draw(st.sampled_from(["AKIA", "ASIA", "AIza"]))
    body = draw(_text(string.ascii_uppercase + string.digits, 16, 16)) if kind != "AIza" else \
        draw(_text(B64URL, 35, 35))
    return f"aws configure set aws_access_key_id {kind}{body} --profile ci", [body], ["--profile ci"]


@st.composite
def jwts(draw) -> tuple[str, list[str], list[str]]:
    header, payload, signature = (draw(_text(B64URL, 10, 60)) for _ in range(3))
    token = f"eyJ{header}.eyJ{payload}.{signature}"
    where = draw(st.sampled_from(["id_token {t} issued", "JWT={t}", "cookie session {t}", "{t}"]))
    return where.format(t=token), [header, payload, signature], []


@st.composite
def private_keys(draw) -> tuple[str, list[str], list[str]]:
    kind = draw(st.sampled_from(["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED "]))
    chunks = draw(st.lists(_text(B62 + "+/", 12, 64), min_size=1, max_size=4))
    joint = draw(st.sampled_from(["\n", "\\n", " ", ""]))
    block = (f"-----BEGIN {kind}PRIVATE KEY-----{joint}{joint.join(chunks)}{joint}"
             f"-----END {kind}PRIVATE KEY-----")
    return f"writing key {block} to .ssh/id", chunks, ["to .ssh/id"]


@st.composite
def secret_env_names(draw) -> tuple[str, list[str], list[str]]:
    """Tools' own password variables, by name (PGPASSWORD is a *PASSWORD already)."""
    name = draw(st.sampled_from(["SSHPASS", "MYSQL_PWD", "REDISCLI_AUTH", "DB_PASS", "PGPASSWORD", "GPG_PASSPHRASE",
                                 "HF_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "WANDB_API_KEY"]))
    value = draw(passwords)
    return f"env {name}={value} ./run.sh", [value], ["./run.sh"]


SHAPES = {"presigned_url": presigned_urls(), "http_header": http_headers(), "curl_user": curl_users(),
          "tool_flag": password_flags_of_tools(), "prefixed_token": prefixed_tokens(), "cloud_key_id": cloud_key_ids(),
          "jwt": jwts(), "private_key": private_keys(), "env_name": secret_env_names()}


@pytest.mark.parametrize("shape", SHAPES)
@FUZZ
@given(data=st.data())
def test_a_secret_in_any_shape_never_survives_and_the_words_around_it_do(shape: str, data) -> None:
    fragment, secrets, kept = data.draw(SHAPES[shape])
    if "\n" in fragment or '"' in fragment:  # JSON would escape them: the context is a command line
        text, around = f"{ORDINARY[0]} && {fragment} ; {ORDINARY[1]}", [ORDINARY[0], ORDINARY[1]]
    else:
        text, around = data.draw(contexts(fragment))
    _check(text, secrets, [*kept, *around])


@FUZZ
@given(fragment=st.sampled_from(ORDINARY), more=st.sampled_from(ORDINARY))
def test_ordinary_words_are_left_as_they_are(fragment: str, more: str) -> None:
    text = f"{fragment} ; {more}\n{more} && {fragment}"
    assert redact(text) == text


def test_a_variable_reference_is_no_secret_in_any_shape() -> None:
    for text in ("sshpass -p $SSHPASS ssh host", "curl -u op:$API_PASS https://x", "mysql -p\"$DB_PW\" shop",
                 "docker login -u me -p ${REG_PASSWORD} reg", "https://x/f?X-Amz-Signature=$SIG&a=1",
                 "redis-cli -a $REDIS_PASSWORD", "SSHPASS=$P sshpass -e ssh host"):
        assert redact(text) == text


@example(user="op", password="pw:with:colons")
@FUZZ
@given(user=users, password=passwords)
def test_curl_keeps_the_user_and_hides_everything_after_the_first_colon(user: str, password: str) -> None:
    assume(password.count(":") <= 3 and user not in password)
    assert redact(f"curl -u {user}:{password} https://a.example") == f"curl -u {user}:*** https://a.example"


def test_a_switch_is_no_secret_after_a_name_but_a_password_of_true_is_one() -> None:
    kept = "gguf set-kv m.gguf tokenizer.ggml.add_bos_token=true --use-auth-token false USE_TOKEN=no"
    assert redact(kept) == kept
    assert redact("sshpass -p true ssh h; curl -u op:no x; https://op:TRUE@h/x?sig=on") == \
        "sshpass -p *** ssh h; curl -u op:*** x; https://op:***@h/x?sig=***"


def test_a_prompted_password_leaves_the_next_word_alone() -> None:
    # `mysql -p shop`: -p asks at the terminal, shop is the database; `-u 1000:1000` is a uid:gid
    for text in ("mysql -u root -p shop", "docker run -u 1000:1000 -p 8080:80 img", "curl -u op https://a.example",
                 "sshpass -f pwfile ssh -p 2222 host",
                 "docker login -u me --password-stdin reg && docker run -p 80:80 x"):
        assert redact(text) == text


# ------------------------------------------------------------------ one of each shape, for the front ends' tests

# Command lines a stage may run (each harmless: `true` ignores its words), with their secrets.
SECRET_COMMANDS = (
    ("true 'https://b.example/m.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDQ7CRED0001"
     "&X-Amz-Date=20240501T000000Z&X-Amz-Signature=9f3c5ecre7519a7'", ["AKIDQ7CRED0001", "9f3c5ecre7519a7"]),
    ("true 'https://acct.example/c/b?sv=2022-11-02&sp=r&sig=Az5a5Ecret%2Bsig'", ["Az5a5Ecret%2Bsig"]),
    ("true curl -u op:cUrlPa55word https://api.example", ["cUrlPa55word"]),
    ("true sshpass -p 55hPa55word ssh -p 2222 op@gpu-box", ["55hPa55word"]),
    ("true mysql -h db.example -u root -pMy5qlPa55 shop", ["My5qlPa55"]),
    ("true docker login -u op -p D0ckerPa55 registry.example", ["D0ckerPa55"]),
    ("true OPENAI_BASE=sk-proj-Abc123Def456Ghi789Jkl012", ["Abc123Def456Ghi789Jkl012"]),
    ("true xoxb-123456789012-Slack5ecretT0ken glpat-G1tLabPat5ecretT0ken00 AKIAQ5ECRETKEY123456",
     ["Slack5ecretT0ken", "G1tLabPat5ecretT0ken00", "Q5ECRETKEY123456"]),
    ("true eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcCJ9.Jwt5ignatur3Secret", ["eyJzdWIiOiJvcCJ9", "Jwt5ignatur3Secret"]),
    ("true -----BEGIN PRIVATE KEY-----MIIEvPr1vateKeyB0dy-----END PRIVATE KEY-----", ["MIIEvPr1vateKeyB0dy"]),
)
# A stage's env: secret by name (whatever the value holds), or by what the value holds.
SECRET_ENV = {"HF_TOKEN": "hf_EnvT0kenAbcdefghijklmnop", "WANDB_API_KEY": "0123wandbkey4567",
              "DB_PASSWORD": "pass with spaces", "EXTRA_ARGS": "--token Extra5ecretT0ken"}
SECRETS = [s for _, found in SECRET_COMMANDS for s in found] + ["EnvT0kenAbcdefghijklmnop", "0123wandbkey4567",
                                                                "with spaces", "Extra5ecretT0ken"]


def secret_stage_toml(name: str, key: str, then: str = "") -> str:
    """A [stages.NAME] table whose command and env carry a secret of each shape (then: a last command)."""
    command = "; ".join([c for c, _ in SECRET_COMMANDS] + ([then] if then else []))
    env = ", ".join(f"{k} = '{v}'" for k, v in SECRET_ENV.items())
    return f"[stages.{name}]\nkey = \"{key}\"\ncommand = '''{command}'''\nenv = {{ {env} }}\n"


def test_each_example_is_redacted() -> None:
    out = redact("; ".join(c for c, _ in SECRET_COMMANDS))
    assert [s for _, found in SECRET_COMMANDS for s in found if s in out] == [] and "ssh -p 2222 op@gpu-box" in out
