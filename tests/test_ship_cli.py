"""What an installed copy does where its user is: generators write under the current folder
(never into the package), ``generate k8s --out`` gives a new folder the shipped kit, a command
whose extra is missing stops with one line before it starts, and ``--version`` names the
build."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferwatch import clikit
from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from support.shared import REPO

pytestmark = pytest.mark.unit

KIT = REPO / "deploy" / "kubernetes"


def _tree(folder: Path, *, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, less the subfolders named in ``skip``."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).parts[0] not in skip
    }


@pytest.mark.usefixtures("no_external_checkers")
@pytest.mark.parametrize(
    ("command", "default", "committed"),
    [
        ("alerts", "generated/alerts", REPO / "alerts" / "generated"),
        ("dashboards", "generated/dashboards", REPO / "dashboards" / "generated"),
    ],
)
def test_a_generator_without_out_writes_under_the_current_folder(
    command: str,
    default: str,
    committed: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the checkout keeps `generate slo`'s specs in alerts/generated/slo, another command's
    before = _tree(committed, skip=("slo",))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["generate", command])
    assert result.exit_code == 0, result.output
    assert _tree(tmp_path / default) == before  # the same files, written here
    assert _tree(committed, skip=("slo",)) == before
    help_text = " ".join(CliRunner().invoke(main, ["generate", command, "--help"]).output.split())
    assert f"{default}/ in the current directory" in help_text


@pytest.mark.usefixtures("no_external_checkers")
def test_generate_k8s_out_gives_a_new_folder_the_shipped_kit(tmp_path: Path) -> None:
    out = tmp_path / "kit"
    result = CliRunner().invoke(main, ["generate", "k8s", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _tree(out) == _tree(KIT)
    again = CliRunner().invoke(main, ["generate", "k8s", "--out", str(out), "--check"])
    assert again.exit_code == 0, again.output


@pytest.mark.usefixtures("no_external_checkers")
def test_generate_k8s_keeps_a_users_site_files_and_renders_them(tmp_path: Path) -> None:
    out = tmp_path / "kit"
    (out / "sites").mkdir(parents=True)
    mine = (KIT / "sites" / "single-cluster.yaml").read_text(encoding="utf-8")
    (out / "sites" / "mine.yaml").write_text(mine, encoding="utf-8")
    result = CliRunner().invoke(main, ["generate", "k8s", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "sites" / "mine.yaml").read_text(encoding="utf-8") == mine
    assert (out / "overlays" / "mine" / "kustomization.yaml").is_file()


def test_generate_k8s_check_of_a_folder_without_a_kit_fails(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["generate", "k8s", "--out", str(tmp_path), "--check"])
    assert result.exit_code == ExitCode.FAILED
    assert "no kit to check" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "matplotlib" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.usefixtures("without_matplotlib")
@pytest.mark.parametrize("args", [["--dashboard", "fleet"], ["--help"], []])
def test_a_command_whose_extra_is_missing_fails_with_one_line(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["snapshot", *args])
    assert result.exit_code == ExitCode.CANNOT_RUN
    assert result.output.splitlines() == [
        "Error: inferwatch snapshot needs inferwatch[snapshot], which is not installed: "
        "pip install 'inferwatch[snapshot]'"
    ]


def test_the_install_page_shows_the_error_a_core_install_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its sample names the extras the command really needs (it once left one out)."""
    page = " ".join((REPO / "docs" / "install.md").read_text(encoding="utf-8").split())
    sample = re.search(r"`(Error: inferwatch (\S+) needs [^`]+)`", page)
    assert sample, "no sample error in docs/install.md"
    extras = {module for modules in clikit.EXTRAS.values() for module in modules}
    real = importlib.util.find_spec

    def core_install(name: str, package: str | None = None) -> object:
        return None if name in extras else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", core_install)
    result = CliRunner().invoke(main, [sample[2]])
    assert result.exit_code == ExitCode.CANNOT_RUN
    assert result.output.splitlines() == [sample[1]]


@pytest.mark.usefixtures("without_matplotlib")
def test_the_help_lists_a_command_whose_extra_is_missing() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    assert "Needs inferwatch[snapshot], which is" in result.output
    assert clikit.missing_extras("snapshot") == ["snapshot"]
    assert clikit.missing_extras("sidecar") == []


def test_every_extra_a_command_needs_is_declared() -> None:
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert set(clikit.EXTRAS) <= set(declared)
    assert {e for extras in clikit.COMMAND_EXTRAS.values() for e in extras} <= set(clikit.EXTRAS)
    assert set(clikit.EXTRAS) <= set(declared["all"][0].partition("[")[2].rstrip("]").split(","))


def test_version_names_the_build() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("inferwatch ")
    assert "(commit " in result.output
