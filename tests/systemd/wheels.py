"""A newer release of the wheel without a second build: the same files under another version.

The dist-info folder, `Version:` in METADATA and RECORD (with its hashes) say `version`; the code is the
tree's. What the tier checks of an upgrade is what /status reports after a handover: the version of the
program now running.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def renumbered(wheel: Path, version: str, dest: Path) -> Path:
    """A copy of `wheel` in `dest` that installs as `version`."""
    old = wheel.name.split("-")[1]
    out = dest / wheel.name.replace(f"-{old}-", f"-{version}-", 1)
    records: list[str] = []
    record_name = ""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            name = info.filename.replace(f"-{old}.dist-info/", f"-{version}.dist-info/")
            if name.endswith(".dist-info/RECORD"):
                record_name = name
                continue
            if name.endswith(".dist-info/METADATA"):
                data = data.replace(f"\nVersion: {old}\n".encode(), f"\nVersion: {version}\n".encode())
            dst.writestr(name, data)
            records.append(f"{name},{_hash(data)},{len(data)}")
        dst.writestr(record_name, "\n".join([*records, f"{record_name},,"]) + "\n")
    return out
