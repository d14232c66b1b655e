"""Build of hotloop's `_C` extension.

Everything is derived from the torch installed in the build environment and from
environment variables, so an sdist builds on its own (this file never imports
`scripts/`):

HOTLOOP_ABI           auto (default) | stable | pinned: which torch API the ops are built on.
                      stable: the LibTorch stable ABI (torch >= 2.10; one wheel serves every
                      later torch); pinned: ATen, loadable only into this torch minor. auto
                      takes stable wherever the installed torch allows it.
HOTLOOP_CUDA          auto (default) | 1 | 0: build the CUDA kernels. auto builds them when
                      torch is a CUDA build and a toolkit is found (CUDA_HOME); 1 fails
                      without one; 0 builds the CPU kernels only.
CUDA_HOME             toolkit root (bin/nvcc, include/).
TORCH_CUDA_ARCH_LIST  GPU architectures, torch's syntax ("8.0;9.0+PTX"; "9.0a" for an
                      arch-specific target, recorded as sm_90a).
HOTLOOP_SYSROOT       glibc sysroot to compile and link against (docs/toolchain.md: it keeps
                      the extension's symbol versions within manylinux_2_28).
NVCC_THREADS          nvcc --threads (default 2).
SOURCE_DATE_EPOCH     build time recorded in hotloop/_build_info.py.
HOTLOOP_GIT_COMMIT    commit recorded in the build info when git can't tell (an sdist, or a
                      tree unpacked inside another checkout).
HOTLOOP_RELEASED_VARIANTS  comma-separated labels of the wheels the release builds (set by
                      `nox -s wheels`): the import guard suggests only those.
MAX_JOBS, CC, CXX, PYTORCH_NVCC are read by torch's build as usual; the build info records the
                      version of the CXX and PYTORCH_NVCC it ran (a command line: "ccache g++").
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from setuptools import Extension, setup
from torch.utils import cpp_extension

# Python's stable ABI version `hotloop._C` is compiled for; the wheel is tagged cp39-abi3.
PY_LIMITED_API = "0x03090000"
ROOT = Path(__file__).parent.resolve()
# The ops, in a shared library without Python (loadable by a C++ program too).
OPS_LIBRARY_MODULE = "hotloop.libhotloop_ops"
OPS_LIBRARY_FILE = "libhotloop_ops.so"


def load_variant_rule():
    """src/hotloop/_variant.py, the one place for labels and torch pins (loaded by path:
    importing the hotloop package would need the extension this file builds)."""
    path = ROOT / "src" / "hotloop" / "_variant.py"
    spec = importlib.util.spec_from_file_location("hotloop_variant_rule", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


variant_rule = load_variant_rule()


def abi_kind() -> str:
    mode = os.environ.get("HOTLOOP_ABI", "auto").lower()
    if mode not in {"auto", variant_rule.STABLE, variant_rule.PINNED}:
        raise SystemExit(f"HOTLOOP_ABI must be auto, stable or pinned, got {mode!r}")
    try:
        installed = variant_rule.kind_for(torch.__version__)
    except ValueError as err:
        raise SystemExit(f"the build environment's {err}") from None
    if mode == "auto":
        return installed
    if mode == variant_rule.STABLE and installed != mode:
        floor = variant_rule.minor_text(variant_rule.STABLE_ABI_FLOOR)
        raise SystemExit(
            f"HOTLOOP_ABI=stable needs torch >= {floor} in the build environment, found "
            f"{torch.__version__}; use HOTLOOP_ABI=pinned (or auto) for this torch"
        )
    return mode


def stable_target_version() -> str:
    """TORCH_TARGET_VERSION for the floor: 0x020a000000000000 for torch 2.10."""
    major, minor = variant_rule.STABLE_ABI_FLOOR
    return f"0x{major:02x}{minor:02x}000000000000"


def want_cuda() -> bool:
    mode = os.environ.get("HOTLOOP_CUDA", "auto").lower()
    if mode not in {"auto", "0", "1"}:
        raise SystemExit(f"HOTLOOP_CUDA must be auto, 0 or 1, got {mode!r}")
    toolkit_found = cpp_extension.CUDA_HOME is not None
    if mode == "1":
        if torch.version.cuda is None:
            raise SystemExit(
                f"HOTLOOP_CUDA=1 but the installed torch {torch.__version__} is a CPU build; "
                "install a CUDA build of torch in the build environment"
            )
        if not toolkit_found:
            raise SystemExit(
                "HOTLOOP_CUDA=1 but no CUDA toolkit was found: set CUDA_HOME to a folder with "
                "bin/nvcc (`nox -s wheels` installs one from PyPI)"
            )
        return True
    return mode == "auto" and torch.version.cuda is not None and toolkit_found


# A target in nvcc's -gencode code= form: sm_90, compute_120, and the arch- and
# family-specific sm_90a, sm_100a, sm_100f that TORCH_CUDA_ARCH_LIST's 9.0a, 10.0f ask for.
ARCH_TARGET = re.compile(r"(?:sm|compute)_(?P<number>[0-9]+)(?P<suffix>[a-z]*)")


def compiled_archs() -> list[str]:
    """The archs nvcc is asked for, in build-info form (sm_90, sm_90a, compute_120 for PTX),
    ordered by compute capability."""
    flags = cpp_extension._get_cuda_arch_flags()
    archs = []
    for flag in flags:
        # flags look like -gencode=arch=compute_90,code=sm_90 (or code=compute_120 for PTX)
        code = flag.rpartition("code=")[2].strip("[]")
        archs.extend(c for c in code.split(",") if c)
    unknown = [a for a in archs if not ARCH_TARGET.fullmatch(a)]
    if unknown:
        raise SystemExit(
            f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST')!r} gave nvcc targets "
            f"{', '.join(unknown)}, expected sm_XY[a|f] or compute_XY[a|f]"
        )

    def order(arch: str) -> tuple[int, str, str]:
        match = ARCH_TARGET.fullmatch(arch)
        return int(match["number"]), match["suffix"], arch

    return sorted(set(archs), key=order)


def git_commit() -> str:
    """The commit the build info names: HOTLOOP_GIT_COMMIT (the pipeline's, whose
    scripts/build.py marks a tree whose sources differ from HEAD "-dirty"), else HEAD, with
    "-dirty" when this tree differs from it, where a checkout tracks this tree. Without the
    pipeline's list of sources any change counts: a plain `pip wheel .` of an edited tree must
    not name HEAD as its source."""
    if commit := os.environ.get("HOTLOOP_GIT_COMMIT"):
        return commit

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        # git looks upwards: a tree it does not track (an unpacked sdist, an ignored copy)
        # inside somebody else's checkout would take that checkout's HEAD
        git("rev-parse", "--verify", "--quiet", "HEAD:./")  # fails where HEAD has no such folder
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def released_variants() -> list[str]:
    labels = [v for v in os.environ.get("HOTLOOP_RELEASED_VARIANTS", "").split(",") if v]
    for label in labels:
        try:
            variant_rule.parse_label(label)
        except ValueError as err:
            raise SystemExit(f"HOTLOOP_RELEASED_VARIANTS: {err}") from None
    return labels


def build_time() -> str:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or int(
        datetime.datetime.now(datetime.timezone.utc).timestamp()
    )
    stamp = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def compiler_version(command: str, banner_last: bool = False) -> list[str]:
    """``[name, version line]`` of a compiler as the build runs it: ``command`` is a command
    line (``ccache g++`` as much as ``/usr/bin/g++``), asked for ``--version`` the same way."""
    argv = shlex.split(command)
    try:
        out = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError, IndexError) as err:
        raise SystemExit(
            f"the build's compiler {command!r} does not run ({err}); set CXX (or PYTORCH_NVCC) "
            "to a compiler command"
        ) from None
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"the build's compiler {command!r} printed no version for --version")
    # nvcc prints a banner; its last line names the release and build.
    return [Path(argv[-1]).name, lines[-1] if banner_last else lines[0]]


def build_compilers(with_cuda: bool) -> list[list[str]]:
    """The compilers torch's build runs here, as torch.utils.cpp_extension picks them: $CXX
    (else c++) for C++, $PYTORCH_NVCC (else CUDA_HOME/bin/nvcc) for CUDA. The SBOM names these,
    not whatever $CXX the process that writes it happens to have."""
    compilers = [compiler_version(os.environ.get("CXX") or "c++")]
    if with_cuda:
        nvcc = os.environ.get("PYTORCH_NVCC") or str(Path(cpp_extension.CUDA_HOME, "bin", "nvcc"))
        compilers.append(compiler_version(nvcc, banner_last=True))
    return compilers


def write_build_info(variant, with_cuda: bool, archs: list[str]) -> None:
    info = {
        "version": variant.version,
        # What the build is, whatever version a copy of the wheel is published under (PyPI's
        # has no label): the import guard reads this.
        "variant": variant.label,
        "abi": variant.kind,
        "requires_torch": variant.requires_torch,
        "torch_version": torch.__version__,
        "torch_minor": variant_rule.minor_text(variant_rule.torch_minor(torch.__version__)),
        "cuda_version": torch.version.cuda if with_cuda else None,
        "archs": archs,
        "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
        "compilers": build_compilers(with_cuda),
        "git_commit": git_commit(),
        "released_variants": released_variants(),
        "build_time": build_time(),
    }
    lines = ['"""Generated by setup.py at build time; do not edit."""', "", "BUILD_INFO = {"]
    lines += [f"    {key!r}: {value!r}," for key, value in info.items()]
    lines += ["}", ""]
    (ROOT / "src" / "hotloop" / "_build_info.py").write_text("\n".join(lines))


def sysroot_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags that target the glibc in HOTLOOP_SYSROOT."""
    sysroot = os.environ.get("HOTLOOP_SYSROOT")
    if not sysroot:
        return [], []
    if not Path(sysroot, "usr", "include", "stdio.h").is_file():
        raise SystemExit(f"HOTLOOP_SYSROOT={sysroot} has no usr/include/stdio.h: not a sysroot")
    # The sysroot's lib dirs go before gcc's built-in ones: otherwise the host's
    # libpthread is found and binds symbols newer than manylinux_2_28 allows.
    libdirs = [f"{sysroot}/usr/lib/x86_64-linux-gnu", f"{sysroot}/lib/x86_64-linux-gnu"]
    return [f"--sysroot={sysroot}"], [f"--sysroot={sysroot}", *(f"-L{d}" for d in libdirs)]


