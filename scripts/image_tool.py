"""Build the sidecar image with podman, without a container registry and without network
inside the build.

    python scripts/image_tool.py wheels   # dist/image-wheels: rsub and its pinned runtime deps
    python scripts/image_tool.py base     # a Debian bookworm rootfs (mmdebstrap) as a podman image
    python scripts/image_tool.py build    # wheels, base (unless present), podman build
    python scripts/image_tool.py name     # the image's name: localhost/rsub-sidecar:<version>

`wheels` builds the rsub wheel from the product's files only, then the wheels of its runtime
dependencies at the versions of `constraints.txt` (pip, on this machine), and refuses any
that constraints.txt does not pin: the Dockerfile installs them with `--no-index`, so the
image holds exactly those versions. `base` makes the Python base image that
`--build-arg PYTHON_IMAGE` names, from Debian's packages (mmdebstrap), for machines that
reach no container registry; `base --force` makes it again. `build` prints how long each
step took and the image's size.

podman runs with the project's `containers.conf` (CONTAINERS_CONF); `podman()` is the one
way this project runs it, for the image tests too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = ROOT / "containers.conf"
WHEELS = ROOT / "dist" / "image-wheels"
CONSTRAINTS = ROOT / "constraints.txt"
# What the rsub wheel is built from: the product, nothing of the harness.
PRODUCT_FILES = ("pyproject.toml", "README.md", "LICENSE", "sidecar", "spark_jobs")
_WHEEL_EPOCH = 315532800  # 1980-01-01, the earliest time a zip file can hold
BASE_IMAGE = "localhost/rsub-python-base:bookworm"
DEBIAN_SUITE = "bookworm"
# python-is-python3: the Dockerfile calls `python`, as in the official Python images;
# ca-certificates: as those images have it, for NATS servers with publicly signed certificates.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# Documentation and translations are not installed; the copyright files are kept.
_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
_BASE_CONFIG = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)


class ImageError(Exception):
    """A step of the image build failed; the message says which and why."""


def image_name() -> str:
    """`localhost/rsub-sidecar:<the project's version>`."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"localhost/rsub-sidecar:{version}"


def podman_command(*args: str) -> list[str]:
    """The command line of `podman ARGS` with the project's containers.conf."""
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed (make image installs it with apt-get)")
    return ["env", f"CONTAINERS_CONF={CONTAINERS_CONF}", "podman", *args]


