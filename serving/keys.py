"""API keys -> clients: who calls, at which priority tier, and whether VIP.

`tailguard serve --keys FILE` reads (a bad file raises `KeyFileError`: file, line, field):
```yaml
keys:
  - name: alice        # [A-Za-z0-9][A-Za-z0-9_.@-]*, in logs/traces instead of the key
    key: sk-alice-...  # the secret, or key_sha256: <64 hex> so the file holds none
    tier: realtime     # realtime | batch (default realtime)
    vip: true          # default false: admitted while only VIPs are
```
Priority comes from the key's tier; `X-Tailguard-Priority` may only lower it: `batch`
gives tier batch and drops VIP too, `realtime` never raises a batch key, other values
are ignored. Without a keys file `KeyRing.open()` makes every caller `ANONYMOUS`.
Only SHA-256 digests are kept; no repr or error message holds a secret.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from observe.registry import PRIORITIES, PRIORITY_BATCH, PRIORITY_REALTIME
from slo.spec import SpecError
from slo.yaml_positions import Located, load_located

PRIORITY_HEADER = "X-Tailguard-Priority"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")  # fullmatch: no newline
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_QUOTED = re.compile(r"""(['"]).*?\1""")


class KeyFileError(ValueError):
    """An invalid keys file; the message names the file, line and field, never a key."""


@dataclass(frozen=True, slots=True)
class Client:
    name: str
    tier: str  # one of observe.registry.PRIORITIES
    vip: bool = False


ANONYMOUS = Client("anonymous", PRIORITY_REALTIME, False)


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """Key digests -> clients; `open()` is the ring of a server without a keys file."""

    __slots__ = ("_entries", "source")

    def __init__(self, entries: list[tuple[bytes, Client]] | None, source: str = "<keys>"):
        self._entries, self.source = entries, source  # None: open, no key needed

    @classmethod
    def open(cls) -> KeyRing:
        return cls(None, "<no keys file>")

    @property
    def requires_key(self) -> bool:
        return self._entries is not None

    @property
    def names(self) -> frozenset[str]:
        """Every client this ring can name: a bounded set (the keys file's names)."""
        if not self.requires_key:
            return frozenset({ANONYMOUS.name})
        return frozenset(c.name for _, c in self._entries)

    def __repr__(self) -> str:
        if not self.requires_key:
            return "KeyRing.open()"
        return f"KeyRing({self.source!r}, clients={[c.name for _, c in self._entries]!r})"

    def resolve(self, authorization: str | None, requested_priority: str | None = None
                ) -> Client | None:
        """The caller, lowered by `requested_priority`; None: no or unknown key (401)."""
        if not self.requires_key:
            return _lower(ANONYMOUS, requested_priority)
        scheme, _, key = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        given, match = digest(key.strip()), None
        for entry, client in self._entries:  # every entry, no early exit
            if hmac.compare_digest(given, entry):
                match = client
        return None if match is None else _lower(match, requested_priority)


def _lower(client: Client, requested: str | None) -> Client:
    if (requested or "").strip().lower() == PRIORITY_BATCH:
        return dataclasses.replace(client, tier=PRIORITY_BATCH, vip=False)
    return client


def load_keys(path: str | Path) -> KeyRing:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_keys(text, str(path))


def parse_keys(text: str, source: str = "<keys>") -> KeyRing:
    try:
        doc = load_located(text, source)
    except yaml.YAMLError as exc:  # PyYAML's excerpt and quoted tokens may hold a key
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = _QUOTED.sub("'...'", getattr(exc, "problem", None) or type(exc).__name__)
        raise KeyFileError(f"{where}: not valid YAML: {problem}") from None
    except SpecError:  # an empty document
        raise KeyFileError(f"{source}:1: <root>: missing required field 'keys'") from None
    try:
        return KeyRing(_parse_entries(doc), source)
    except SpecError as exc:
        raise KeyFileError(str(exc)) from None


def _parse_entries(doc: Located) -> list[tuple[bytes, Client]]:
    root = doc.mapping("a keys file")
    root.only({"keys"})
    items = root.require("keys").sequence()
    entries: list[tuple[bytes, Client]] = []
    for item in items.items():
        m = item.mapping("a key entry")
        m.only({"name", "key", "key_sha256", "tier", "vip"})
        name = (name_node := m.require("name")).string()
        if not _NAME.fullmatch(name):
            raise name_node.error("must match [A-Za-z0-9][A-Za-z0-9_.@-]* (64 chars at most)")
        if any(c.name == name for _, c in entries):
            raise name_node.error(f"name {name!r} is used twice")
        key, sha = m.get("key"), m.get("key_sha256")
        if key.present == sha.present:
            raise m.error("needs exactly one of 'key' or 'key_sha256'")
        if key.present and (not isinstance(key.value, str) or not key.value.strip()):
            raise key.error("must be a non-empty string")  # no repr: it is a secret
        if sha.present and (not isinstance(sha.value, str) or not _HEX64.fullmatch(sha.value)):
            raise sha.error("must be a SHA-256 digest: 64 hex characters")
        secret = digest(key.value.strip()) if key.present else bytes.fromhex(sha.value)
        for other, client in entries:
            if hmac.compare_digest(secret, other):
                raise (key if key.present else sha).error(f"same key as {client.name!r}")
        vip = m.get("vip", False)
        if not isinstance(vip.value, bool):
            raise vip.error("must be true or false")
        tier = m.get("tier", PRIORITY_REALTIME).choice(PRIORITIES)
        entries.append((secret, Client(name, tier, vip.value)))
    if not entries:
        raise items.error("must list at least one key")
    return entries
