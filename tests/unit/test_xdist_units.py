"""make test's two pytest workers: every integration module that starts
kubelet nodes or network namespaces is in the one unit run in order
(tests/conftest.py), so no two such sandboxes run at once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parents[1]
# How a module starts them: a sandbox with kubelet nodes (directly or through
# containersandbox.started), the fabric's or a node's namespaces, or VM nodes
# (`kmm sandbox up --vm-nodes`: kubelets in guests on the fabric, directly
# or through the session's vm_sandbox fixture).
STARTS = re.compile(
    r"kubelet_nodes=|containersandbox\.started\(|fabric\.create\("
    r"|namespaces\.start_holder\(|\"--vm-nodes\"|\bvm_sandbox\b"
)


def _listed() -> set[str]:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "KUBELET_NODE_MODULES" for t in targets):
                assert node.value is not None
                return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}  # fmt: skip
    raise AssertionError("tests/conftest.py has no KUBELET_NODE_MODULES")


def test_every_module_that_starts_kubelet_nodes_runs_in_the_ordered_unit() -> None:
    starting = {
        path.stem
        for path in (TESTS / "integration").glob("test_*.py")
        if STARTS.search(path.read_text())
    }
    assert starting  # the pattern still finds them
    assert starting == _listed()


def test_every_test_module_has_a_basename_of_its_own() -> None:
    # pytest imports test modules by basename (rootdir-relative "prepend"
    # mode, no __init__.py): a unit and an integration module of one name
    # stop `make test` at collection ("import file mismatch"), which running
    # tests/unit alone never shows.
    seen: dict[str, Path] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a basename"
        seen[path.name] = path
