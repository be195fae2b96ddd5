"""CURVE key pairs for encrypted, authenticated tcp:// (`flexmarl keygen` writes them).

A pair is two files in ZeroMQ's certificate format (`zmq.auth.load_certificate` reads them too):
`NAME.key` holds the public key (share it freely), `NAME.key_secret` holds the public and the
secret key and is created with mode 0600. Keys are Z85 text, 40 characters.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def is_z85_key(value: object) -> bool:
    """True for a 40-character Z85 string (a CURVE key)."""
    return isinstance(value, str) and Z85_KEY.fullmatch(value) is not None


def generate_keypair() -> tuple[str, str]:
    """A new (public, secret) CURVE key pair, Z85 text."""
    import zmq

    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def _text(kind: str, public: str, secret: str | None) -> str:
    lines = [f"#   FlexMARL CURVE {kind} key (ZeroMQ certificate format), from `flexmarl keygen`"]
    if secret is not None:
        lines.append("#   Keep this file private (mode 0600); share NAME.key instead.")
    lines += ["", "metadata", "curve", f'    public-key = "{public}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


def write_keys(directory: str | os.PathLike, name: str = "node") -> tuple[Path, Path, str]:
    """Generate a pair into `directory` (made with mode 0700 if missing); returns the public
    and secret file paths and the public key. An existing secret is never overwritten."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"key name {name!r} must be letters, digits, '_', '.', '-'")
    directory = Path(directory).expanduser()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_path, secret_path = directory / f"{name}.key", directory / f"{name}.key_secret"
    if secret_path.exists():
        raise FileExistsError(f"{secret_path} exists; refusing to overwrite a secret key "
                              "(remove it first, or pick another --name)")
    public, secret = generate_keypair()
    # O_EXCL: created by this call, with 0600 from the start (never readable by others).
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_text("secret", public, secret))
    public_path.write_text(_text("public", public, None))
    return public_path, secret_path, public


def read_key_file(path: str | os.PathLike) -> tuple[str, str | None]:
    """(public, secret or None) from a key file; ValueError names the file if it is malformed."""
    found: dict[str, str] = {}
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            key = key.strip()
            if sep and key in ("public-key", "secret-key"):
                found[key] = value.strip().strip("'\"")
    public, secret = found.get("public-key"), found.get("secret-key")
    if not is_z85_key(public) or (secret is not None and not is_z85_key(secret)):
        raise ValueError(f"{path} is not a CURVE key file (expected public-key = \"<40 Z85 "
                         "characters>\" lines, as `flexmarl keygen` writes)")
    return public, secret  # type: ignore[return-value]


def load_keys(path: str | os.PathLike) -> tuple[str, str]:
    """(public, secret) from a NAME.key_secret file, or from DIR/node.key_secret."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "node.key_secret"
    public, secret = read_key_file(path)
    if secret is None:
        raise ValueError(f"{path} holds no secret key (a .key file is the public half; "
                         "use the .key_secret file)")
    return public, secret