def podman(
    *args: str, capture: bool = True, check: bool = True, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` with the project's containers.conf; output captured unless `capture` is
    False; ImageError with podman's own words when it fails and `check`."""
    result = subprocess.run(
        podman_command(*args),
        capture_output=capture,
        text=True,
        check=False,
        timeout=timeout_s,
    )
    if check and result.returncode != 0:
        said = (result.stderr or "").strip() if capture else "(see above)"
        raise ImageError(f"podman {args[0]} failed ({result.returncode}): {said}")
    return result


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """constraints.txt as {normalized name: version}."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[normalize(name)] = version.strip()
    return found


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(dist: str = "rsub") -> set[str]:
    """The distributions `dist` needs at run time, transitively and without its extras, as
    this environment's metadata declares them (normalized names)."""
    needed: set[str] = set()
    todo = [dist]
    while todo:
        for line in importlib.metadata.requires(todo.pop()) or ():
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = normalize(requirement.name)
            if name not in needed:
                needed.add(name)
                todo.append(name)
    return needed


def wheel_pin(path: Path) -> tuple[str, str]:
    """(normalized name, version) of a wheel file."""
    name, version = path.name.split("-")[:2]
    return normalize(name), version


def build_wheels(out: Path = WHEELS, constraints: Path = CONSTRAINTS) -> list[Path]:
    """The rsub wheel and the wheels of its runtime dependencies, as `constraints` pins
    them, in `out` (emptied first). ImageError naming any dependency without its pin."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix="rsub-wheel-") as tmp:
        src = Path(tmp)
        for name in PRODUCT_FILES:
            if (ROOT / name).is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
                shutil.copytree(ROOT / name, src / name, ignore=ignore)
            else:
                shutil.copy2(ROOT / name, src / name)
        # Byte for byte the same wheel from the same files (its zip's timestamps).
        reproducible = {**os.environ, "SOURCE_DATE_EPOCH": str(_WHEEL_EPOCH)}
        _run(
            [*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(src)],
            env=reproducible,
        )
    [rsub] = out.glob("rsub-*.whl")
    _run([*pip, "wheel", "--quiet", "--wheel-dir", str(out), "-c", str(constraints), str(rsub)])
    wheels = sorted(out.glob("*.whl"))
    pinned = pins(constraints)
    unpinned = [
        f"{name}=={version}"
        for name, version in map(wheel_pin, wheels)
        if name != "rsub" and pinned.get(name) != version
    ]
    if unpinned:
        raise ImageError(
            f"not as {constraints.name} pins them: {', '.join(unpinned)} (run `make lock`)"
        )
    return wheels


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(argv[:4])} ... failed:\n{result.stdout}{result.stderr}")


def make_base(name: str = BASE_IMAGE) -> None:
    """A Debian rootfs with Python (mmdebstrap, from Debian's mirror), imported as `name`."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed (make image installs it with apt-get)")
    with tempfile.TemporaryDirectory(prefix="rsub-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        argv = [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            *(f"--dpkgopt={option}" for option in _DPKG_OPTIONS),
            DEBIAN_SUITE,
            str(rootfs),
        ]
        _run(argv)
        changes = [arg for change in _BASE_CONFIG for arg in ("--change", change)]
        podman("import", *changes, str(rootfs), name)


def python_version(image: str) -> str:
    """`major.minor` of the `python` in `image`."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    return podman("run", "--rm", "--network", "none", image, "python", "-c", code).stdout.strip()


def build_image(base: str, name: str) -> None:
    """`podman build` of the Dockerfile from `base`, with no network: everything it installs
    comes from dist/image-wheels."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    there = python_version(base)
    if there != here:
        raise ImageError(
            f"{base} has Python {there} but the wheels are built with Python {here}: "
            f"make the venv with Python {there} (make clean venv PYTHON=python{there})"
        )
    podman(
        "build",
        "--format=docker",  # OCI images drop HEALTHCHECK
        "--network=none",
        "--pull=never",
        f"--build-arg=PYTHON_IMAGE={base}",
        f"--tag={name}",
        f"--file={ROOT / 'Dockerfile'}",
        str(ROOT),
        capture=False,
    )


def image_size_mb(name: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout) / 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("name", help="print the image's name")
    sub.add_parser("wheels", help="build the wheels the image installs")
    base = sub.add_parser("base", help="make the Python base image with mmdebstrap")
    base.add_argument("--force", action="store_true", help="make it again when present")
    build = sub.add_parser("build", help="wheels, base (unless present) and podman build")
    build.add_argument("--base", default=BASE_IMAGE, help=f"PYTHON_IMAGE (default {BASE_IMAGE})")
    build.add_argument("--tag", default=image_name(), help="the image's name")
    args = parser.parse_args(argv)
    try:
        if args.command == "name":
            print(image_name())
        elif args.command == "wheels":
            _timed("wheels", build_wheels)
        elif args.command == "base":
            if args.force or not image_exists(BASE_IMAGE):
                _timed(f"base {BASE_IMAGE}", make_base)
            else:
                print(f"base {BASE_IMAGE}: present (--force to make it again)")
        else:
            started = time.monotonic()
            _timed("wheels", build_wheels)
            if args.base == BASE_IMAGE and not image_exists(BASE_IMAGE):
                _timed(f"base {BASE_IMAGE}", make_base)
            _timed(f"podman build {args.tag}", lambda: build_image(args.base, args.tag))
            print(
                f"image {args.tag}: {image_size_mb(args.tag):.0f} MB, "
                f"{time.monotonic() - started:.1f} s in all"
            )
    except ImageError as exc:
        print(f"image_tool: {exc}", file=sys.stderr)
        return 1
    return 0


def _timed(what: str, step: Callable[[], object]) -> None:
    started = time.monotonic()
    step()
    print(f"{what}: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
