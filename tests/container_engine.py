"""What the container tests need — podman, podman-compose, a local base image, a wheelhouse — or why they skip.

CI prepares all four with ``.ci/container-setup.sh`` (the base image and the wheelhouse are cached in
``/var/cache/fedsbdt-ci``).  Nothing here pulls an image or reaches a package index: the image is built
with ``--network none`` from ``BASE_IMAGE`` and the wheels in ``WHEELHOUSE``, the way docs/deployment.md
tells a hospital without internet access to build it.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("FEDSBDT_CI_CACHE", "/var/cache/fedsbdt-ci"))
BASE_IMAGE = os.environ.get("FEDSBDT_BASE_IMAGE", "localhost/fedsbdt-base:bookworm")
WHEELHOUSE = Path(os.environ.get("FEDSBDT_WHEELHOUSE", str(CACHE / "wheels")))
SETUP = ".ci/container-setup.sh"
# Not copied into a build context (the entries of .dockerignore, and wheels, which are linked in).
_NOT_CONTEXT = shutil.ignore_patterns(".git", "deploy", ".numba-cache", ".pytest_cache", ".hypothesis",
                                      "__pycache__", "*.egg-info", "*.whl", "build", "dist")


@functools.cache
def unavailable() -> str | None:
    """Why the container tests cannot run on this machine (one line), or None when they can."""
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            return f"no container engine: {tool} is not installed (CI installs it with {SETUP})"
    p = subprocess.run(["podman", "image", "exists", BASE_IMAGE], capture_output=True, text=True, timeout=120)
    if p.returncode == 1:
        return f"no local base image {BASE_IMAGE} (CI makes it with {SETUP}; or set FEDSBDT_BASE_IMAGE)"
    if p.returncode != 0:
        return f"podman does not work here: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    p = subprocess.run(["podman", "run", "--rm", "--network", "none", BASE_IMAGE, "true"], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        return f"podman cannot start a container here: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    if not any(WHEELHOUSE.glob("*.whl")):
        return f"no wheelhouse in {WHEELHOUSE} (CI makes it with {SETUP}; or set FEDSBDT_WHEELHOUSE)"
    return None


def copy_repository(dest: Path) -> Path:
    """A copy of this checkout (without .git, caches and deploy/): a build context like a hospital's."""
    shutil.copytree(ROOT, dest, ignore=_NOT_CONTEXT, symlinks=True)
    return dest


def link_wheels(context: Path) -> None:
    """Put the wheelhouse into the context's ``wheels/`` (hard links where possible: it is ~250 MB)."""
    for whl in WHEELHOUSE.glob("*.whl"):
        try:
            os.link(whl, context / "wheels" / whl.name)
        except OSError:
            shutil.copyfile(whl, context / "wheels" / whl.name)


def offline_pip_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with pip pointed at the wheelhouse only (what a connected machine's index would serve)."""
    return dict(env, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELHOUSE), PIP_DISABLE_PIP_VERSION_CHECK="1")
