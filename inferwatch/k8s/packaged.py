"""The Kubernetes kit as the package ships it (``deploy/kubernetes``, package data
``inferwatch.k8s.deploy``), copied into a folder so that ``generate k8s --out DIR`` works
from an installed wheel as it does in a checkout."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

#: a folder that holds this file holds a kit (seeded earlier, or a checkout's)
KIT_MARKER = Path("base", "kustomization.yaml")
#: the kit's Helm post-renderer scripts, which ship beside the manifests
HELM = Path("helm")


def shipped() -> Traversable:
    """The shipped kit. An editable install of a checkout cannot import a data-only folder
    mapped below a package (setuptools' editable finder wants an ``__init__.py``), so there
    it is the checkout's own ``deploy/kubernetes``."""
    try:
        return resources.files("inferwatch.k8s.deploy")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _shipped_file(relative: Path) -> bool:
    """A manifest, or a script of the kit's Helm folder (a checkout's stray files stay)."""
    return relative.suffix == ".yaml" or relative.parts[:1] == HELM.parts


def is_kit(folder: Path) -> bool:
    return (folder / KIT_MARKER).is_file()


def seed(folder: Path) -> list[str]:
    """Copy the shipped kit's files that ``folder`` lacks into it (a user's own site files
    and edits stay); the relative paths copied."""
    copied: list[str] = []

    def walk(node: Traversable, relative: Path) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, relative / child.name)
                continue
            target = folder / relative / child.name
            if _shipped_file(relative / child.name) and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(child.read_bytes())
                if relative.parts[:1] == HELM.parts:
                    target.chmod(0o755)  # a Helm post-renderer is run as a program
                copied.append(str(relative / child.name))

    walk(shipped(), Path())
    return copied
