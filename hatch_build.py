"""Builds the shared-memory sampler (src/pgscope/collect/sampling/native/shmem_sampler.c) when a wheel is
built, so the wheel ships it and pgscope never compiles anything at run time (a program built
on first use into the user's cache folder was run as root from wherever that folder said).

A wheel gets the binary at pgscope/collect/sampling/native/bin/, and is tagged for this platform
(py3-none-linux_x86_64, say). An
editable install (`uv sync`) builds it into the source tree's same folder, which is where the
package looks (scripts/setup.sh does the same, for a tree it sets up). A wheel is not built
without it; an editable install without a C compiler goes on, and the memory sampler then
says it is not built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "src/pgscope/collect/sampling/native/shmem_sampler.c"
BINARY = "pgscope/collect/sampling/native/bin/pgscope-shmem-sampler"


def compile_sampler(source: Path, target: Path) -> None:
    """`cc -O2` of `source` into `target` (0755), through a temporary name in its folder."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(f"no C compiler (cc, gcc or $CC) to build {source}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    subprocess.run([compiler, "-O2", "-o", str(partial), str(source)], check=True)
    partial.chmod(0o755)
    partial.replace(target)


class SamplerBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return  # the sdist carries the source only
        source = Path(self.root, SOURCE)
        if version == "editable":
            try:
                compile_sampler(source, Path(self.root, "src", BINARY))
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"pgscope: the memory sampler is not built: {exc}", file=sys.stderr)
            return
        self._scratch = tempfile.mkdtemp(prefix="pgscope-sampler-")
        built = Path(self._scratch, "pgscope-shmem-sampler")
        compile_sampler(source, built)
        build_data["force_include"][str(built)] = BINARY
        # A program, not an extension module: any Python 3, this platform.
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
