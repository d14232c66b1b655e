"""Python's AOTInductor loader in a process of its own, for test_aoti.py.

  load_package.py run PACKAGE INPUTS OUT
      imports hotloop, loads PACKAGE with torch._inductor.aoti_load_package, calls it on the
      tensors torch.load(INPUTS) under no_grad, and saves [outputs, inputs after the call]
      (the package may update its inputs in place) to OUT.
  load_package.py control FOLDER
      the same loader on a package of x * 2 + 1 compiled here, in a process that never imports
      hotloop: whether this torch's loader works at all on this host.

A loader that crashes takes only this process down, so the test can tell a crash in hotloop's
package from one of the loader itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def run(package: str, inputs_path: str, out: str) -> None:
    import hotloop  # noqa: F401  (registers the ops the package calls)

    inputs = torch.load(inputs_path)
    with torch.no_grad():
        outputs = torch._inductor.aoti_load_package(package)(*inputs)
    torch.save([outputs, inputs], out)


class _Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def control(folder: str) -> None:
    x = torch.randn(4, 8)
    program = torch.export.export(_Affine(), (x,))
    package = torch._inductor.aoti_compile_and_package(
        program, package_path=str(Path(folder) / "control.pt2")
    )
    with torch.no_grad():
        got = torch._inductor.aoti_load_package(package)(x)
    torch.testing.assert_close(got, x * 2 + 1)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"run": run, "control": control}[command](*args)
