"""The manual (docs/, mkdocs.yml) and the README that points to it.

- The API reference pages are the committed rendering of the CRDs' schemas
  (``scripts/render_docs.py``, ``make reference``), as deploy/ is of kmm.api.
- The troubleshooting page explains every reason kmm can show: condition
  reasons, Event reasons, image states and preflight verdicts, found in the
  source by reading it (``reasons_in``), so one added later without a word
  in the manual fails here.
- ``mkdocs build --strict`` fails on a broken link or anchor (and is run).
- The README opens with the two commands, and its links reach the manual.
"""

from __future__ import annotations

import ast
import html
import pathlib
import re
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterator

import pytest

from kmm.api import crd, modules

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCE = ROOT / "src" / "kmm"

# -- the reference pages ------------------------------------------------------


def test_the_reference_pages_are_the_rendering_of_the_schemas(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    rendered = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.md"))
    assert rendered == [pathlib.Path("reference/module.md"), pathlib.Path("reference/preflightvalidation.md")]  # fmt: skip
    for relative in rendered:
        assert (DOCS / relative).read_text() == (tmp_path / relative).read_text(), (
            f"docs/{relative} is stale: run make reference"
        )


def _plain(markdown: str) -> str:
    """The page's text as a reader sees it: escapes and entities undone."""
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def _objects(schema: dict[str, typing.Any], path: str = "") -> Iterator[tuple[str, dict[str, typing.Any]]]:  # fmt: skip
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from _objects(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from _objects(schema["items"], f"{path}[]")


@pytest.mark.parametrize(
    ("page", "definition"),
    [("module.md", crd.render()), ("preflightvalidation.md", crd.render_preflight())],
)
def test_the_reference_names_every_field_and_every_rule(
    page: str, definition: dict[str, typing.Any]
) -> None:
    text = _plain((DOCS / "reference" / page).read_text())
    root = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, schema in _objects(root):
        for name in schema.get("properties") or {}:
            assert f"| `{name}` |" in text, f"{path}.{name} has no row"
        if schema.get("properties") and path:
            assert f"## `{path}`" in text, f"{path} has no section"
        for rule in schema.get("x-kubernetes-validations", ()):
            assert rule["message"] in text, f"{path}: {rule['message']!r} is not shown"


# -- every reason, explained ---------------------------------------------------

# CamelCase words: condition and Event reasons, as metav1.Condition wants them.
_REASON = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
_EVENT_TYPES = frozenset({"Normal", "Warning"})
# Where kmm's own reasons are made: the API (condition and preflight reason
# constants), the operator, the DRA driver and the kubelet emulator's Events.
_PACKAGES = ("api", "operator", "driver", "kubelet")


def _strings(node: ast.expr | None) -> Iterator[str]:
    """String constants an expression can take: a literal, or either branch of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def reasons_in(tree: ast.AST) -> set[str]:
    """The reasons a module's source can show a user:

    - the value of any ``REASON_*`` constant (conditions, preflight verdicts);
    - CamelCase strings given to an Event or a status problem: arguments of
      a call whose name ends in ``event``/``Event`` (``Event(...)``,
      ``self._event(...)``, ``events.node_event(...)``), ``Problem(...)`` or
      ``_warn_node(...)``, or any ``reason=`` keyword;
    - CamelCase strings assigned to a variable named ``reason`` or ``*_reason``.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Name):
                    continue
                if target.id.startswith("REASON_"):
                    found.update(_strings(node.value))
                elif target.id == "reason" or target.id.endswith("_reason"):
                    found.update(s for s in _strings(node.value) if _REASON.match(s))
        elif isinstance(node, ast.Call):
            name = _callee(node)
            if name.lower().endswith("event") or name in {"Problem", "_warn_node"}:
                for argument in node.args:
                    found.update(
                        s for s in _strings(argument) if _REASON.match(s) and s not in _EVENT_TYPES
                    )
            for keyword in node.keywords:
                if keyword.arg == "reason":
                    found.update(_strings(keyword.value))
    return found


def _source_reasons() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for package in _PACKAGES:
        for path in sorted((SOURCE / package).rglob("*.py")):
            for reason in reasons_in(ast.parse(path.read_text())):
                where.setdefault(reason, []).append(str(path.relative_to(SOURCE)))
    # The image states a Module's status.images shows, from the API's own type.
    for state in typing.get_args(modules.ImageState):
        where.setdefault(state, []).append("api/modules.py (ImageState)")
    return where


def test_the_reading_finds_a_reason_added_in_any_of_its_forms() -> None:
    source = """
REASON_NEW_CONDITION = "NewCondition"
self._event(raw, "Warning", "NewWarning", message)
Event("Normal", "NewNormal" if ok else "NewOther", what)
events.node_event(node, reason="NewNodeEvent", message=m, now=n, instance=i)
status.Problem("NewProblem", message)
failed_reason = "NewFailure" if build else "NewSignFailure"
self._warn_node("NewDriverWarning", message)
log.info("NotAReason %s", x)
"""
    assert reasons_in(ast.parse(source)) == {
        "NewCondition",
        "NewWarning",
        "NewNormal",
        "NewOther",
        "NewNodeEvent",
        "NewProblem",
        "NewFailure",
        "NewSignFailure",
        "NewDriverWarning",
    }


def test_the_reading_of_the_source_finds_the_known_reasons() -> None:
    """So the coverage test below cannot pass by finding nothing."""
    found = _source_reasons()
    assert {
        "ReconcileFailed",  # a condition (api/conditions.py) and an Event
        "BuildFailed",  # the build planner's constant and Event
        "DaemonSetCreated",  # a literal in the reconciler's Event
        "ModuleLoaded",  # a conditional Node Event
        "RestartRequired",  # the DRA driver's Node Event
        "FailedPrepareDynamicResources",  # the emulator's pod Event
        "mapping not found",  # a preflight verdict
        "Checking",  # an image state
    } <= set(found)


def test_the_troubleshooting_page_explains_every_reason() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    missing = {
        reason: places for reason, places in _source_reasons().items() if f"`{reason}`" not in page
    }
    assert not missing, (
        "docs/troubleshooting.md does not explain (as a `code` span, with what it "
        f"means and what to do): {missing}"
    )


# -- the build -----------------------------------------------------------------


def _build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        cwd=config.parent,
    )


def test_the_manual_builds_strictly(tmp_path: pathlib.Path) -> None:
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "troubleshooting.html").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path: pathlib.Path) -> None:
    """Strict mode counts warnings: a link to a missing anchor must be one."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[broken](install.md#no-such-section)\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-section" in built.stderr


# -- the README ----------------------------------------------------------------


def test_the_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readmes_links_reach_the_manual() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert "docs/index.md" in targets
    for target in targets:
        assert (ROOT / target).is_file(), target
