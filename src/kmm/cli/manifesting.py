"""``kmm manifests``: print kmm's install manifests, or its examples, as one YAML stream.

The files under ``deploy/`` are the committed copy of the same rendering; an
installed kmm has no ``deploy/`` directory, so this renders rather than reads.
By default it prints what installs kmm and nothing else: the stream goes
straight into ``kubectl apply -f -``, and the examples (demo Modules, a Pod,
a ResourceClaimTemplate) have no place in a user's cluster unless asked for.
"""

from __future__ import annotations

from typing import Annotated

import typer

from kmm.api import manifests as rendered

__all__ = ["manifests", "register"]


def manifests(
    examples: Annotated[
        bool,
        typer.Option(
            "--examples",
            help="Print the example Modules and the DRA example's workload instead of the "
            "install; apply them once the operator runs (they need its CRDs).",
        ),
    ] = False,
) -> None:
    """Print kmm's install manifests: namespace, CRDs, admission policy, RBAC, operator.

    For `kmm manifests | kubectl apply -f -`. The examples are not included
    unless asked for with --examples.
    """
    typer.echo(rendered.dump(rendered.documents(examples=examples)), nl=False)


def register(app: typer.Typer) -> None:
    app.command("manifests")(manifests)
