"""scripts/publish.py: twine uploads to a real pypiserver on 127.0.0.1, then pip and uv install
from it in fresh venvs holding the real torch 2.11."""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import re
import secrets
import shutil
import sys
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from index_helpers import (
    REPO,
    TORCH_VARIANT,
    VARIANTS,
    free_port,
    installed_hotloop,
    isolated_env,
    make_tiny_wheel,
    make_tool_venv,
    make_torch_venv,
    make_variant_wheels,
    pip_install,
    pypiserver,
    release_members,
    run,
    silent_server,
    uv_pip_install,
    write_htpasswd,
)

from scripts import publish, pypi_release, sbom

WHEEL_TAG = "cp39-abi3-manylinux_2_28_x86_64"

USER = "hotloop-ci"


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(python of a venv with twine and pypiserver, uv)."""
    return make_tool_venv(tmp_path_factory.mktemp("tools") / "venv")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tools: tuple[Path, str]):
    """pypiserver on 127.0.0.1 with one user; yields (base URL, package folder, password)."""
    root = tmp_path_factory.mktemp("pypiserver")
    password = secrets.token_urlsafe(16)
    write_htpasswd(tools[0], root / "htpasswd", USER, password)
    packages = root / "packages"
    packages.mkdir()
    with pypiserver(tools[0], packages, root / "htpasswd", root / "server.log") as url:
        yield url, packages, password


def run_publish(tools, url: str, wheels: Path, password: str | None, *extra: str):
    creds = {"TWINE_USERNAME": USER, "TWINE_PASSWORD": password} if password else {}
    return run(
        [
            tools[0],
            "-m",
            "scripts.publish",
            "--repository-url",
            url + "/",
            "--wheels",
            wheels,
            *extra,
        ],
        env=isolated_env(**creds),
        cwd=REPO,
        check=False,
    )


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_variant_wheels(tmp_path_factory.mktemp("wheelhouse"))[0].parent


@pytest.fixture(scope="module")
def uploaded(tools, server, wheel_dir: Path):
    url, _, password = server
    return run_publish(tools, url, wheel_dir, password)


def test_upload_puts_every_variant_on_the_server(uploaded, server, wheel_dir: Path) -> None:
    _, packages, password = server
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    assert f"publish: {len(VARIANTS)} of {len(VARIANTS)} wheel(s) on 127.0.0.1" in uploaded.stdout
    for wheel in wheel_dir.glob("*.whl"):
        assert (packages / wheel.name).read_bytes() == wheel.read_bytes()
    assert password not in uploaded.stdout + uploaded.stderr


def test_pip_picks_the_variant_of_installed_torch(uploaded, server, tools, tmp_path: Path) -> None:
    url = server[0]
    python = make_torch_venv(tmp_path / "venv", tools[1])
    pip_install(python, "--index-url", f"{url}/simple/")
    assert installed_hotloop(python) == f"0.1.0+{TORCH_VARIANT}"


def test_uv_picks_the_variant_of_installed_torch(uploaded, server, tools, tmp_path: Path) -> None:
    url = server[0]
    python = make_torch_venv(tmp_path / "venv", tools[1])
    uv_pip_install(tools[1], python, "--index-url", f"{url}/simple/")
    assert installed_hotloop(python) == f"0.1.0+{TORCH_VARIANT}"


def test_reupload_is_refused_and_reported(uploaded, server, tools, tmp_path: Path) -> None:
    url, packages, password = server
    # Same file name, other bytes: the server must keep what it has.
    rebuilt = make_tiny_wheel(tmp_path / "rebuilt", TORCH_VARIANT, requires_python=">=3.10")
    before = (packages / rebuilt.name).read_bytes()
    assert before != rebuilt.read_bytes()
    proc = run_publish(tools, url, rebuilt.parent, password)
    assert proc.returncode == 1
    assert f"{rebuilt.name}: already on the index (refused, not overwritten)" in proc.stdout
    assert "bump the version" in proc.stdout
    assert (packages / rebuilt.name).read_bytes() == before
    skipped = run_publish(tools, url, rebuilt.parent, password, "--skip-existing")
    assert skipped.returncode == 0
    assert "already on the index (skipped)" in skipped.stdout


def test_wrong_password_is_refused(server, tools, tmp_path: Path) -> None:
    url, packages, password = server
    wheel = make_tiny_wheel(tmp_path / "w", TORCH_VARIANT, version="0.1.1")
    wrong = "not-" + password
    proc = run_publish(tools, url, wheel.parent, wrong)
    assert proc.returncode == 1
    assert "refused: the index did not accept the credentials" in proc.stdout
    assert "(403 Forbidden)" in proc.stdout
    assert wrong not in proc.stdout + proc.stderr
    assert not (packages / wheel.name).exists()


def test_no_credentials_stops_with_a_clear_message(server, tools, tmp_path: Path) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", TORCH_VARIANT, version="0.1.2")
    proc = run_publish(tools, server[0], wheel.parent, None)
    assert proc.returncode == 1
    assert "no credentials: set TWINE_USERNAME and TWINE_PASSWORD" in proc.stderr
    assert not (server[1] / wheel.name).exists()


def test_anonymous_upload_is_refused_by_the_server(server, tmp_path: Path) -> None:
    """A bare upload request (what twine sends, without Authorization) is turned away."""
    url, packages, _ = server
    wheel = make_tiny_wheel(tmp_path / "w", TORCH_VARIANT, version="0.1.3")
    boundary = uuid.uuid4().hex
    fields = [
        (b'name=":action"', b"file_upload"),
        (b'name="name"', b"hotloop"),
        (b'name="version"', b"0.1.3+" + TORCH_VARIANT.encode()),
        (b'name="content"; filename="' + wheel.name.encode() + b'"', wheel.read_bytes()),
    ]
    body = b"".join(
        b"--" + boundary.encode() + b"\r\nContent-Disposition: form-data; " + disposition
        + b"\r\n\r\n" + value + b"\r\n"
        for disposition, value in fields
    ) + b"--" + boundary.encode() + b"--\r\n"  # fmt: skip
    request = urllib.request.Request(
        url + "/",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    refused.value.close()  # the error holds the response and its socket
    assert refused.value.code in (401, 403)
    assert not (packages / wheel.name).exists()


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("output", "outcome"),
    [
        ("HTTPError: 400 Bad Request ... Package &#039;x.whl&#039;\n; already exists!", "exists"),
        (
            "HTTPError: 400 Bad Request from https://upload.pypi.org/legacy/ File already exists",
            "exists",
        ),
        ("HTTPError: 409 Conflict from http://127.0.0.1:1/", "exists"),
        ("HTTPError: 403 Forbidden from http://127.0.0.1:1/", "auth"),
        ("HTTPError: 500 Internal Server Error", "failed"),
    ],
)
def test_classify(output: str, outcome: str) -> None:
    expected = {"exists": publish.EXISTS, "auth": publish.AUTH, "failed": publish.FAILED}[outcome]
    assert publish.classify(1, output, skip_existing=False) == expected
    if outcome == "exists":
        assert publish.classify(1, output, skip_existing=True) == publish.SKIPPED
    assert publish.classify(0, output, skip_existing=False) == publish.UPLOADED


def test_repository_url_without_a_scheme_is_refused() -> None:
    with pytest.raises(publish.PublishError, match="must be an http"):
        publish.check_repository_url("index.invalid/legacy/")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://alice:sekrit123@index.invalid/",
        "https//alice:sekrit123@index.invalid/",  # the typo: no URL at all, still a password
        "https://alice:sekrit123@index.invalid/legacy/",
        "alice:sekrit123@index.invalid",
        "https://index.invalid/?next=alice:sekrit123@x",
    ],
)
def test_credentials_in_the_url_are_refused_first_and_never_shown(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # No wheels there: the URL is refused before anything else is looked at.
    status = publish.main(["--repository-url", url, "--wheels", str(tmp_path / "none")])
    assert status == 1
    out, err = capsys.readouterr()
    assert "holds '@', as in user:password@host" in err
    assert "sekrit123" not in out + err
    assert "alice" not in out + err


def test_mask_secrets() -> None:
    assert (
        publish.mask_secrets("pw=abc123 and abc123", ["abc123", None, ""])
        == "pw=******** and ********"
    )


def test_mask_secrets_hides_the_basic_authorization_form() -> None:
    token = base64.b64encode(b"hotloop-ci:abc123").decode()
    text = f"sent Authorization: Basic {token}\nheaders={{'authorization': 'Bearer xyz'}}\n{token}"
    masked = publish.mask_secrets(text, publish.credential_forms("hotloop-ci", "abc123"))
    assert token not in masked
    assert "xyz" not in masked
    assert "Authorization: Basic ********" in masked


def test_mask_secrets_hides_the_escaped_and_encoded_password() -> None:
    password = "p&<w>%d/ \"q'"
    text = " | ".join(
        [html.escape(password), html.escape(password, quote=False), quote(password, safe=""),
         quote_plus(password), quote(password)]
    )  # fmt: skip
    masked = publish.mask_secrets(text, publish.credential_forms("hotloop-ci", password))
    assert masked == " | ".join([publish.MASK] * 5)


def test_twine_gets_the_url_outside_its_command_line(tmp_path: Path) -> None:
    """A process list shows every command line on the machine: the URL stays out of it."""
    url = "https://index.invalid/T0KEN/legacy/?api_token=T0KEN"
    assert not any("T0KEN" in arg for arg in publish.twine_command(tmp_path / "x.whl", 1.0))
    assert publish.twine_environment(url)["TWINE_REPOSITORY_URL"] == url


TOKENS = ("pathT0KEN9f3a", "queryT0KEN7c1e", "fragT0KEN42")


def url_with_tokens(base: str) -> str:
    return f"{base.rstrip('/')}/{TOKENS[0]}/legacy/?api_token={TOKENS[1]}&x=1#{TOKENS[2]}"


@pytest.mark.parametrize("where", ["unreachable", "refused"])
def test_a_token_in_the_url_path_or_query_is_never_printed(
    tools, server, wheel_dir: Path, where: str
) -> None:
    """Token-in-URL indexes (`?api_token=`, `/<token>/legacy/`): whatever twine and requests
    say about the URL reaches the output with the path, query and fragment masked."""
    base = f"http://127.0.0.1:{free_port()}/" if where == "unreachable" else server[0]
    url = url_with_tokens(base)
    proc = run(
        [tools[0], "-m", "scripts.publish", "--repository-url", url, "--wheels", wheel_dir],
        env=isolated_env(TWINE_USERNAME=USER, TWINE_PASSWORD="not-the-password"),
        cwd=REPO,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1
    # No server at that port, or one that has no such path (pypiserver answers 404).
    expected = publish.UNREACHABLE if where == "unreachable" else "failed (404 Not Found)"
    assert expected in output
    assert "publish: 0 of 4 wheel(s) on 127.0.0.1" in output
    for token in TOKENS:
        assert token not in output
    assert "Traceback" not in output


def test_an_invalid_wheel_name_is_not_published(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", TORCH_VARIANT)
    wheel.rename(wheel.with_name("X (1).whl"))
    status = publish.main(
        ["--repository-url", "http://127.0.0.1:9/", "--wheels", str(wheel.parent)]
    )
    assert status == 1
    out, err = capsys.readouterr()
    assert "'X (1).whl' is not a wheel file name" in err
    assert "publish: 0 of 0 wheel(s) on 127.0.0.1" in out


def test_two_different_files_with_one_name_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    make_tiny_wheel(tmp_path / "a", TORCH_VARIANT)
    make_tiny_wheel(tmp_path / "b", TORCH_VARIANT, requires_python=">=3.10")
    args = ["--repository-url", "http://127.0.0.1:9/", "--wheels", str(tmp_path)]
    assert publish.main(args) == 1
    out, err = capsys.readouterr()
    assert "two different files named 'hotloop-0.1.0+stable.cu13-" in err
    assert "Traceback" not in out + err


def test_an_index_that_never_answers_is_reported_per_wheel(tools, wheel_dir: Path) -> None:
    with silent_server() as url:
        started = time.monotonic()
        proc = run(
            [
                tools[0], "-m", "scripts.publish", "--repository-url", url,
                "--wheels", wheel_dir, "--timeout", "2",
            ],
            env=isolated_env(TWINE_USERNAME=USER, TWINE_PASSWORD="pw"),
            cwd=REPO,
            check=False,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert proc.returncode == 1
    first, *others = sorted(p.name for p in wheel_dir.glob("*.whl"))
    assert f"{first}: no answer from the index in time (no answer within 2 s (ReadTimeout))" in (
        proc.stdout
    )
    for name in others:
        assert f"{name}: not sent (the run stopped before it)" in proc.stdout
    assert f"publish: 0 of {len(VARIANTS)} wheel(s) on 127.0.0.1" in proc.stdout
    assert "the index did not answer" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert elapsed < 60


def test_server_answer() -> None:
    output = "WARNING  Error during upload.\nERROR    HTTPError: 403 Forbidden from http://127.0.0.1:1/\n"
    assert publish.server_answer(output) == "403 Forbidden"
    assert publish.server_answer("ERROR    NonInteractive: Credential not found") is None


# --------------------------------------------------------------------------- the PyPI upload


def record_rows(zf: zipfile.ZipFile, name: str) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(zf.read(name).decode())) if row]


@pytest.fixture(scope="module")
def pypi_upload(tmp_path_factory: pytest.TempPathFactory, wheel_dir: Path) -> Path:
    """``python -m scripts.pypi_release`` over every variant, with a binary member added to
    the stable CUDA 13 wheel (and its RECORD line) like the real extension."""
    root = tmp_path_factory.mktemp("pypi")
    wheels = root / "wheels"
    shutil.copytree(wheel_dir, wheels)
    make_tiny_wheel(
        wheels,
        "stable.cu13",
        extra_files={
            "hotloop/_C.abi3.so": bytes(range(256)) * 512,
            **release_members("stable.cu13"),
        },
        # A README body, as the real METADATA has: twine check --strict wants one, and a
        # "Version: 0.1.0+stable.cu13" line in it is text, not the header.
        extra_metadata="Description-Content-Type: text/markdown\n\n# hotloop\n\n"
        "Version: 0.1.0+stable.cu13\n",
    )
    proc = run(
        [sys.executable, "-m", "scripts.pypi_release", "--wheels", wheels, "--out", root / "out"],
        cwd=REPO,
    )
    assert proc.stdout.count("pypi_release: ") == 1, proc.stdout
    return root


def test_pypi_upload_is_the_stable_cuda13_wheel_under_the_public_version(
    pypi_upload: Path,
) -> None:
    source = pypi_upload / "wheels" / f"hotloop-0.1.0+stable.cu13-{WHEEL_TAG}.whl"
    (public,) = (pypi_upload / "out").iterdir()
    assert public.name == f"hotloop-0.1.0-{WHEEL_TAG}.whl"
    old, new = "hotloop-0.1.0+stable.cu13.dist-info/", "hotloop-0.1.0.dist-info/"
    with zipfile.ZipFile(source) as a, zipfile.ZipFile(public) as b:
        assert [i.filename.replace(old, new) for i in a.infolist()] == b.namelist()
        for info in a.infolist():
            mine = b.getinfo(info.filename.replace(old, new))
            assert (mine.date_time, mine.external_attr) == (info.date_time, info.external_attr)
            described = (
                "METADATA",
                "RECORD",
                sbom.sbom_path("hotloop"),
            )  # test_audit checks the rest
            if info.filename in [old + name for name in described] + ["hotloop/_build_info.py"]:
                continue
            assert b.read(mine) == a.read(info), info.filename  # byte-identical
        metadata = b.read(new + "METADATA")
        assert metadata == a.read(old + "METADATA").replace(
            b"Version: 0.1.0+stable.cu13\n", b"Version: 0.1.0\n", 1
        )
        assert metadata.endswith(b"\n\nVersion: 0.1.0+stable.cu13\n")
        # RECORD: the renamed files, every hash right.
        rows = record_rows(b, new + "RECORD")
        assert sorted(row[0] for row in rows) == sorted(b.namelist())
        for path, digest, size in rows:
            if path == new + "RECORD":
                assert (digest, size) == ("", "")
                continue
            data = b.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), path
            assert int(size) == len(data)


def test_pypi_upload_passes_twine_check_and_installs(
    pypi_upload: Path, tools: tuple[Path, str], tmp_path: Path
) -> None:
    (public,) = (pypi_upload / "out").iterdir()
    checked = run([tools[0], "-m", "twine", "check", "--strict", public])
    assert "PASSED" in checked.stdout
    uv = tools[1]
    run([uv, "venv", "-q", "--seed", "-p", sys.executable, tmp_path / "venv"])
    python = tmp_path / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "--no-deps", "--no-cache-dir", public])
    code = (
        "import importlib.metadata as m, hotloop\n"
        "print(m.version('hotloop'), m.requires('hotloop'), hotloop.VARIANT)"
    )
    assert run([python, "-c", code]).stdout.split() == ["0.1.0", "['torch>=2.10']", "stable.cu13"]


def test_pypi_upload_never_overwrites(pypi_upload: Path, capsys: pytest.CaptureFixture) -> None:
    (public,) = (pypi_upload / "out").iterdir()
    before = public.read_bytes()
    args = ["--wheels", str(pypi_upload / "wheels"), "--out", str(pypi_upload / "out")]
    assert pypi_release.main(args) == 1
    assert "exists already; a release file is never overwritten" in capsys.readouterr().err
    assert public.read_bytes() == before


@pytest.mark.parametrize(
    ("variants", "message"),
    [(("pt29cu128", "stable.cu12"), "no stable.cu13 wheel under")],
)
def test_pypi_upload_needs_the_stable_cuda13_wheel(
    tmp_path: Path, variants: tuple[str, ...], message: str, capsys: pytest.CaptureFixture
) -> None:
    make_variant_wheels(tmp_path / "w", variants)
    args = ["--wheels", str(tmp_path / "w"), "--out", str(tmp_path / "out")]
    assert pypi_release.main(args) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_pypi_upload_refuses_a_wheel_whose_record_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wheel = make_tiny_wheel(
        tmp_path / "w", "stable.cu13", extra_files=release_members("stable.cu13")
    )
    with zipfile.ZipFile(wheel, "a") as zf:  # a file RECORD does not list
        zf.writestr("hotloop/added_later.py", "")
    args = ["--wheels", str(wheel.parent), "--out", str(tmp_path / "out")]
    assert pypi_release.main(args) == 1
    assert "RECORD does not list the wheel's files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def stored_copy(wheel: Path, change=None) -> Path:
    """``wheel`` rewritten uncompressed (its bytes findable in the file), members passed
    through ``change(name, data) -> data`` first."""
    with zipfile.ZipFile(wheel) as zf:
        members = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for info, data in members:
            info.compress_type = zipfile.ZIP_STORED
            zf.writestr(info, change(info.filename, data) if change else data)
    return wheel


def record_with_a_short_row(name: str, data: bytes) -> bytes:
    if not name.endswith("/RECORD"):
        return data
    lines = data.decode().splitlines()
    path, digest, _ = lines[0].split(",")
    return "\n".join([f"{path},{digest}", *lines[1:]]).encode() + b"\n"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("crc", r"hotloop/_C\.abi3\.so cannot be read from the zip: Bad CRC-32"),
        ("short-record-row", r"RECORD line 1 .* has 2 fields, need path,hash,size"),
        ("not-a-zip", r"not a readable zip file"),
    ],
)
def test_pypi_upload_names_the_file_and_the_problem_of_a_damaged_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture, damage: str, message: str
) -> None:
    payload = bytes(range(256)) * 8
    wheel = make_tiny_wheel(
        tmp_path / "w",
        "stable.cu13",
        extra_files={"hotloop/_C.abi3.so": payload, **release_members("stable.cu13")},
    )
    if damage == "crc":
        stored_copy(wheel)
        data = wheel.read_bytes()
        at = data.index(payload) + 100
        wheel.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    elif damage == "short-record-row":
        stored_copy(wheel, record_with_a_short_row)
    else:
        wheel.write_bytes(b"not a zip at all")
    args = ["--wheels", str(wheel.parent), "--out", str(tmp_path / "out")]
    assert pypi_release.main(args) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (line,) = err.splitlines()
    assert line.startswith(f"pypi_release: {wheel.name}: ")
    assert re.search(message, line), line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
