"""Upload the release wheels to a package index with twine.

``python -m scripts.publish --repository-url URL [--wheels wheelhouse]``

* Credentials come from twine's own sources: ``TWINE_USERNAME`` / ``TWINE_PASSWORD`` (CI secrets)
  or the system keyring. There is no option to pass a password, none is read from a file in the
  repository, and URLs with ``user:password@`` in them are refused. twine's output is shown with
  the password masked.
* Each wheel is uploaded on its own, so the report says per file what happened. A file the
  index already has is refused by the server (a version is never overwritten) and reported as
  such; ``--skip-existing`` (off by default) turns that refusal into a note.
* The exit status is 0 only when every wheel is on the index afterwards.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from scripts import tools
from scripts.index import find_wheels

# What the publish session installs (pyproject.toml's `publish` group); the tests use it too.
TOOLS = tools.group("publish")
UPLOAD_TIMEOUT_S = 600
FAILURE_LINES = 12

UPLOADED = "uploaded"
EXISTS = "already on the index (refused, not overwritten)"
SKIPPED = "already on the index (skipped)"
AUTH = "refused: the index did not accept the credentials"
FAILED = "failed"

# twine's messages for a file the index already has: PyPI/warehouse answers 400 "File already
# exists", pypiserver 409 Conflict, Artifactory/Nexus 403/400 with "already exists".
_EXISTS_PATTERNS = (r"\b409\b", r"already exists", r"File already exists")
_AUTH_PATTERNS = (r"\b401\b", r"\b403\b", r"Invalid or non-existent authentication")
_NO_CREDENTIALS_PATTERNS = (r"Credential not found", r"[Uu]sername.*missing|[Pp]assword.*missing")


@dataclass(frozen=True)
class UploadResult:
    wheel: str
    outcome: str
    output: str

    @property
    def ok(self) -> bool:
        return self.outcome in (UPLOADED, SKIPPED)


class PublishError(RuntimeError):
    pass


def mask_secrets(text: str, secrets: Sequence[str | None]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "********")
    return text


def classify(returncode: int, output: str, skip_existing: bool) -> str:
    """Map one ``twine upload`` run to an outcome."""
    if returncode == 0:
        return UPLOADED
    output = " ".join(html.unescape(output).split())
    if any(re.search(p, output) for p in _EXISTS_PATTERNS):
        return SKIPPED if skip_existing else EXISTS
    if any(re.search(p, output) for p in _AUTH_PATTERNS):
        return AUTH
    return FAILED


def server_answer(output: str) -> str | None:
    """The HTTP status twine reports (``"403 Forbidden"``), if any."""
    found = re.findall(r"HTTPError: (\d{3}\b[^\n]*?)(?: from |$)", output, flags=re.MULTILINE)
    return found[-1].strip() if found else None


def check_repository_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PublishError(f"--repository-url must be an http(s) URL, got {url!r}")
    if parts.username or parts.password:
        raise PublishError(
            "--repository-url carries credentials; give them through TWINE_USERNAME / "
            "TWINE_PASSWORD or the keyring instead"
        )
    return url


def twine_command(url: str, wheel: Path) -> list[str]:
    return [
        sys.executable, "-m", "twine", "--no-color", "upload",
        # --verbose: the server's reason ("... already exists") is only in the response body.
        "--non-interactive", "--disable-progress-bar", "--verbose",
        "--repository-url", url,
        str(wheel),
    ]  # fmt: skip


def upload_wheel(url: str, wheel: Path, skip_existing: bool = False) -> UploadResult:
    proc = subprocess.run(
        twine_command(url, wheel),
        capture_output=True,
        text=True,
        timeout=UPLOAD_TIMEOUT_S,
        # Wide output so the server's message is not broken across lines.
        env={**os.environ, "TWINE_NON_INTERACTIVE": "1", "COLUMNS": "400"},
    )
    output = "\n".join(line.rstrip() for line in (proc.stdout + proc.stderr).splitlines())
    output = mask_secrets(output, [os.environ.get("TWINE_PASSWORD")])
    if proc.returncode != 0 and any(re.search(p, output) for p in _NO_CREDENTIALS_PATTERNS):
        raise PublishError(
            "no credentials: set TWINE_USERNAME and TWINE_PASSWORD (in CI, from the "
            "repository's secrets) or store them in the keyring for this URL\n" + output
        )
    return UploadResult(wheel.name, classify(proc.returncode, output, skip_existing), output)


def check_wheels(wheels: Sequence[Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", *map(str, wheels)],
        capture_output=True,
        text=True,
        timeout=UPLOAD_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise PublishError("twine check failed:\n" + proc.stdout + proc.stderr)


def publish(url: str, sources: Sequence[Path], skip_existing: bool = False) -> list[UploadResult]:
    check_repository_url(url)
    wheels = find_wheels(sources)
    if not wheels:
        raise PublishError(f"no wheels under {', '.join(map(str, sources))}")
    check_wheels(wheels)
    results = []
    for wheel in wheels:
        result = upload_wheel(url, wheel, skip_existing)
        answer = "" if result.ok else server_answer(result.output)
        print(f"{wheel.name}: {result.outcome}" + (f" ({answer})" if answer else ""), flush=True)
        if result.outcome == FAILED:  # unexplained: show the end of twine's output
            tail = result.output.strip().splitlines()[-FAILURE_LINES:]
            print("\n".join("  " + line for line in tail), flush=True)
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.publish", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repository-url", required=True, help="upload URL of the index")
    parser.add_argument(
        "--wheels", type=Path, action="append",
        help="folder (searched recursively) or wheel file; repeatable (default: wheelhouse)",
    )  # fmt: skip
    parser.add_argument(
        "--skip-existing", action="store_true",
        help="report files the index already has as skipped instead of failing",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sources = args.wheels or [Path("wheelhouse")]
    try:
        results = publish(args.repository_url, sources, args.skip_existing)
    except PublishError as exc:
        print(f"publish: {exc}", file=sys.stderr)
        return 1
    host = urlsplit(args.repository_url).hostname
    failed = [r for r in results if not r.ok]
    done = len(results) - len(failed)
    print(f"publish: {done} of {len(results)} wheel(s) on {host}")
    if any(r.outcome == EXISTS for r in results):
        print(
            "publish: the index refused files it already has; a published version is never "
            "replaced: bump the version to publish new builds"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
