"""Who may open the console: the login rule and the console password, free of Streamlit.

A console that listens on anything but loopback (or runs with `--console-auth always`)
asks for the console password before any page renders, and does not start without an
admin token to derive it from. On loopback (`auto`, the default) it opens as before,
so local use stays one click; `always` is for machines shared with other users.

The console password is HMAC-SHA256(key = admin token, message = `PASSWORD_LABEL`),
its first 15 bytes in lowercase base32: 24 characters, 120 bits. The operator never
types the raw token into a browser, and the password does not open the admin API.
`tailguard console --print-password` prints it. A signed-in session keeps only a mark
derived the same way under another label (`SESSION_LABEL`) in `st.session_state`: a
new token signs every session out. Every comparison is `hmac.compare_digest`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

AUTO, ALWAYS = "auto", "always"
MODES = (AUTO, ALWAYS)
PASSWORD_LABEL = b"tailguard console password v1"
SESSION_LABEL = b"tailguard console session v1"
PASSWORD_BYTES = 15  # 120 bits, 24 base32 characters, no padding


def _derive(token: str, label: bytes) -> bytes:
    return hmac.new(token.encode(), label, hashlib.sha256).digest()


def console_password(token: str) -> str:
    """The password the login form asks for, derived from the admin token."""
    if not token:
        raise ValueError("token: a console password needs a non-empty admin token")
    return base64.b32encode(_derive(token, PASSWORD_LABEL)[:PASSWORD_BYTES]).decode().lower()


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches; "" (Streamlit's default, every
    interface) and 0.0.0.0 are not."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Access:
    """The console's access rule: where it listens, the mode, and the admin token."""

    host: str
    mode: str = AUTO
    token: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")

    @property
    def login_required(self) -> bool:
        return self.mode == ALWAYS or not is_loopback(self.host)

    def check(self, typed: str) -> bool:
        """Whether `typed` is the console password (spaces and case forgiven)."""
        if not self.token:
            return False
        expected = console_password(self.token).encode()
        return hmac.compare_digest(expected, typed.strip().lower().encode())

    def session_mark(self) -> str:
        """What a signed-in session holds; useless as a password or an admin token."""
        return _derive(self.token, SESSION_LABEL).hex()

    def signed_in(self, mark: object) -> bool:
        if not self.token or not isinstance(mark, str):
            return False
        return hmac.compare_digest(self.session_mark().encode(), mark.encode())
