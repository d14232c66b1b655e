"""Upload the release wheels to a package index with twine.

``python -m scripts.publish --repository-url URL [--wheels wheelhouse]``

* Credentials come from twine's own sources: ``TWINE_USERNAME`` / ``TWINE_PASSWORD`` (CI secrets)
  or the system keyring. There is no option to pass a password, none is read from a file in the
  repository, and a URL with ``user:password@`` in it is refused before anything else and never
  shown. twine's output is shown with the password (plain, base64, HTML-escaped and
  percent-encoded) masked, and with everything after the URL's host (path, query, fragment:
  where token-in-URL indexes put the token) masked too; twine gets the URL through its
  environment, not its command line.
* The wheels are checked first: file names, labels and torch pins as the index checks them
  (``scripts/wheelfile.py``; a public version, for PyPI, may carry no label), then
  ``twine check``.
* Each wheel is uploaded on its own, so the report says per file what happened. A file the
  index already has is refused by the server (a version is never overwritten) and reported as
  such; ``--skip-existing`` (off by default) turns that refusal into a note.
* An index that does not answer within ``--timeout`` seconds (connect, and each read) stops the
  run: the wheels not sent are listed. The summary is printed whatever happened.
* The exit status is 0 only when every wheel is on the index afterwards.
"""

from __future__ import annotations

import argparse
import base64
import html
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlsplit

from scripts import names, tools
from scripts.wheelfile import WheelError, describe_wheel, find_wheels

# What the publish session installs (pyproject.toml's `publish` group); the tests use it too.
TOOLS = tools.group("publish")
# Connect timeout and longest silence between two reads from the index: not a limit on the
# whole upload, so a large wheel on a slow link still goes through.
DEFAULT_TIMEOUT_S = 60.0
# Backstop for one twine run, whatever it waits on.
UPLOAD_TIMEOUT_S = 3600
CHECK_TIMEOUT_S = 600
FAILURE_LINES = 12
MASK = "********"

UPLOADED = "uploaded"
EXISTS = "already on the index (refused, not overwritten)"
SKIPPED = "already on the index (skipped)"
AUTH = "refused: the index did not accept the credentials"
TIMEOUT = "no answer from the index in time"
UNREACHABLE = "could not connect to the index"
NOT_SENT = "not sent (the run stopped before it)"
FAILED = "failed"
# Outcomes that say the index itself is down: the other wheels would wait for nothing.
_STOPS_THE_RUN = (TIMEOUT, UNREACHABLE)
# Markers the twine wrapper below prints; twine itself would end in a traceback.
_TIMEOUT_MARK = names.prefixed("publish: timeout")
_UNREACHABLE_MARK = names.prefixed("publish: unreachable")

# twine sends its requests without a timeout: a server that accepts the connection and never
# answers holds an upload forever. This runs twine (pinned above) with requests' adapter given a
# (connect, read) timeout wherever twine passes none, and turns the timeout into one line.
_TWINE_WITH_TIMEOUTS = f"""
import sys
import requests
import requests.adapters
from twine.__main__ import main

timeout = float(sys.argv[1])
send = requests.adapters.HTTPAdapter.send

def send_with_timeouts(self, request, **kwargs):
    if kwargs.get("timeout") is None:
        kwargs["timeout"] = (timeout, timeout)
    return send(self, request, **kwargs)

requests.adapters.HTTPAdapter.send = send_with_timeouts
sys.argv = ["twine", *sys.argv[2:]]
try:
    code = main()
except requests.exceptions.Timeout as exc:
    print(f"{_TIMEOUT_MARK}: no answer within {{timeout:g}} s ({{type(exc).__name__}})")
    code = 3
except requests.exceptions.ConnectionError as exc:
    print(f"{_UNREACHABLE_MARK}: {{type(exc).__name__}}: {{exc}}")
    code = 4
sys.exit(code)
"""

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
    """``text`` without the secrets, each also as HTML and URLs write it (a server's error
    page echoes what it got), and without any ``Authorization`` header's value."""
    text = re.sub(
        r"(Authorization[\"']?\s*[:=]\s*[\"']?(?:Basic|Bearer|Token)\s+)[^\s\"',}]+",
        rf"\g<1>{MASK}",
        text,
        flags=re.IGNORECASE,
    )
    forms = {form for secret in secrets if secret for form in written_forms(secret)}
    for form in sorted(forms, key=len, reverse=True):  # a longer form may hold a shorter one
        text = text.replace(form, MASK)
    return text