def prefix_map_flags(sysroot_cflags: list[str]) -> list[str]:
    """``-ffile-prefix-map`` for each folder a build's path can leak from into the binary.

    ``__FILE__`` in TORCH_CHECK and in torch's inline headers becomes a string in ``_C``: with
    the sources, the build venv's site-packages, the sysroot and the CUDA toolkit mapped to
    fixed names, two builds in different folders give the same bytes.
    """
    folders = {ROOT: "hotloop", Path(torch.__file__).parent.parent: "site-packages"}
    folders.update({Path(f.split("=", 1)[1]): "sysroot" for f in sysroot_cflags})
    if cpp_extension.CUDA_HOME:
        folders[Path(cpp_extension.CUDA_HOME)] = "cuda"
    flags = []
    for folder, name in folders.items():
        # The compiler sees abspath()s; the resolved path too where a symlink is involved.
        for form in dict.fromkeys((os.path.abspath(folder), str(Path(folder).resolve()))):
            flags.append(f"-ffile-prefix-map={form}={name}")
    return flags


def nvcc_random_seed() -> list[str]:
    """``-frandom-seed`` where nvcc has it (CUDA 13; Debian's 12.4 has not).

    nvcc otherwise draws random numbers for generated symbol names: two builds, two binaries.
    """
    nvcc = Path(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
    try:
        usage = subprocess.run([str(nvcc), "--help"], capture_output=True, text=True).stdout
    except OSError:
        return []
    return ["-frandom-seed=hotloop"] if "--frandom-seed" in usage else []


def is_rpath_flag(arg: str) -> bool:
    return arg.startswith(("-Wl,-rpath,", "-Wl,-rpath="))


class BuildHotloopExtensions(cpp_extension.BuildExtension):
    """torch's BuildExtension, with hotloop's Py_LIMITED_API and a plain library name.

    torch adds -DPy_LIMITED_API for its minimum CPython (3.10 since torch 2.10); the
    wheel is tagged cp39-abi3, so `_C` must compile against the 3.9 stable ABI. The ops
    library is no Python module: it gets a library's name, not an extension suffix.
    """

    def build_extensions(self) -> None:
        # An interpreter built with --enable-shared (pyenv's) puts -Wl,-rpath,<its lib folder>
        # in LDSHARED: a machine path in the wheel that the loader would search on users'
        # machines. Nothing needs it: torch's libraries are loaded before hotloop's.
        for attr in ("linker_so", "linker_so_cxx"):
            command = getattr(self.compiler, attr, None)
            if command:
                setattr(self.compiler, attr, [a for a in command if not is_rpath_flag(a)])
        super().build_extensions()

    def build_extension(self, ext) -> None:
        for flags in ext.extra_compile_args.values():
            flags[:] = [
                f"-DPy_LIMITED_API={PY_LIMITED_API}" if f.startswith("-DPy_LIMITED_API=") else f
                for f in flags
            ]
        super().build_extension(ext)

    def get_ext_filename(self, fullname: str) -> str:
        # Called with the full dotted name and, by get_ext_fullpath, with its last part.
        *package, name = fullname.split(".")
        if name == OPS_LIBRARY_MODULE.rpartition(".")[2]:
            return os.path.join(*package, OPS_LIBRARY_FILE)
        return super().get_ext_filename(fullname)


# What each kind links: the stable ABI reaches torch only through libtorch_cpu's C
# shim (and libtorch_cuda's for the CUDA stream), never libc10 or libtorch_python;
# nothing links libtorch_python, so the library loads in a process without Python.
STABLE_LIBRARIES = {"cpu": ["torch_cpu"], "cuda": ["torch_cpu", "torch_cuda", "cudart"]}
UNLINKED_PINNED_LIBRARIES = {"torch_python"}


def ops_library(kind: str, with_cuda: bool) -> Extension:
    csrc = ROOT / "csrc"
    sources = sorted(
        str(p.relative_to(ROOT)) for p in csrc.rglob("*.cpp") if p.name != "python_module.cpp"
    )
    sysroot_cflags, sysroot_ldflags = sysroot_flags()
    defines = []
    if kind == variant_rule.STABLE:
        # TORCH_STABLE_ONLY turns any use of an unstable API into a compile error.
        defines = [
            "-DHOTLOOP_STABLE_ABI",
            f"-DTORCH_TARGET_VERSION={stable_target_version()}",
            "-DTORCH_STABLE_ONLY",
        ]
    if with_cuda:
        defines.append("-DUSE_CUDA")
    prefix_maps = prefix_map_flags(sysroot_cflags)
    # -Wno-psabi: the CPU kernels' 64-byte vectors (common/cpu_vec.h) pass only between
    # functions with internal linkage, so g++'s note that their calling convention differs
    # without AVX-512 never applies (and a pragma can't silence it: g++ reports it late).
    compile_args = {"cxx": ["-O3", "-g0", "-Wno-psabi", *defines, *sysroot_cflags, *prefix_maps]}
    if with_cuda:
        sources += sorted(str(p.relative_to(ROOT)) for p in csrc.rglob("*.cu"))
        compile_args["nvcc"] = [
            "-O3",
            *defines,
            f"--threads={os.environ.get('NVCC_THREADS', '2')}",
            "-Xfatbin=-compress-all",
            # Intermediate files named after the object, not tmpxft_<pid>_...: those names
            # end up in symbol names.
            "--objdir-as-tempdir",
            *nvcc_random_seed(),
            *(f"-Xcompiler={flag}" for flag in (*sysroot_cflags, *prefix_maps)),
        ]
        make = cpp_extension.CUDAExtension
    else:
        make = cpp_extension.CppExtension
    ext = make(
        OPS_LIBRARY_MODULE,
        sources,
        include_dirs=[str(csrc)],
        extra_compile_args=compile_args,
        extra_link_args=[
            "-Wl,--strip-debug",
            f"-Wl,--version-script={csrc / 'exports.map'}",
            *sysroot_ldflags,
        ],
    )
    if kind == variant_rule.STABLE:
        ext.libraries = STABLE_LIBRARIES["cuda" if with_cuda else "cpu"]
    else:
        ext.libraries = [lib for lib in ext.libraries if lib not in UNLINKED_PINNED_LIBRARIES]
    return ext


def python_module() -> Extension:
    sysroot_cflags, sysroot_ldflags = sysroot_flags()
    return Extension(
        "hotloop._C",
        ["csrc/python_module.cpp"],
        extra_compile_args={
            "cxx": ["-O3", "-g0", *sysroot_cflags, *prefix_map_flags(sysroot_cflags)]
        },
        extra_link_args=["-Wl,--strip-debug", *sysroot_ldflags],
        py_limited_api=True,
        define_macros=[("Py_LIMITED_API", PY_LIMITED_API)],
        language="c++",
    )


def main() -> None:
    with_cuda = want_cuda()
    kind = abi_kind()
    variant = variant_rule.variant_for(
        torch.__version__, torch.version.cuda if with_cuda else None, kind
    )
    archs = compiled_archs() if with_cuda else []
    write_build_info(variant, with_cuda, archs)
    setup(
        version=variant.version,
        # stable: every torch from the floor on; pinned: this torch minor's C++ ABI only.
        install_requires=[variant.requires_torch],
        ext_modules=[ops_library(kind, with_cuda), python_module()],
        cmdclass={"build_ext": BuildHotloopExtensions},
        options={"bdist_wheel": {"py_limited_api": "cp39"}},
    )


if __name__ == "__main__":
    main()
