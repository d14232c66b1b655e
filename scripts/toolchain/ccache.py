"""ccache (an installed one, or Debian's package extracted into the cache, no root install) and
the compiler wrappers that run every build through it, nvcc included.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from scripts import basics
from scripts.toolchain.apt import apt_download, extract_deb
from scripts.toolchain.cache import cache_dir, stamp, stamped, write_wrappers

log = basics.logger("toolchain")


def _host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "bookworm"


def ensure_ccache() -> Path | None:
    """Folder with ``ccache`` (a wrapper that finds its private libs); ``None`` if unavailable.

    Uses an installed ``ccache`` when there is one; otherwise Debian's package (and
    ``libhiredis``, its one library the base system lacks) extracted into the cache.
    Without ccache the build still works, only rebuilds are not instant.
    """
    base = cache_dir() / "ccache-tool"
    wrapper_dir = base / "bin"
    system = shutil.which("ccache")
    key = f"ccache system={system} v1\n"
    if stamped(base, key):
        return wrapper_dir
    if base.exists():
        shutil.rmtree(base)
    wrapper_dir.mkdir(parents=True)
    if system:
        (wrapper_dir / "ccache").symlink_to(system)
    else:
        try:
            suite = _host_suite()
            debs = apt_download(["ccache", "libhiredis0.14"], suite, base)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            log(f"ccache unavailable ({exc}); building without a compiler cache")
            shutil.rmtree(base, ignore_errors=True)
            return None
        tree = base / "root"
        for deb in debs:
            extract_deb(deb, tree)
        libdir = tree / "usr" / "lib" / "x86_64-linux-gnu"
        script = wrapper_dir / "ccache"
        script.write_text(
            "#!/bin/sh\n"
            f'LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
            f'exec "{tree}/usr/bin/ccache" "$@"\n'
        )
        script.chmod(0o755)
    basics.run([wrapper_dir / "ccache", "--version"], stdout=subprocess.DEVNULL, log=log)
    stamp(base, key)
    return wrapper_dir


def plain_compilers() -> dict[str, str]:
    """``CC`` and ``CXX`` without a compiler cache: the host's gcc and g++."""
    return {"CC": shutil.which("gcc") or "gcc", "CXX": shutil.which("g++") or "g++"}


def compiler_wrappers(
    ccache_bin: Path,
    cuda_home: Path | None,
    *,
    source_name: str,
    cc: str = "gcc",
    cxx: str = "g++",
) -> dict[str, str]:
    """``CC``, ``CXX`` and (with a CUDA toolkit) ``PYTORCH_NVCC`` that run through ccache.

    The wrappers are named ``gcc``/``g++`` (nvcc gets ``CC`` as ``-ccbin`` and recognises the
    host compiler by name); ``CCACHE_DIR`` lives in the cache, the wrappers in a folder of
    it named after their content (:func:`scripts.toolchain.cache.write_wrappers`).
    ``source_name``: the name nvcc's source names start with (:func:`nvcc_wrapper_script`).
    """
    ccache = ccache_bin / "ccache"
    scripts = {
        env_name: (name, f'#!/bin/sh\nexec "{ccache}" "{real}" "$@"\n')
        for env_name, name, real in (
            ("CC", "gcc", shutil.which(cc) or cc),
            ("CXX", "g++", shutil.which(cxx) or cxx),
        )
    }
    if cuda_home is not None:
        scripts["PYTORCH_NVCC"] = (
            "nvcc",
            nvcc_wrapper_script([ccache, cuda_home / "bin" / "nvcc"], source_name),
        )
    return write_wrappers(cache_dir() / "ccache-wrappers", scripts)


# nvcc, as every build runs it (PYTORCH_NVCC): release builds through ccache, the
# reproducibility check and cibuildwheel's container alike, so that the wheel a release ships
# is built the way the check proves reproducible. Two rewrites of the arguments:
# - torch's ninja rule gives nvcc --generate-dependencies-with-compile --dependency-output F.
#   ccache (4.7 here; 4.12.2 too, per ccache issue 1663) does not know those spellings: it
#   takes F for a second source file and caches no nvcc compile at all. nvcc's short names
#   for the same options, -MD -MF F, it handles (the .d file included).
# - nvcc hands cudafe++ and cicc the absolute path of each .cu file (--orig_src_path_name),
#   and they hash it into the object's module ID and anonymous-namespace names: two build
#   folders, two binaries. Torch passes one flag list to every .cu file, so the per-file name
#   goes in here: the project's name, then the path from the nearest folder above the file
#   that holds a setup.py or pyproject.toml (the build's copy of the project, wherever it
#   lies: a cache folder, the reproducibility check's run folder, a container's /project).
NVCC_ARGUMENT_REWRITES = """\
src=
for arg do
  shift
  case "$arg" in
    --generate-dependencies-with-compile) set -- "$@" -MD ;;
    --dependency-output) set -- "$@" -MF ;;
    --dependency-output=*) set -- "$@" -MF "${arg#--dependency-output=}" ;;
    *.cu) src="$arg"; set -- "$@" "$arg" ;;
    *) set -- "$@" "$arg" ;;
  esac
done
case "$src" in
  /*)
    dir="${src%/*}"
    while [ -n "$dir" ] && [ ! -f "$dir/setup.py" ] && [ ! -f "$dir/pyproject.toml" ]; do
      dir="${dir%/*}"
    done
    if [ -n "$dir" ]; then
      set -- "$@" "-Xcudafe=--orig_src_path_name=$source_name/${src#"$dir"/}"
    fi
    ;;
esac
"""


def nvcc_wrapper_script(command: Sequence[str | Path], source_name: str) -> str:
    """A shell script running ``command`` (``[ccache] nvcc``) with NVCC_ARGUMENT_REWRITES;
    ``source_name`` (the project table's ``import-name``) starts each source's name."""
    quoted = " ".join(f'"{part}"' for part in command)
    return (
        f"#!/bin/sh\nsource_name={shlex.quote(source_name)}\n"
        f'{NVCC_ARGUMENT_REWRITES}exec {quoted} "$@"\n'
    )


def ccache_env() -> dict[str, str]:
    return {
        "CCACHE_DIR": str(cache_dir() / "ccache"),
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "5G"),
        # No CCACHE_BASEDIR: it hands the compiler relative paths, which -ffile-prefix-map
        # does not map, so __FILE__ would read ../../csrc/… in a release wheel and
        # <import-name>/csrc/… in the reproducibility check's. Builds of a variant run in one
        # folder of the cache (build.build_wheel), so absolute paths repeat and still hit.
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
    }