def written_forms(secret: str) -> set[str]:
    """``secret`` as it is, HTML-escaped and percent-encoded (and, if it is percent-encoded
    itself, decoded): the ways a tool or a server may print it back."""
    plain = {secret, unquote(secret), unquote_plus(secret)}
    encoded = {
        form
        for text in plain
        for form in (quote(text, safe=""), quote(text, safe="/"), quote_plus(text))
    }
    escaped = {html.escape(text, quote=q) for text in plain | encoded for q in (True, False)}
    return {form for form in plain | encoded | escaped if form}


def credential_forms(username: str | None, password: str | None) -> list[str]:
    """The password and what a Basic ``Authorization`` header makes of it."""
    if not password:
        return []
    pair = f"{username or ''}:{password}".encode()
    return [password, base64.b64encode(pair).decode(), base64.urlsafe_b64encode(pair).decode()]


# Path segments and query values shorter than this are masked only as part of the whole
# path or query: masking every "1" or "x" of twine's output would hide what it says.
_URL_PART_MIN = 6


def url_secrets(url: str) -> list[str]:
    """What of an upload URL must never be printed: everything after the host (tokens ride in
    the path, ``/<token>/legacy/``, or the query, ``?api_token=``), as a whole and piece by
    piece. Only ``scheme://host[:port]`` stays readable."""
    parts = urlsplit(url)
    after_host = url.split(parts.netloc, 1)[1] if parts.netloc else url
    whole = [after_host, parts.path, parts.query, parts.fragment]
    pieces = [
        *parts.path.split("/"),
        *(value for _, value in parse_qsl(parts.query, keep_blank_values=True)),
        parts.fragment,
    ]
    return [p for p in whole if p.strip("/")] + [p for p in pieces if len(p) >= _URL_PART_MIN]


def classify(returncode: int, output: str, skip_existing: bool) -> str:
    """Map one ``twine upload`` run to an outcome."""
    if returncode == 0:
        return UPLOADED
    if _TIMEOUT_MARK in output:
        return TIMEOUT
    if _UNREACHABLE_MARK in output:
        return UNREACHABLE
    output = " ".join(html.unescape(output).split())
    if any(re.search(p, output) for p in _EXISTS_PATTERNS):
        return SKIPPED if skip_existing else EXISTS
    if any(re.search(p, output) for p in _AUTH_PATTERNS):
        return AUTH
    return FAILED


def server_answer(output: str) -> str | None:
    """The HTTP status twine reports (``"403 Forbidden"``), or the timeout/connection line."""
    for mark in (_TIMEOUT_MARK, _UNREACHABLE_MARK):
        found = re.findall(rf"^{mark}: (.*)$", output, flags=re.MULTILINE)
        if found:
            return str(found[-1]).strip()
    found = re.findall(r"HTTPError: (\d{3}\b[^\n]*?)(?: from |$)", output, flags=re.MULTILINE)
    return str(found[-1]).strip() if found else None


