"""API keys file: parsing, errors by file:line:field, resolving callers, no leaked secrets."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from observe.registry import PRIORITY_BATCH, PRIORITY_REALTIME
from serving import keys
from serving.keys import ANONYMOUS, Client, KeyFileError, KeyRing, load_keys, parse_keys

ALICE, BOB, CAROL, DAVE = "sk-alice-secret", "sk-bob-secret", "sk-carol-secret", "sk-dave-secret"
SECRETS = (ALICE, BOB, CAROL, DAVE)
BOB_SHA = hashlib.sha256(BOB.encode()).hexdigest()

GOOD = f"""\
keys:
  - name: alice
    key: {ALICE}
    tier: realtime
    vip: true
  - name: bob
    key_sha256: {BOB_SHA}
    tier: batch
  - name: carol
    key: {CAROL}
  - name: dave
    key_sha256: {hashlib.sha256(DAVE.encode()).hexdigest().upper()}
    tier: batch
    vip: true
"""

A = Client("alice", PRIORITY_REALTIME, True)
B = Client("bob", PRIORITY_BATCH, False)
C = Client("carol", PRIORITY_REALTIME, False)
D = Client("dave", PRIORITY_BATCH, True)
A_LOW = Client("alice", PRIORITY_BATCH, False)
C_LOW = Client("carol", PRIORITY_BATCH, False)
D_LOW = Client("dave", PRIORITY_BATCH, False)


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return parse_keys(GOOD, "keys.yaml")


def test_a_keys_file_round_trips_plain_and_sha256_entries(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(GOOD)
    loaded = load_keys(path)
    assert loaded.requires_key and loaded.source == str(path)
    assert [loaded.resolve(f"Bearer {s}") for s in SECRETS] == [A, B, C, D]


RESOLVE = [
    # (case, authorization, X-Tailguard-Priority, expected client)
    ("no header", None, None, None),
    ("empty header", "", None, None),
    ("wrong scheme", f"Basic {ALICE}", None, None),
    ("no scheme", ALICE, None, None),
    ("bearer without a key", "Bearer ", None, None),
    ("unknown key", "Bearer sk-nobody", None, None),
    ("a prefix of a key", "Bearer sk-alice", None, None),
    ("a digest given as the key", f"Bearer {BOB_SHA}", None, None),
    ("unknown key asking for batch", "Bearer sk-nobody", "batch", None),
    ("realtime vip key", f"Bearer {ALICE}", None, A),
    ("scheme in any case, spaces around", f"bearer  {ALICE} ", None, A),
    ("batch key from key_sha256", f"Bearer {BOB}", None, B),
    ("defaults: realtime, not vip", f"Bearer {CAROL}", None, C),
    ("batch vip key from an upper-case digest", f"Bearer {DAVE}", None, D),
    ("realtime asking batch is lowered and loses vip", f"Bearer {ALICE}", "batch", A_LOW),
    ("the header in any case and spacing", f"Bearer {ALICE}", " BATCH ", A_LOW),
    ("realtime non-vip asking batch", f"Bearer {CAROL}", "batch", C_LOW),
    ("batch vip asking batch loses vip", f"Bearer {DAVE}", "batch", D_LOW),
    ("batch asking batch stays", f"Bearer {BOB}", "batch", B),
    ("realtime asking realtime stays", f"Bearer {ALICE}", "realtime", A),
    ("batch asking realtime is never raised", f"Bearer {BOB}", "realtime", B),
    ("batch vip asking realtime stays", f"Bearer {DAVE}", "realtime", D),
    ("an unknown priority is ignored", f"Bearer {ALICE}", "urgent", A),
    ("an empty priority is ignored", f"Bearer {BOB}", "", B),
]


@pytest.mark.parametrize("case,authorization,priority,expected", RESOLVE,
                         ids=[r[0] for r in RESOLVE])
def test_resolve(ring, case, authorization, priority, expected):
    assert ring.resolve(authorization, priority) == expected


OPEN = [
    ("no header", None, None, ANONYMOUS),
    ("any bearer key", "Bearer sk-whatever", None, ANONYMOUS),
    ("a garbage header", "Basic xyz", None, ANONYMOUS),
    ("asking realtime", None, "realtime", ANONYMOUS),
    ("asking something unknown", None, "urgent", ANONYMOUS),
    ("asking batch is lowered", "Bearer sk-whatever", "batch",
     Client("anonymous", PRIORITY_BATCH, False)),
]


@pytest.mark.parametrize("case,authorization,priority,expected", OPEN, ids=[o[0] for o in OPEN])
def test_without_a_keys_file_everyone_is_anonymous(case, authorization, priority, expected):
    opened = KeyRing.open()
    assert not opened.requires_key
    assert opened.resolve(authorization, priority) == expected


def test_anonymous_is_a_realtime_non_vip_client():
    assert ANONYMOUS == Client("anonymous", PRIORITY_REALTIME, False)
    assert KeyRing.open().resolve(None, None) is ANONYMOUS
    with pytest.raises(dataclasses.FrozenInstanceError):
        ANONYMOUS.tier = PRIORITY_BATCH  # type: ignore[misc]


def test_resolve_compares_against_every_entry(ring, monkeypatch):
    """Hashed once, then compared with each entry, with no early exit on a match."""
    calls = []
    real = keys.hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", counting)
    for secret in (ALICE, DAVE, "sk-nobody"):
        calls.clear()
        ring.resolve(f"Bearer {secret}")
        assert calls == [(32, 32)] * 4


def test_reprs_hold_no_secret(ring):
    texts = [repr(ring), str(ring), repr(KeyRing.open())]
    texts += [repr(ring.resolve(f"Bearer {s}", p)) for s in SECRETS for p in (None, "batch")]
    assert repr(ring) == "KeyRing('keys.yaml', clients=['alice', 'bob', 'carol', 'dave'])"
    assert repr(KeyRing.open()) == "KeyRing.open()"
    digests = [hashlib.sha256(s.encode()).hexdigest() for s in SECRETS]
    for text in texts:
        for secret in SECRETS + tuple(digests) + tuple(d.upper() for d in digests):
            assert secret not in text, text
    assert not hasattr(ring, "__dict__") and not hasattr(A, "__dict__")


def entry(**fields) -> str:
    body = "".join(f"    {k}: {v}\n" for k, v in fields.items())
    return "keys:\n  - " + body[4:]


ONE = entry(name="alice", key=ALICE)
BAD = [
    # (case, text, line, field, message)
    ("an empty file", "", 1, "<root>", "missing required field 'keys'"),
    ("only a comment", "# nothing\n", 1, "<root>", "missing required field 'keys'"),
    ("no keys list", "clients: []\n", 1, "clients", "unknown field (allowed: keys)"),
    ("an empty mapping", "{}\n", 1, "<root>", "missing required field 'keys'"),
    ("a list at the top", "- alice\n", 1, "<root>", "a keys file must be a mapping"),
    ("keys not a list", "keys: alice\n", 1, "keys", "must be a list"),
    ("keys null", "keys:\n", 1, "keys", "must be a list"),
    ("keys empty", "keys: []\n", 1, "keys", "must list at least one key"),
    ("an entry not a mapping", "keys:\n  - alice\n", 2, "keys[0]", "a key entry must be a mapping"),
    ("an entry without name", entry(key=ALICE), 2, "keys[0]", "missing required field 'name'"),
    ("a name not a string", entry(name="[a]", key=ALICE), 2, "keys[0].name",
     "must be a string"),
    ("a name with a space", entry(name="'al ice'", key=ALICE), 2, "keys[0].name",
     "must match"),
    ("a name with a newline", entry(name='"alice\\n"', key=ALICE), 2, "keys[0].name",
     "must match"),
    ("an entry without key or key_sha256", entry(name="alice", tier="batch"), 2, "keys[0]",
     "needs exactly one of 'key' or 'key_sha256'"),
    ("an entry with key and key_sha256", entry(name="alice", key=ALICE, key_sha256=BOB_SHA), 2,
     "keys[0]", "needs exactly one of 'key' or 'key_sha256'"),
    ("an empty key", entry(name="alice", key="''"), 3, "keys[0].key",
     "must be a non-empty string"),
    ("a key not a string", entry(name="alice", key="12345678"), 3, "keys[0].key",
     "must be a non-empty string"),
    ("a short key_sha256", entry(name="alice", key_sha256=BOB_SHA[:63]), 3, "keys[0].key_sha256",
     "must be a SHA-256 digest: 64 hex characters"),
    ("a long key_sha256", entry(name="alice", key_sha256=BOB_SHA + "0"), 3,
     "keys[0].key_sha256", "must be a SHA-256 digest: 64 hex characters"),
    ("a key_sha256 not hex", entry(name="alice", key_sha256="g" * 64), 3, "keys[0].key_sha256",
     "must be a SHA-256 digest: 64 hex characters"),
    ("a key given as key_sha256", entry(name="alice", key_sha256=ALICE), 3, "keys[0].key_sha256",
     "must be a SHA-256 digest: 64 hex characters"),
    ("an unknown tier", entry(name="alice", key=ALICE, tier="gold"), 4, "keys[0].tier",
     "must be one of realtime, batch, not 'gold'"),
    ("vip not a boolean", entry(name="alice", key=ALICE, vip="'true'"), 4, "keys[0].vip",
     "must be true or false"),
    ("an unknown entry field", entry(name="alice", key=ALICE, secret=DAVE), 4, "keys[0].secret",
     "unknown field (allowed: key, key_sha256, name, tier, vip)"),
    ("an unknown top-level field", ONE + "admin: true\n", 4, "admin",
     "unknown field (allowed: keys)"),
    ("a duplicate name", ONE + entry(name="alice", key=BOB)[6:], 4, "keys[1].name",
     "name 'alice' is used twice"),
    ("a duplicate key", ONE + entry(name="bob", key=ALICE)[6:], 5, "keys[1].key",
     "same key as 'alice'"),
    ("a duplicate key by digest",
     ONE + entry(name="bob", key_sha256=hashlib.sha256(ALICE.encode()).hexdigest())[6:], 5,
     "keys[1].key_sha256", "same key as 'alice'"),
]


@pytest.mark.parametrize("case,text,line,field,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_keys_file_names_line_and_field(case, text, line, field, message):
    with pytest.raises(KeyFileError) as err:
        parse_keys(text, "keys.yaml")
    text = str(err.value)
    assert text.startswith(f"keys.yaml:{line}: {field}: "), text
    assert message in text and "\n" not in text, text
    for secret in SECRETS + ("12345678",):
        assert secret not in text, text


SYNTAX = [
    # (case, text, line): PyYAML would quote the offending line, or the alias's name
    ("an unclosed list", "keys: [\n", 2),
    ("a colon inside a plain key", entry(name="alice", key=f"{ALICE}: x"), 3),
    ("a key that reads as an alias", entry(name="alice", key=f"*{ALICE}"), 3),
    ("a tab indent", f"keys:\n\t- name: alice\n\t  key: {ALICE}\n", 2),
]


@pytest.mark.parametrize("case,text,line", SYNTAX, ids=[s[0] for s in SYNTAX])
def test_invalid_yaml_is_reported_by_line_without_its_text(case, text, line):
    with pytest.raises(KeyFileError) as err:
        parse_keys(text, "keys.yaml")
    text = str(err.value)
    assert text.startswith(f"keys.yaml:{line}: not valid YAML: "), text
    assert ALICE not in text and "\n" not in text, text


def test_a_missing_file_is_a_key_file_error(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(KeyFileError) as err:
        load_keys(missing)
    assert str(err.value) == f"{missing}: cannot read: No such file or directory"
    assert isinstance(err.value, ValueError)
