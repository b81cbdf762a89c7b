"""``kmm manifests``: print every manifest in ``deploy/`` as one YAML stream.

The files under ``deploy/`` are the committed copy of the same rendering; an
installed kmm has no ``deploy/`` directory, so this renders rather than reads.
"""

from __future__ import annotations

import typer

from kmm.api import manifests as rendered

__all__ = ["manifests", "register"]


def manifests() -> None:
    """Print every manifest in deploy/: namespace, CRD, admission policy, RBAC, operator, examples."""
    typer.echo(rendered.dump(rendered.documents()), nl=False)


def register(app: typer.Typer) -> None:
    app.command("manifests")(manifests)