def check_repository_url(url: str) -> str:
    """The URL, if it is an http(s) URL without credentials. Credentials are looked for first,
    anywhere in the text (``https//user:pw@host`` is no URL but still holds a password), and a
    refused URL is never shown."""
    if "@" in url:
        raise PublishError(
            "--repository-url holds '@', as in user:password@host (not shown here); give "
            "credentials through TWINE_USERNAME / TWINE_PASSWORD or the keyring instead"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PublishError(
            f"--repository-url must be an http(s) URL with a host, got scheme "
            f"{parts.scheme or 'none'!r} and host {parts.hostname or 'none'!r}"
        )
    return url


def twine_command(wheel: Path, timeout: float) -> list[str]:
    """twine upload of one wheel; the URL goes in :func:`twine_environment`, not here."""
    return [
        sys.executable, "-c", _TWINE_WITH_TIMEOUTS, str(timeout), "--no-color", "upload",
        # --verbose: the server's reason ("... already exists") is only in the response body.
        "--non-interactive", "--disable-progress-bar", "--verbose",
        str(wheel),
    ]  # fmt: skip


def twine_environment(url: str) -> dict[str, str]:
    """twine's environment: the URL rides in ``TWINE_REPOSITORY_URL`` because every user of
    the machine can read a command line (``ps``), and a URL may hold a token."""
    return {
        **os.environ,
        "TWINE_REPOSITORY_URL": url,
        "TWINE_NON_INTERACTIVE": "1",
        # Wide output so the server's message is not broken across lines.
        "COLUMNS": "400",
    }


def upload_wheel(
    url: str, wheel: Path, skip_existing: bool = False, timeout: float = DEFAULT_TIMEOUT_S
) -> UploadResult:
    secrets = credential_forms(os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD"))
    secrets += url_secrets(url)
    try:
        proc = subprocess.run(
            twine_command(wheel, timeout),
            capture_output=True,
            text=True,
            timeout=UPLOAD_TIMEOUT_S,
            env=twine_environment(url),
        )
    except subprocess.TimeoutExpired:
        message = f"{_TIMEOUT_MARK}: twine still running after {UPLOAD_TIMEOUT_S} s, stopped"
        return UploadResult(wheel.name, TIMEOUT, message)
    output = "\n".join(line.rstrip() for line in (proc.stdout + proc.stderr).splitlines())
    output = mask_secrets(output, secrets)
    if proc.returncode != 0 and any(re.search(p, output) for p in _NO_CREDENTIALS_PATTERNS):
        raise PublishError(
            "no credentials: set TWINE_USERNAME and TWINE_PASSWORD (in CI, from the "
            "repository's secrets) or store them in the keyring for this URL\n" + output
        )
    return UploadResult(wheel.name, classify(proc.returncode, output, skip_existing), output)


def check_wheels(wheels: Sequence[Path]) -> None:
    """The index's checks (names, labels, torch pins), then ``twine check``."""
    try:
        for wheel in wheels:
            describe_wheel(wheel, require_label=False)
    except WheelError as exc:
        raise PublishError(str(exc)) from None
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "twine", "check", *map(str, wheels)],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise PublishError(f"twine check did not finish in {CHECK_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise PublishError("twine check failed:\n" + proc.stdout + proc.stderr)


def report(result: UploadResult) -> None:
    answer = "" if result.ok else server_answer(result.output)
    print(f"{result.wheel}: {result.outcome}" + (f" ({answer})" if answer else ""), flush=True)
    if result.outcome == FAILED:  # unexplained: show the end of twine's output
        tail = result.output.strip().splitlines()[-FAILURE_LINES:]
        print("\n".join("  " + line for line in tail), flush=True)


def publish(
    url: str,
    sources: Sequence[Path],
    skip_existing: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    results: list[UploadResult] | None = None,
) -> list[UploadResult]:
    """Upload every wheel under ``sources``; each result is appended to ``results`` as it
    comes, so a caller still has them when a later step raises."""
    results = [] if results is None else results
    check_repository_url(url)
    try:
        wheels = find_wheels(sources)
    except WheelError as exc:
        raise PublishError(str(exc)) from None
    if not wheels:
        raise PublishError(f"no wheels under {', '.join(map(str, sources))}")
    check_wheels(wheels)
    stopped = False
    for wheel in wheels:
        if stopped:
            result = UploadResult(wheel.name, NOT_SENT, "")
        else:
            result = upload_wheel(url, wheel, skip_existing, timeout)
            stopped = result.outcome in _STOPS_THE_RUN
        results.append(result)
        report(result)
    return results


def summary(results: Sequence[UploadResult], url: str) -> list[str]:
    host = (urlsplit(url).hostname if "@" not in url else None) or "the index"
    failed = [r for r in results if not r.ok]
    lines = [f"publish: {len(results) - len(failed)} of {len(results)} wheel(s) on {host}"]
    if any(r.outcome == EXISTS for r in results):
        lines.append(
            "publish: the index refused files it already has; a published version is never "
            "replaced: bump the version to publish new builds"
        )
    if any(r.outcome in _STOPS_THE_RUN for r in results):
        lines.append(
            "publish: the index did not answer; the wheels after it were not sent. Check the "
            "URL and the server, then run again (add --skip-existing to pass over those sent)"
        )
    return lines


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
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the index to connect and for each answer (default: %(default)g)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sources = args.wheels or [Path("wheelhouse")]
    results: list[UploadResult] = []
    status = 1
    try:
        publish(args.repository_url, sources, args.skip_existing, args.timeout, results)
        status = 0 if all(r.ok for r in results) else 1
    except PublishError as exc:
        print(f"publish: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("publish: interrupted", file=sys.stderr)
        status = 130
    finally:
        print("\n".join(summary(results, args.repository_url)), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
